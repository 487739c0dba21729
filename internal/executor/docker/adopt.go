package docker

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/workspace"
	"github.com/fleet-dev/fleet/job"
)

// Adoption on Docker: a container outlives its worker (a crash, a stop with
// --handoff). A worker restarted with the same id, on the same host, finds
// it by its labels and adopts it. A container is on one host: another
// worker can reach it only if it talks to the same daemon and sees the
// container's workspace (the same data directory); otherwise the job waits
// for the container's worker to come back (see worker.Config.AdoptWait).

// Find implements executor.Adopter.
func (e *Executor) Find(ctx context.Context, q executor.Query) (*executor.Found, error) {
	list, err := e.api.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(
		filters.Arg("label", LabelManaged+"=true"),
		filters.Arg("label", LabelJobID+"="+q.JobID),
		filters.Arg("label", LabelAttempt+"="+strconv.Itoa(q.Attempt)),
	)})
	if err != nil {
		return nil, fmt.Errorf("list the containers of job %s: %w", q.JobID, err)
	}
	var found *container.Summary
	for i, c := range list {
		// The job id label is exact, but a label filter matches a prefix
		// of nothing else: check anyway, and prefer one that runs.
		if c.Labels[LabelJobID] != q.JobID || c.Labels[LabelTenant] != executor.TenantKey(q.Tenant) {
			continue
		}
		if found == nil || c.State == container.StateRunning {
			found = &list[i]
		}
	}
	elsewhere := &executor.Found{Standing: executor.Unreachable,
		Why: fmt.Sprintf("its container is on the Docker host of worker %s", q.Owner)}
	if found == nil {
		if q.Owner != q.Self {
			return elsewhere, nil
		}
		return &executor.Found{Standing: executor.Gone,
			Why: fmt.Sprintf("no container of attempt %d on this Docker host", q.Attempt)}, nil
	}
	root := found.Labels[LabelWorkspace]
	if filepath.Dir(filepath.Clean(root)) != e.cfg.Dir {
		// Another worker's on a shared daemon, whose workspace this one
		// does not see: its own worker adopts it.
		return elsewhere, nil
	}
	c, err := e.api.ContainerInspect(ctx, found.ID)
	if cerrdefs.IsNotFound(err) {
		return &executor.Found{Standing: executor.Gone, Why: "its container was just removed"}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("inspect container %s: %w", found.ID, err)
	}
	f := &executor.Found{Standing: executor.Running, Handle: "container " + strings.TrimPrefix(c.Name, "/"),
		Ref: &live{id: c.ID, name: strings.TrimPrefix(c.Name, "/"), dir: workspaceAt(root)}}
	if c.State != nil {
		f.StartedAt, _ = time.Parse(time.RFC3339Nano, c.State.StartedAt)
		switch {
		case c.State.Running || c.State.Paused || c.State.Restarting:
		case c.State.Status == container.StateCreated:
			// Created but never started: nothing of the job ran.
			return &executor.Found{Standing: executor.Gone, Why: "its container was created but never started"}, nil
		default:
			f.Standing = executor.Ended
			f.Handle += fmt.Sprintf(" (exited with code %d)", c.State.ExitCode)
		}
	}
	f.Ref.(*live).started = f.StartedAt
	f.Ref.(*live).exited = f.Standing == executor.Ended
	return f, nil
}

func workspaceAt(root string) *workspace.Dir {
	return &workspace.Dir{Root: root, Inputs: filepath.Join(root, "inputs"), Outputs: filepath.Join(root, "outputs"), Work: filepath.Join(root, "work")}
}

// Adopt implements executor.Adopter: it follows the container as Run does,
// from the moment of adoption, then removes it and its workspace (unless
// KeepFailed keeps a failed one, or the worker hands it off again).
func (e *Executor) Adopt(ctx context.Context, t *executor.Task, f *executor.Found) (out *executor.Outcome, err error) {
	c, ok := f.Ref.(*live)
	if !ok {
		return nil, fmt.Errorf("adopt %s: not found by this executor", f.Handle)
	}
	if c.started.IsZero() {
		c.started = time.Now()
	}
	bg := context.WithoutCancel(ctx)
	log := e.log.With("job_id", t.JobID, "attempt", t.Attempt, "container", c.name)
	defer func() {
		switch {
		case err == executor.ErrLeftRunning:
			log.Info("leaving the adopted container running for adoption")
		case e.cfg.KeepFailed && out != nil && out.Status != job.StatusSucceeded:
			log.Info("keeping the container of a failed attempt")
		default:
			e.remove(bg, c.id, c.name)
			_ = c.dir.Remove()
		}
	}()
	log.Info("adopting the container", "exited", c.exited)
	if t.Report != nil {
		t.Report.Phase("running", "container "+c.name+" adopted")
	}
	return e.supervise(ctx, t, c, false)
}

// RecoverAdoptable implements executor.Adopter: Recover, but containers
// whose attempt adoptable says may still be adopted stay, with their
// workspaces, for the worker that gets the job's message.
func (e *Executor) RecoverAdoptable(ctx context.Context, workerID string, adoptable func(tenant, jobID string, attempt int) bool) error {
	return e.recover(ctx, workerID, adoptable)
}
