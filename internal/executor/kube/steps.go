package kube

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	corev1 "k8s.io/api/core/v1"

	"github.com/fleet-dev/fleet/internal/telemetry"
)

// The spans of a Kubernetes attempt, in order, each named for what ends it:
//
//	fleet.job.create        the Secret and the Job are created
//	fleet.run               the wait for the attempt's end, made of:
//	  fleet.kube.scheduled  the pod is bound to a node
//	  fleet.kube.running    its container runs (the image pulled, the container made)
//	  fleet.kube.terminated the executor sees the container's end (the pod's
//	                        terminated state, or the Job's condition)
//	fleet.kube.logs         the rest of the log is read
//	fleet.outputs.collect   the outputs are read from the shared volume
//	fleet.kube.cleanup      the Job, its pod and its Secret are deleted, after
//	                        the result (Cleanup)
//
// The worker adds fleet.result, the result's publication, between the last
// two. The stages come from the informers' notifications, so they end when
// the executor learns of each change, as the rest of the attempt does.

// stage is how far an attempt's pod has come.
type stage int

const (
	stageNone stage = iota
	stageScheduled
	stageRunning
	stageTerminated
)

var stageSpans = map[stage]string{
	stageScheduled:  "fleet.kube.scheduled",
	stageRunning:    "fleet.kube.running",
	stageTerminated: "fleet.kube.terminated",
}

// steps traces the stages of one attempt as spans under its run.
type steps struct {
	ctx  context.Context
	at   stage // the stage waited for
	span trace.Span
}

func newSteps(ctx context.Context) *steps { return &steps{ctx: ctx} }

// reached moves on to what the pod waits for next: a pod not bound yet
// waits to be scheduled, a bound one for its container to run, a running
// one for its end. It never moves back (a pod gone from the cache).
func (s *steps) reached(pod *corev1.Pod, p progress) {
	next := stageScheduled
	switch {
	case p.started:
		next = stageTerminated
	case pod != nil && pod.Spec.NodeName != "":
		next = stageRunning
	}
	for s.at < next {
		s.endSpan()
		s.at++
		_, s.span = telemetry.Tracer().Start(s.ctx, stageSpans[s.at])
	}
}

// ended ends the stage the attempt was in when v ended it, with what the
// pod said of its container. Stages the executor never saw the pod in
// (it ran between two looks) are spans of no length.
func (s *steps) ended(v *verdict, pod *corev1.Pod) {
	s.reached(pod, observe(pod))
	if s.span == nil {
		return
	}
	attrs := []attribute.KeyValue{attribute.String("fleet.status", string(v.status)),
		attribute.String("k8s.reason", v.reason)}
	if v.exitCode != nil {
		attrs = append(attrs, attribute.Int("fleet.exit_code", *v.exitCode))
	}
	if pod != nil {
		if t := terminated(pod); t != nil {
			// Whole seconds, as the API keeps it.
			attrs = append(attrs, attribute.String("k8s.container.finished_at", t.FinishedAt.UTC().Format(time.RFC3339)))
		}
	}
	s.span.SetAttributes(attrs...)
	if v.failure != nil {
		s.span.SetStatus(codes.Error, v.failure.Message)
	}
	s.endSpan()
}

func (s *steps) endSpan() {
	if s.span != nil {
		s.span.End()
		s.span = nil
	}
}
