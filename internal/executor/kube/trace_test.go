package kube

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/fleet-dev/fleet/internal/kubetest"
	"github.com/fleet-dev/fleet/job"
)

// timeline is what a test saw of one attempt, by time: the executor's
// spans, and the changes of the Job and its pod as a separate watch of
// the API server saw them.
type timeline struct {
	mu     sync.Mutex
	begin  time.Time
	events []mark
}

type mark struct {
	at   time.Time
	what string
}

func (tl *timeline) add(at time.Time, format string, args ...any) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.events = append(tl.events, mark{at, fmt.Sprintf(format, args...)})
}

func (tl *timeline) String() string {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	sort.SliceStable(tl.events, func(i, j int) bool { return tl.events[i].at.Before(tl.events[j].at) })
	var b strings.Builder
	for _, m := range tl.events {
		fmt.Fprintf(&b, "%+7d ms  %s\n", m.at.Sub(tl.begin).Milliseconds(), m.what)
	}
	return b.String()
}

// watchNamespace adds to tl every change of phase of the namespace's pods
// and of condition of its Jobs, as the API server streams them.
func watchNamespace(t *testing.T, env *kubetest.Env, ns string, tl *timeline) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	jw, err := env.Client.BatchV1().Jobs(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pw, err := env.Client.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		seen := map[string]bool{}
		for ev := range jw.ResultChan() {
			j, ok := ev.Object.(*batchv1.Job)
			if !ok {
				continue
			}
			if ev.Type == watch.Deleted {
				tl.add(time.Now(), "watch: Job deleted")
				continue
			}
			for _, c := range j.Status.Conditions {
				if key := string(c.Type) + "=" + string(c.Status); !seen[key] {
					seen[key] = true
					tl.add(time.Now(), "watch: Job condition %s", key)
				}
			}
		}
	}()
	go func() {
		last := ""
		for ev := range pw.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			state := string(p.Status.Phase)
			if p.Spec.NodeName != "" {
				state += " bound"
			}
			if p.DeletionTimestamp != nil {
				state += " deleting"
			}
			if ev.Type == watch.Deleted {
				state = "deleted"
			}
			if state != last {
				last = state
				tl.add(time.Now(), "watch: pod %s", state)
			}
		}
	}()
}

// recordSpans makes the global tracer provider record the spans ended
// during the test.
func recordSpans(t *testing.T) *tracetest.SpanRecorder {
	rec := tracetest.NewSpanRecorder()
	prev := otel.GetTracerProvider()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	otel.SetTracerProvider(tp)
	t.Cleanup(func() {
		otel.SetTracerProvider(prev)
		_ = tp.Shutdown(context.Background())
	})
	return rec
}

// TestKubeAttemptTrace follows one attempt of a job that logs and runs
// for a second, on the real control plane, and shows where its time goes:
// the executor's spans beside the Job's and pod's changes. Run returns
// once the pod has ended, with the whole log, before the Job's own
// condition; Cleanup then deletes the Job, its pod and its Secret.
func TestKubeAttemptTrace(t *testing.T) {
	spans := recordSpans(t)
	c := start(t, nil, nil)
	c.env.SetPodLogs(t, c.ns, "one", "two")
	// kwok picks the log up asynchronously.
	time.Sleep(time.Second)
	tl := &timeline{}
	watchNamespace(t, c.env, c.ns, tl)
	tl.begin = time.Now()
	req := request(func(r *job.Request) {
		r.Resources = &job.Resources{CPU: "1", Memory: "256Mi"}
		r.Env = map[string]string{"TOKEN": "s3cr3t"}
	})
	// The attempt's spans are one trace, as under the worker's span.
	ctx, attempt := otel.Tracer("test").Start(context.Background(), "attempt")
	out := c.mustRun(t, ctx, req)
	tl.add(time.Now(), "Run returned: %s", describe(out))
	time.Sleep(1500 * time.Millisecond) // the Job's own conditions, for the record
	if err := c.exec.Cleanup(ctx, task(req)); err != nil {
		t.Errorf("Cleanup: %v", err)
	}
	tl.add(time.Now(), "Cleanup returned")
	attempt.End()
	var names []string
	for _, s := range spans.Ended() {
		if s.SpanContext().TraceID() != attempt.SpanContext().TraceID() || s.Name() == "attempt" {
			continue
		}
		names = append(names, s.Name())
		tl.add(s.StartTime(), "span %s starts", s.Name())
		tl.add(s.EndTime(), "span %s ends (%d ms)", s.Name(), s.EndTime().Sub(s.StartTime()).Milliseconds())
	}
	waitGone(t, c)
	tl.add(time.Now(), "no Job, pod or Secret left")
	t.Logf("timeline of one attempt:\n%s", tl)
	equal(t, "outcome", describe(out), "succeeded exit 0")
	equal(t, "stdout", out.Stdout, "one\ntwo\n")
	sort.Strings(names)
	equal(t, "spans", strings.Join(names, " "),
		"fleet.job.create fleet.kube.cleanup fleet.kube.logs fleet.kube.running fleet.kube.scheduled fleet.kube.terminated fleet.run")
}

// waitGone waits until the namespace holds no Job, pod or Secret of the
// fleet.
func waitGone(t *testing.T, c *cluster) {
	t.Helper()
	sel := metav1.ListOptions{LabelSelector: LabelManagedBy + "=fleet"}
	deadline := time.Now().Add(30 * time.Second)
	for {
		jobs, pods := c.left(t)
		secrets, err := c.env.Client.CoreV1().Secrets(c.ns).List(context.Background(), sel)
		if err != nil {
			t.Fatal(err)
		}
		if jobs == 0 && pods == 0 && len(secrets.Items) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("left after Cleanup: %d Jobs, %d pods, %d Secrets", jobs, pods, len(secrets.Items))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
