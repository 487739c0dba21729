package kube

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/informers"
	batchlisters "k8s.io/client-go/listers/batch/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/workspace"
	"github.com/fleet-dev/fleet/job"
)

// Adoption on Kubernetes: an attempt's Job runs in the namespace whatever
// happens to the worker that created it, so any worker of the pool (its
// workers share the namespace) finds it by its labels, the job id and the
// attempt, and follows it to its end: its own watch of that Job and its
// pods, the log from the moment of adoption, the outputs from the Job's
// folder on the shared volume. A Job that ended while no worker watched is
// settled from its status, for as long as Kubernetes keeps it (--job-ttl).

// Find implements executor.Adopter.
func (e *Executor) Find(ctx context.Context, q executor.Query) (*executor.Found, error) {
	ns := e.cfg.Namespace
	sel := labels.SelectorFromSet(labels.Set{LabelManagedBy: "fleet", LabelJobID: labelValue(q.JobID), LabelAttempt: strconv.Itoa(q.Attempt)})
	list, err := e.client.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil, fmt.Errorf("list the Jobs of job %s in namespace %s: %w", q.JobID, ns, err)
	}
	var j *batchv1.Job
	for i := range list.Items {
		c := &list.Items[i]
		if c.Annotations[AnnotationJobID] != q.JobID || c.Annotations[AnnotationTenant] != executor.TenantKey(q.Tenant) ||
			c.DeletionTimestamp != nil {
			continue // another id with the same label value, or going
		}
		if j == nil || j.CreationTimestamp.Before(&c.CreationTimestamp) {
			j = c
		}
	}
	if j == nil {
		return &executor.Found{Standing: executor.Gone,
			Why: fmt.Sprintf("no Job of attempt %d in namespace %s", q.Attempt, ns)}, nil
	}
	f := &executor.Found{Standing: executor.Running, Handle: fmt.Sprintf("Job %s/%s", ns, j.Name), Ref: j,
		StartedAt: j.CreationTimestamp.Time}
	pods, err := e.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{
		LabelSelector: labels.SelectorFromSet(labels.Set{batchv1.JobNameLabel: j.Name}).String()})
	if err != nil {
		return nil, fmt.Errorf("list the pods of Job %s/%s: %w", ns, j.Name, err)
	}
	var pod *corev1.Pod
	for i := range pods.Items {
		if pod == nil || pod.CreationTimestamp.Before(&pods.Items[i].CreationTimestamp) {
			pod = &pods.Items[i]
		}
	}
	if judge(j, pod, 0) != nil {
		f.Standing = executor.Ended
		f.Handle += " (ended)"
	}
	return f, nil
}

// Adopt implements executor.Adopter.
func (e *Executor) Adopt(ctx context.Context, t *executor.Task, f *executor.Found) (*executor.Outcome, error) {
	j, ok := f.Ref.(*batchv1.Job)
	if !ok {
		return nil, fmt.Errorf("adopt %s: not found by this executor", f.Handle)
	}
	req := t.Request.Clone()
	req.Normalize()
	now := metav1.Now()
	a := &attempt{e: e, t: t, req: req, name: j.Name, started: j.CreationTimestamp.Time, since: &now,
		stdout: executor.NewOutput("stdout", t.Report, e.cfg.TailBytes)}
	a.log = e.log.With("job_id", t.JobID, "attempt", t.Attempt, "k8s_job", a.name, "adopted", true)
	var unwatch func()
	a.w, unwatch = e.watch(a.name)
	defer unwatch()
	jobs, pods, stop, err := e.watchJob(ctx, a.name)
	if err != nil {
		if ctx.Err() != nil && !executor.LeavingRunning(ctx) {
			return executor.CancelledOutcome(ctx, time.Now()), nil
		}
		return nil, err
	}
	defer stop()
	a.jobs, a.pods = jobs, pods

	dir, err := e.outputsOf(j)
	if err != nil {
		a.log.Warn("the Job's outputs folder is not on this worker's shared volume; its outputs cannot be collected", "err", err)
	}
	a.log.Info("adopting the Job")
	out, err := a.toEnd(ctx, dir)
	if dir != nil && !errors.Is(err, executor.ErrLeftRunning) {
		_ = dir.Remove()
	}
	return out, err
}

// watchJob watches one Job, by name, and its pods, until stop is called:
// the executor's own informers see only the Jobs of its worker. Changes
// wake the attempt registered under the Job's name.
func (e *Executor) watchJob(ctx context.Context, name string) (batchlisters.JobNamespaceLister, corelisters.PodNamespaceLister, func(), error) {
	ns := e.cfg.Namespace
	jf := informers.NewSharedInformerFactoryWithOptions(e.client, 0, informers.WithNamespace(ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = "metadata.name=" + name }))
	pf := informers.NewSharedInformerFactoryWithOptions(e.client, 0, informers.WithNamespace(ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = labels.SelectorFromSet(labels.Set{batchv1.JobNameLabel: name}).String()
		}))
	jobs, pods := jf.Batch().V1().Jobs(), pf.Core().V1().Pods()
	for inf, gone := range map[cache.SharedIndexInformer]bool{jobs.Informer(): true, pods.Informer(): false} {
		_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { e.notify(obj, false) },
			UpdateFunc: func(_, obj any) { e.notify(obj, false) },
			DeleteFunc: func(obj any) { e.notify(obj, gone) },
		})
		if err != nil {
			return nil, nil, nil, err
		}
	}
	done := make(chan struct{})
	jf.Start(done)
	pf.Start(done)
	stop := func() {
		close(done)
		jf.Shutdown()
		pf.Shutdown()
	}
	sctx, cancel := context.WithTimeout(ctx, e.cfg.SyncTimeout)
	defer cancel()
	if err := errors.Join(jf.WaitForCacheSyncWithContext(sctx).AsError(), pf.WaitForCacheSyncWithContext(sctx).AsError()); err != nil {
		stop()
		return nil, nil, nil, fmt.Errorf("watch Job %s/%s: %w", ns, name, err)
	}
	return jobs.Lister().Jobs(ns), pods.Lister().Pods(ns), stop, nil
}

// outputsOf finds the outputs folder of a Job on the shared volume, from
// its pod template's mount; nil without a shared volume.
func (e *Executor) outputsOf(j *batchv1.Job) (*workspace.Dir, error) {
	if e.cfg.SharedPVC == "" {
		return nil, nil
	}
	for _, c := range j.Spec.Template.Spec.Containers {
		if c.Name != ContainerName {
			continue
		}
		for _, m := range c.VolumeMounts {
			if m.Name != volumeOutputs || m.SubPath == "" {
				continue
			}
			outputs := filepath.Join(e.cfg.SharedDir, filepath.FromSlash(m.SubPath))
			rel, err := filepath.Rel(e.cfg.SharedDir, outputs)
			if err != nil || strings.HasPrefix(rel, "..") || filepath.Base(outputs) != "outputs" {
				return nil, fmt.Errorf("sub-path %q is not an outputs folder of the shared volume", m.SubPath)
			}
			return workspaceAt(filepath.Dir(outputs)), nil
		}
	}
	return nil, errors.New("the Job mounts no outputs folder of the shared volume")
}

func workspaceAt(root string) *workspace.Dir {
	return &workspace.Dir{Root: root, Inputs: filepath.Join(root, "inputs"), Outputs: filepath.Join(root, "outputs"), Work: filepath.Join(root, "work")}
}

// RecoverAdoptable implements executor.Adopter: Recover, but the Jobs
// whose attempts adoptable says may still be adopted stay, with their
// Secrets and outputs folders. It also deletes the ended Jobs that other
// workers of the namespace left before their Cleanup, once their records
// say the attempts no longer run (see sweepPeers).
func (e *Executor) RecoverAdoptable(ctx context.Context, workerID string, adoptable func(tenant, jobID string, attempt int) bool) error {
	return e.recover(ctx, workerID, adoptable)
}

func (e *Executor) recover(ctx context.Context, workerID string, adoptable func(tenant, jobID string, attempt int) bool) error {
	ns := e.cfg.Namespace
	owner := labels.SelectorFromSet(ownerLabels(workerID))
	jobs, err := e.client.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{LabelSelector: owner.String()})
	if err != nil {
		return fmt.Errorf("list the Jobs of worker %s in namespace %s: %w", workerID, ns, err)
	}
	var errs []error
	kept := map[string]bool{}     // job id labels of the Jobs kept
	keptDirs := map[string]bool{} // outputs folders kept
	bg := metav1.DeletePropagationBackground
	deleted := 0
	for _, j := range jobs.Items {
		id := j.Annotations[AnnotationJobID]
		n, _ := strconv.Atoi(j.Labels[LabelAttempt])
		if adoptable != nil && id != "" && n > 0 && adoptable(j.Annotations[AnnotationTenant], id, n) {
			kept[labelValue(id)] = true
			if d, err := e.outputsOf(&j); err == nil && d != nil {
				keptDirs[d.Root] = true
			}
			e.log.Info("keeping a Job left by an earlier life of the worker, for adoption", "k8s_job", j.Name, "job_id", id, "attempt", n)
			continue
		}
		err := e.client.BatchV1().Jobs(ns).Delete(ctx, j.Name, metav1.DeleteOptions{PropagationPolicy: &bg})
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete Job %s/%s: %w", ns, j.Name, err))
		}
		deleted++
	}
	// Secrets that no Job came to own; the others go with their Jobs.
	// deletecollection, unlike list, never reads a Secret's data. Those of
	// kept Jobs stay: a pod not started yet still needs its Secret.
	secrets := owner
	if len(kept) > 0 {
		var values []string
		for v := range kept {
			values = append(values, v)
		}
		r, err := labels.NewRequirement(LabelJobID, selection.NotIn, values)
		if err != nil {
			return fmt.Errorf("select the Secrets to delete: %w", err)
		}
		secrets = secrets.Add(*r)
	}
	err = e.client.CoreV1().Secrets(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: secrets.String()})
	if err != nil {
		errs = append(errs, fmt.Errorf("delete the Secrets of worker %s in namespace %s: %w", workerID, ns, err))
	}
	if e.cfg.SharedDir != "" {
		dir := filepath.Join(e.cfg.SharedDir, labelValue(workerID))
		entries, err := os.ReadDir(dir)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("outputs folders: %w", err))
		}
		for _, entry := range entries {
			root := filepath.Join(dir, entry.Name())
			if keptDirs[root] {
				continue
			}
			if err := (&workspace.Dir{Root: root}).Remove(); err != nil {
				errs = append(errs, fmt.Errorf("outputs folder: %w", err))
			}
		}
	}
	if deleted > 0 {
		e.log.Info("deleted the Jobs of an earlier life of the worker", "worker_id", workerID, "jobs", deleted)
	}
	if adoptable != nil {
		if _, err := e.sweepPeers(ctx, workerID, adoptable); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// track notes a running attempt under its Job's name, for Usage.
func (a *attempt) track() {
	a.e.mu.Lock()
	defer a.e.mu.Unlock()
	a.e.running[a.name] = a
}

func (a *attempt) untrack() {
	a.e.mu.Lock()
	defer a.e.mu.Unlock()
	delete(a.e.running, a.name)
}

// dataRoot is the folder of the jobs' data directories on the shared
// volume: a dot folder, which no worker's outputs folder can be.
const dataRoot = ".fleet-data"

// dataDir makes the job's data folder on the shared volume, writable by
// the pods' user, and returns its sub-path.
func (e *Executor) dataDir(tenant, jobID string) (string, error) {
	if !job.ValidID(jobID) || (tenant != "" && !job.ValidTenant(tenant)) {
		return "", fmt.Errorf("job id %q cannot name a data folder", jobID)
	}
	rel := executor.JobPath(tenant, jobID)
	dir := filepath.Join(e.cfg.SharedDir, dataRoot, filepath.FromSlash(rel))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("data folder on the shared volume: %w", err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		return "", fmt.Errorf("data folder on the shared volume: %w", err)
	}
	return dataRoot + "/" + rel, nil
}

// RemoveData implements executor.DataKeeper.
func (e *Executor) RemoveData(ctx context.Context, tenant, jobID string) error {
	if e.cfg.SharedDir == "" || !job.ValidID(jobID) || (tenant != "" && !job.ValidTenant(tenant)) {
		return nil
	}
	err := (&workspace.Dir{Root: filepath.Join(e.cfg.SharedDir, dataRoot, filepath.FromSlash(executor.JobPath(tenant, jobID)))}).Remove()
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove the data folder of %s: %w", jobID, err)
	}
	return nil
}

// Data implements executor.DataKeeper: the data folders on the shared
// volume, with the time each last changed.
func (e *Executor) Data(ctx context.Context) ([]executor.DataDir, error) {
	if e.cfg.SharedDir == "" {
		return nil, nil
	}
	root := filepath.Join(e.cfg.SharedDir, dataRoot)
	out, err := dataFolders(root, "")
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("data folders: %w", err)
	}
	tenants, _ := os.ReadDir(filepath.Join(root, executor.TenantsDir))
	for _, t := range tenants {
		if t.IsDir() && job.ValidTenant(t.Name()) {
			more, _ := dataFolders(filepath.Join(root, executor.TenantsDir, t.Name()), t.Name())
			out = append(out, more...)
		}
	}
	return out, nil
}

// dataFolders lists the jobs' data folders of one tenant's folder.
func dataFolders(dir, tenant string) ([]executor.DataDir, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []executor.DataDir
	for _, d := range entries {
		if !d.IsDir() || !job.ValidID(d.Name()) {
			continue
		}
		if fi, err := d.Info(); err == nil {
			out = append(out, executor.DataDir{Tenant: tenant, JobID: d.Name(), Created: fi.ModTime()})
		}
	}
	return out, nil
}
