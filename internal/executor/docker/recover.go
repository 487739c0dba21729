package docker

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"

	"github.com/fleet-dev/fleet/internal/workspace"
)

// Recover removes every container that an earlier life of worker workerID
// left on the Docker host, running or not, with its workspace: a worker
// killed mid-attempt leaves nothing running or orphaned once it is back.
// Containers kept by KeepFailed go too: they last until the worker starts
// again. A worker that adopts (see RecoverAdoptable) keeps the containers
// whose attempts its jobs' records still say run.
func (e *Executor) Recover(ctx context.Context, workerID string) error {
	return e.recover(ctx, workerID, nil)
}

func (e *Executor) recover(ctx context.Context, workerID string, adoptable func(tenant, jobID string, attempt int) bool) error {
	list, err := e.api.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(
		filters.Arg("label", LabelManaged+"=true"),
		filters.Arg("label", LabelWorkerID+"="+workerID),
	)})
	if err != nil {
		return fmt.Errorf("list the containers of worker %s: %w", workerID, err)
	}
	var errs []error
	for _, c := range list {
		name := strings.TrimPrefix(firstOr(c.Names, c.ID), "/")
		jobID, attempt := c.Labels[LabelJobID], c.Labels[LabelAttempt]
		if n, err := strconv.Atoi(attempt); err == nil && adoptable != nil && adoptable(c.Labels[LabelTenant], jobID, n) {
			e.log.Info("keeping a container left by an earlier life of this worker, for adoption", "container", name,
				"job_id", jobID, "attempt", attempt, "state", c.State)
			continue
		}
		// Force: SIGKILL first when it runs.
		err := e.api.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true, RemoveVolumes: true})
		if err != nil && !cerrdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("remove container %s: %w", name, err))
			continue
		}
		e.removeWorkspace(c.Labels[LabelWorkspace])
		e.log.Info("removed a container left by an earlier life of this worker", "container", name,
			"job_id", jobID, "attempt", attempt, "state", c.State)
	}
	return errors.Join(errs...)
}

// removeWorkspace removes the workspace folder of a container, if it is one
// of this executor's.
func (e *Executor) removeWorkspace(root string) {
	if root == "" || filepath.Dir(filepath.Clean(root)) != e.cfg.Dir {
		return
	}
	if err := (&workspace.Dir{Root: root}).Remove(); err != nil {
		e.log.Warn("cannot remove the workspace of a removed container", "dir", root, "err", err)
	}
}

func firstOr(s []string, def string) string {
	if len(s) > 0 {
		return s[0]
	}
	return def
}
