package kube

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/telemetry"
)

// After the result: Run and Adopt return as soon as the attempt's outcome
// is known, and leave its Job, ended, where it is. The worker calls
// Cleanup once the result is published, and the Job goes then, its pod
// and Secret with it. A worker killed in between leaves an ended Job whose
// job's record no longer says it runs: its next start removes it
// (Recover), and so does the start of any peer in the namespace
// (RecoverAdoptable sweeps the ended Jobs of every worker); failing both,
// Kubernetes does after the Job's TTL (--job-ttl).

// Cleanup implements executor.Cleaner: it deletes the Jobs of attempt
// t.Attempt of job t.JobID, whichever worker made them, and their Secrets.
// The deletion propagates in the background: the pod has ended, and
// nothing waits for it to go.
func (e *Executor) Cleanup(ctx context.Context, t *executor.Task) error {
	ctx, end := telemetry.Step(ctx, "fleet.kube.cleanup")
	names, err := e.jobsOfAttempt(ctx, executor.TenantKey(t.Tenant), t.JobID, t.Attempt)
	if err != nil {
		end(err)
		return err
	}
	var errs []error
	for _, name := range names {
		errs = append(errs, e.deleteJob(ctx, name, true))
		e.log.Debug("job deleted after its result", "job_id", t.JobID, "attempt", t.Attempt, "k8s_job", name)
	}
	err = errors.Join(errs...)
	end(err)
	return err
}

// jobsOfAttempt names the Jobs of one attempt: from the cache when this
// worker made them, else from the API server (an adopted attempt's).
func (e *Executor) jobsOfAttempt(ctx context.Context, tenant, jobID string, attempt int) ([]string, error) {
	sel := labels.SelectorFromSet(labels.Set{LabelManagedBy: "fleet", LabelJobID: labelValue(jobID), LabelAttempt: strconv.Itoa(attempt)})
	var names []string
	if cached, err := e.jobs.List(sel); err == nil {
		for _, j := range cached {
			if j.Annotations[AnnotationJobID] == jobID && j.Annotations[AnnotationTenant] == tenant {
				names = append(names, j.Name)
			}
		}
	}
	if len(names) > 0 {
		return names, nil
	}
	list, err := e.client.BatchV1().Jobs(e.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil, fmt.Errorf("list the Jobs of attempt %d of job %s in namespace %s: %w", attempt, jobID, e.cfg.Namespace, err)
	}
	for _, j := range list.Items {
		if j.Annotations[AnnotationJobID] == jobID {
			names = append(names, j.Name)
		}
	}
	return names, nil
}

// deleteJob deletes a Job, its pods in the background, and, with secret,
// the Secret of the same name (which the Job owns, unless the attempt's
// submit failed half-way). What is gone already is no error.
func (e *Executor) deleteJob(ctx context.Context, name string, secret bool) error {
	ns := e.cfg.Namespace
	bg := metav1.DeletePropagationBackground
	var errs []error
	if err := e.client.BatchV1().Jobs(ns).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("delete Job %s/%s: %w", ns, name, err))
	}
	if secret {
		if err := e.client.CoreV1().Secrets(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete Secret %s/%s: %w", ns, name, err))
		}
	}
	return errors.Join(errs...)
}

// sweepPeers deletes the Jobs of the other workers in the namespace whose
// attempts have ended and whose jobs' records no longer say they run
// (adoptable): their results are in, and their workers died before
// Cleanup. A Job being deleted, or still running, is left alone, and so is
// one whose record still says it runs: its worker, or the one that adopts
// it, settles it.
func (e *Executor) sweepPeers(ctx context.Context, workerID string, adoptable func(tenant, jobID string, attempt int) bool) (int, error) {
	ns := e.cfg.Namespace
	others, err := labels.NewRequirement(LabelWorkerID, selection.NotEquals, []string{labelValue(workerID)})
	if err != nil {
		return 0, fmt.Errorf("select the Jobs of other workers: %w", err)
	}
	sel := labels.SelectorFromSet(labels.Set{LabelManagedBy: "fleet"}).Add(*others)
	jobs, err := e.client.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return 0, fmt.Errorf("list the Jobs of other workers in namespace %s: %w", ns, err)
	}
	if len(jobs.Items) == 0 {
		return 0, nil
	}
	pods, err := e.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return 0, fmt.Errorf("list the pods of other workers in namespace %s: %w", ns, err)
	}
	byJob := map[string][]*corev1.Pod{}
	for i := range pods.Items {
		p := &pods.Items[i]
		byJob[p.Labels[batchv1.JobNameLabel]] = append(byJob[p.Labels[batchv1.JobNameLabel]], p)
	}
	var errs []error
	deleted := 0
	for i := range jobs.Items {
		j := &jobs.Items[i]
		id := j.Annotations[AnnotationJobID]
		n, _ := strconv.Atoi(j.Labels[LabelAttempt])
		if j.DeletionTimestamp != nil || id == "" || n <= 0 || judge(j, newest(byJob[j.Name]), 0) == nil || adoptable(j.Annotations[AnnotationTenant], id, n) {
			continue
		}
		if err := e.deleteJob(ctx, j.Name, true); err != nil {
			errs = append(errs, err)
			continue
		}
		e.log.Info("deleted the ended Job of another worker, whose result is in", "k8s_job", j.Name, "job_id", id, "attempt", n,
			"worker_id", j.Annotations[AnnotationWorkerID])
		deleted++
	}
	return deleted, errors.Join(errs...)
}
