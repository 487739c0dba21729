package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	batchlisters "k8s.io/client-go/listers/batch/v1"
	corelisters "k8s.io/client-go/listers/core/v1"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/telemetry"
	"github.com/fleet-dev/fleet/internal/workspace"
	"github.com/fleet-dev/fleet/job"
)

// stopSlack is how long, beyond the pods' grace period, stopping an attempt
// waits for its Job and pod to be gone.
const stopSlack = 30 * time.Second

// callTimeout bounds API calls made while cleaning up.
const callTimeout = 30 * time.Second

// Run runs one attempt as a Job and waits, on the informers'
// notifications, until it has ended and nothing of it runs: its pod has
// ended by itself, or the Job says how it ended. It returns then, without
// waiting for the Job's own condition when the pod decides; the Job stays
// until Cleanup (or Recover, or its TTL) deletes it.
func (e *Executor) Run(ctx context.Context, t *executor.Task) (*executor.Outcome, error) {
	req := t.Request.Clone()
	req.Normalize()
	if err := e.Validate(req); err != nil {
		return nil, job.Failf(job.ClassRejected, job.CodeInvalid, "kubernetes executor cannot run it: %v", err)
	}
	if t.WorkerID != e.cfg.WorkerID {
		return nil, fmt.Errorf("the executor of worker %q was given an attempt of worker %q", e.cfg.WorkerID, t.WorkerID)
	}
	if err := e.synced(ctx); err != nil {
		if ctx.Err() != nil {
			return executor.CancelledOutcome(ctx, time.Now()), nil
		}
		return nil, err
	}

	a := &attempt{e: e, t: t, req: req, name: jobName(t.JobID, t.Attempt), jobs: e.jobs, pods: e.pods,
		stdout: executor.NewOutput("stdout", t.Report, e.cfg.TailBytes)}
	a.log = e.log.With("job_id", t.JobID, "attempt", t.Attempt, "k8s_job", a.name)
	var unwatch func()
	a.w, unwatch = e.watch(a.name)
	defer unwatch()

	var dir *workspace.Dir
	subPath := ""
	handedOff := false
	if e.cfg.SharedPVC != "" {
		var err error
		dir, err = sharedWorkspace(ctx, t, req, filepath.Join(e.cfg.SharedDir, labelValue(t.WorkerID)))
		if err != nil {
			return nil, err
		}
		defer func() {
			if !handedOff {
				_ = dir.Remove()
			}
		}()
		rel, err := filepath.Rel(e.cfg.SharedDir, dir.Outputs)
		if err != nil {
			return nil, fmt.Errorf("outputs folder on the shared volume: %w", err)
		}
		subPath = filepath.ToSlash(rel)
	}
	dataPath := ""
	if req.Persists() {
		var err error
		if dataPath, err = e.dataDir(executor.TenantKey(t.Tenant), t.JobID); err != nil {
			return nil, err
		}
	}

	_, endCreate := telemetry.Step(ctx, "fleet.job.create")
	s := e.cfg.build(t, req, a.name, subPath, dataPath)
	if dir != nil && len(req.InputRefs) > 0 {
		if err := s.inputsOnSharedVolume(e.cfg.SharedPVC, e.cfg.SharedDir, dir); err != nil {
			return nil, err
		}
	}
	err := a.submit(ctx, s)
	endCreate(err)
	if err != nil {
		if ctx.Err() != nil {
			return executor.CancelledOutcome(ctx, time.Now()), nil
		}
		return nil, err
	}
	a.started = time.Now()
	a.phase("Pending", "Created", fmt.Sprintf("Job %s/%s", e.cfg.Namespace, a.name))
	out, err := a.toEnd(ctx, dir)
	handedOff = errors.Is(err, executor.ErrLeftRunning)
	return out, err
}

// toEnd waits for the attempt to end, reads the rest of its log and
// collects its outputs from dir (nil without a shared volume). It leaves
// the Job of an attempt that ended by itself in place, for Cleanup. On a
// hand-off it returns ErrLeftRunning, leaving the Job running.
func (a *attempt) toEnd(ctx context.Context, dir *workspace.Dir) (*executor.Outcome, error) {
	a.track()
	defer a.untrack()
	runCtx, endRun := telemetry.Step(ctx, "fleet.run")
	a.steps = newSteps(runCtx)
	v := a.wait(ctx)
	if v.handedOff {
		a.steps.endSpan()
		endRun(executor.ErrLeftRunning)
		if a.logs != nil {
			a.logs.cancel()
			<-a.logs.done
		}
		a.log.Info("leaving the Job running for adoption")
		return nil, executor.ErrLeftRunning
	}
	a.steps.ended(v, a.pod)
	endRun(nil)
	a.phase(v.phase, v.reason, v.message())
	_, endLogs := telemetry.Step(ctx, "fleet.kube.logs")
	a.readLogs(ctx, v)
	endLogs(nil)
	out := &executor.Outcome{Status: v.status, ExitCode: v.exitCode, Failure: v.failure,
		StartedAt: a.started, Stdout: a.stdout.Tail()}
	if dir != nil {
		_, endCollect := telemetry.Step(ctx, "fleet.outputs.collect")
		outputs, artifacts, fail := executor.CollectOutputs(ctx, a.t, dir, a.e.cfg.Outputs)
		if fail != nil {
			endCollect(fail)
		} else {
			endCollect(nil)
		}
		out.Outputs, out.Artifacts = outputs, artifacts
		if out.Status == job.StatusSucceeded && fail != nil {
			out.Status, out.Failure = job.StatusFailed, fail
		}
	}
	out.FinishedAt = time.Now()
	return out, nil
}

// attempt is one Run.
type attempt struct {
	e      *Executor
	t      *executor.Task
	req    *job.Request
	name   string // of the Job and its Secret
	log    *slog.Logger
	w      *watcher
	stdout *executor.Output
	// jobs and pods are the caches the attempt reads its Job and pods
	// from: the executor's, or an adoption's own.
	jobs batchlisters.JobNamespaceLister
	pods corelisters.PodNamespaceLister
	// started is when the attempt started: its Job was created.
	started time.Time
	// since, for an adopted attempt, is when it was adopted: its log is
	// followed from then.
	since *metav1.Time

	pod        *corev1.Pod // the newest pod seen, kept after it is deleted
	reported   string      // the last phase reported
	stuck      stuck
	stuckSince time.Time
	logs       *follower
	pos        logPos // how far the log was copied
	steps      *steps
}

// submit creates the Secret, then the Job, then makes the Job own the
// Secret so that Kubernetes deletes it with the Job. The Secret comes first
// so that the pod never waits for it.
func (a *attempt) submit(ctx context.Context, s *spec) error {
	ns := a.e.cfg.Namespace
	secrets := a.e.client.CoreV1().Secrets(ns)
	if s.secret != nil {
		if _, err := secrets.Create(ctx, s.secret, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create Secret %s/%s: %w", ns, a.name, err)
		}
	}
	j, err := a.e.client.BatchV1().Jobs(ns).Create(ctx, s.job, metav1.CreateOptions{})
	if err != nil {
		a.cleanup(ctx, s.secret != nil, false)
		return fmt.Errorf("create Job %s/%s: %w", ns, a.name, err)
	}
	a.log.Info("job submitted")
	if s.secret == nil {
		return nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"ownerReferences": []metav1.OwnerReference{*metav1.NewControllerRef(j, batchv1.SchemeGroupVersion.WithKind("Job"))},
	}})
	if err != nil {
		return fmt.Errorf("owner of Secret %s/%s: %w", ns, a.name, err)
	}
	if _, err := secrets.Patch(ctx, a.name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		a.cleanup(ctx, true, true)
		return fmt.Errorf("make Job %s/%s own its Secret: %w", ns, a.name, err)
	}
	return nil
}

// cleanup deletes what a failed submit left.
func (a *attempt) cleanup(ctx context.Context, secret, jobToo bool) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), callTimeout)
	defer cancel()
	ns := a.e.cfg.Namespace
	if jobToo {
		bg := metav1.DeletePropagationBackground
		if err := a.e.client.BatchV1().Jobs(ns).Delete(ctx, a.name, metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil && !apierrors.IsNotFound(err) {
			a.log.Error("could not delete the Job of a failed submit", "err", err)
		}
	}
	if secret {
		if err := a.e.client.CoreV1().Secrets(ns).Delete(ctx, a.name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			a.log.Error("could not delete the Secret of a failed submit", "err", err)
		}
	}
}

// wait waits until the attempt ends: its Job completes or fails, its pod
// stays stuck too long, it outlives its deadline, or ctx ends. It stops
// whatever still runs before it returns.
func (a *attempt) wait(ctx context.Context) *verdict {
	timeout := a.req.Timeout.Std()
	// Kubernetes enforces the timeout (activeDeadlineSeconds); this timer
	// only catches a Job that it failed to stop.
	overdue := time.NewTimer(max(time.Until(a.started.Add(timeout+a.e.cfg.DeadlineSlack)), time.Millisecond))
	defer overdue.Stop()
	for {
		v, recheck := a.check(ctx)
		if v != nil {
			if v.stop {
				a.stop(ctx, v)
			}
			return v
		}
		var wake <-chan time.Time
		if recheck > 0 {
			wake = time.After(recheck)
		}
		select {
		case <-a.w.changed:
		case <-wake:
		case <-overdue.C:
			v := &verdict{status: job.StatusTimedOut, phase: "Failed", reason: "DeadlineExceeded",
				failure: job.Failf(job.ClassTimeout, job.CodeJobOverdue, "ran longer than its timeout of %s, and Kubernetes had not stopped it %s later", timeout, a.e.cfg.DeadlineSlack)}
			a.stop(ctx, v)
			return v
		case <-ctx.Done():
			if executor.LeavingRunning(ctx) {
				return &verdict{handedOff: true}
			}
			v := &verdict{status: job.StatusCancelled, phase: "Failed", reason: "Cancelled",
				failure: job.Failf(job.ClassCancelled, job.CodeCancelled, "%v", context.Cause(ctx))}
			a.stop(ctx, v)
			return v
		}
	}
}

// check looks at the Job and its pod in the cache, reports a phase change,
// starts following the log once the container runs, and returns a verdict
// once the attempt has ended. Otherwise it may ask to be called again after
// recheck, when a stuck pod will have waited long enough.
func (a *attempt) check(ctx context.Context) (v *verdict, recheck time.Duration) {
	if pod := a.newestPod(); pod != nil {
		a.pod = pod
	}
	if a.w.jobGone.Load() {
		if v := podEnded(a.pod); v != nil {
			return v, 0 // it ended before its Job went (a peer's sweep)
		}
		// Someone else's doing; its pod may still be stopping.
		return &verdict{status: job.StatusFailed, phase: "Failed", reason: "Deleted", stop: true,
			failure: job.Failf(job.ClassInfrastructure, job.CodeJobDeleted, "Job %s/%s was deleted while it ran", a.e.cfg.Namespace, a.name)}, 0
	}
	j, err := a.jobs.Get(a.name)
	if err != nil {
		return podEnded(a.pod), 0 // the Job is not in the cache yet
	}
	timeout := a.req.Timeout.Std()
	v = judge(j, a.pod, timeout)
	if v != nil && v.failure != nil && v.failure.Code == job.CodePodFailed {
		// The Job says its pod failed, but the pod in the cache does not
		// say how yet: the two come through separate watches. Ask.
		if pod := a.freshPod(ctx); pod != nil {
			a.pod = pod
			v = judge(j, pod, timeout)
		}
	}
	if v != nil {
		return v, 0
	}

	p := observe(a.pod)
	a.steps.reached(a.pod, p)
	a.phase(p.phase, p.reason, p.message)
	if p.started {
		a.follow(a.pod.Name)
	}
	now := time.Now()
	if p.stuck != a.stuck {
		a.stuck, a.stuckSince = p.stuck, now
	}
	if p.stuck == notStuck {
		return nil, 0
	}
	bound := a.e.cfg.PendingWait
	if p.stuck == stuckImage {
		bound = a.e.cfg.ImagePullWait
	}
	waited := now.Sub(a.stuckSince)
	if p.hopeless || waited >= bound {
		v = stuckVerdict(p, waited)
		v.stop = true
		return v, 0
	}
	return nil, bound - waited
}

// stop deletes the Job in the foreground, which deletes its pod first, and
// waits until both are gone, so that nothing of the attempt outlives Run.
// It adds how that went to the verdict's failure.
func (a *attempt) stop(ctx context.Context, v *verdict) {
	how := a.delete(ctx)
	if v.failure != nil {
		v.failure.Message += "; " + how
	}
}

func (a *attempt) delete(ctx context.Context) string {
	wait := a.e.cfg.Grace + stopSlack
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), wait)
	defer cancel()
	fg := metav1.DeletePropagationForeground
	err := a.e.client.BatchV1().Jobs(a.e.cfg.Namespace).Delete(ctx, a.name, metav1.DeleteOptions{PropagationPolicy: &fg})
	if err != nil && !apierrors.IsNotFound(err) {
		// Its activeDeadlineSeconds still bounds it.
		a.log.Error("could not delete the Job", "err", err)
		return fmt.Sprintf("the Job could not be deleted: %v", err)
	}
	// In the foreground, Kubernetes removes the Job only once its pod is
	// gone; the pod's informer may lag behind the Job's.
	for !a.w.jobGone.Load() || a.newestPod() != nil {
		select {
		case <-a.w.changed:
		case <-ctx.Done():
			a.log.Warn("the Job's pod was still stopping", "waited", wait)
			return fmt.Sprintf("Job deleted; its pod was still stopping after %s", wait)
		}
	}
	a.log.Info("job deleted")
	return "Job and pod deleted"
}

// phase reports a change of the pod's phase or reason.
func (a *attempt) phase(phase, reason, message string) {
	key := phase + "/" + reason
	if key == a.reported {
		return
	}
	a.reported = key
	if reason != "" {
		message = reason + ": " + message
	}
	a.log.Debug("phase", "phase", phase, "message", message)
	if a.t.Report != nil {
		a.t.Report.Phase(phase, message)
	}
}

// newestPod returns the Job's newest pod in the cache, or nil.
func (a *attempt) newestPod() *corev1.Pod {
	pods, err := a.pods.List(labels.SelectorFromSet(labels.Set{batchv1.JobNameLabel: a.name}))
	if err != nil {
		return nil
	}
	return newest(pods)
}

// freshPod reads the Job's newest pod from the API server.
func (a *attempt) freshPod(ctx context.Context) *corev1.Pod {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), callTimeout)
	defer cancel()
	list, err := a.e.client.CoreV1().Pods(a.e.cfg.Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: labels.SelectorFromSet(labels.Set{batchv1.JobNameLabel: a.name}).String()})
	if err != nil {
		a.log.Warn("could not read the Job's pod", "err", err)
		return nil
	}
	pods := make([]*corev1.Pod, len(list.Items))
	for i := range list.Items {
		pods[i] = &list.Items[i]
	}
	return newest(pods)
}

func newest(pods []*corev1.Pod) *corev1.Pod {
	var n *corev1.Pod
	for _, p := range pods {
		if n == nil || n.CreationTimestamp.Before(&p.CreationTimestamp) {
			n = p
		}
	}
	return n
}
