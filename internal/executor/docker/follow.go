package docker

// Following a container: its exit, an OOM kill, its logs, its end.

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	cerrdefs "github.com/containerd/errdefs"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/job"
)

// exit is how the wait for a container ended.
type exit struct {
	code int64
	err  error
}

// wait waits, until ctx ends, for the container to stop running.
func (e *Executor) wait(ctx context.Context, id string) <-chan exit {
	ch := make(chan exit, 1)
	results, errs := e.stream.ContainerWait(ctx, id, container.WaitConditionNotRunning)
	go func() {
		select {
		case r := <-results:
			x := exit{code: r.StatusCode}
			if r.Error != nil && r.Error.Message != "" {
				x.err = errors.New(r.Error.Message)
			}
			ch <- x
		case err := <-errs:
			ch <- exit{err: err}
		}
	}()
	return ch
}

// oomKilled inspects a container that has exited and reports whether the
// kernel killed it for its memory. A container removed by someone else is
// not found.
//
// The daemon's OOMKilled is not enough: containerd sends the OOM and the
// exit of a container on separate paths, and the daemon (20.10 at least)
// sets OOMKilled only when the OOM comes first. It announces the OOM
// event either way, so a container killed by a SIGKILL not ours (sigkill)
// is checked against the daemon's events too. What neither can tell is an
// OOM kill in the first moments of a container, before containerd watches
// for them (cgroup v1): that shows as a plain exit code 137.
func (e *Executor) oomKilled(ctx context.Context, id string, started time.Time, sigkill bool) (bool, error) {
	c, err := e.api.ContainerInspect(ctx, id)
	switch {
	case err != nil:
		return false, err
	case c.State == nil:
		return false, nil
	case c.State.Status == container.StateRemoving || c.State.Status == container.StateDead:
		// Someone is removing it, and killed it first.
		return false, cerrdefs.ErrNotFound
	case c.State.OOMKilled || !sigkill:
		return c.State.OOMKilled, nil
	}
	return e.oomEvent(ctx, id, started), nil
}

// oomEvent reports whether the daemon announced an OOM kill of the
// container since it started, waiting a moment for one announced late.
func (e *Executor) oomEvent(ctx context.Context, id string, started time.Time) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	msgs, errs := e.stream.Events(ctx, events.ListOptions{
		// A minute early, for a daemon whose clock is behind ours.
		Since: started.Add(-time.Minute).Format(time.RFC3339Nano),
		Filters: filters.NewArgs(filters.Arg("type", string(events.ContainerEventType)),
			filters.Arg("container", id), filters.Arg("event", string(events.ActionOOM))),
	})
	select {
	case <-msgs:
		return true
	case err := <-errs:
		if !errors.Is(err, context.DeadlineExceeded) {
			e.log.Warn("cannot read the daemon's events", "container_id", id, "err", err)
		}
		return false
	}
}

// terminate stops the container: SIGTERM, then SIGKILL after the grace
// period. It returns how the container ended.
func (e *Executor) terminate(ctx context.Context, id string, exited <-chan exit) (x exit, how string) {
	// A failure here means the container is already gone or stopping.
	if err := e.api.ContainerKill(ctx, id, "SIGTERM"); err != nil {
		e.log.Debug("SIGTERM not delivered", "container_id", id, "err", err)
	}
	grace := time.NewTimer(e.cfg.Grace)
	defer grace.Stop()
	select {
	case x = <-exited:
		return x, "stopped with SIGTERM"
	case <-grace.C:
	}
	if err := e.api.ContainerKill(ctx, id, "SIGKILL"); err != nil {
		e.log.Debug("SIGKILL not delivered", "container_id", id, "err", err)
	}
	select {
	case x = <-exited:
	case <-time.After(e.cfg.APITimeout):
		x = exit{err: fmt.Errorf("still running %s after SIGKILL", e.cfg.APITimeout)}
	}
	return x, fmt.Sprintf("killed with SIGKILL after a grace period of %s", e.cfg.Grace)
}

// follow copies the container's output, stdout and stderr apart, into the
// Outputs. The returned function waits for the copy to end, which it does
// when the container has stopped; it waits a few seconds at most.
func (e *Executor) follow(ctx context.Context, id string, since time.Time, stdout, stderr *executor.Output) (wait func()) {
	opts := container.LogsOptions{ShowStdout: true, ShowStderr: true, Follow: true}
	if !since.IsZero() {
		opts.Since = since.Format(time.RFC3339Nano)
	}
	rc, err := e.stream.ContainerLogs(ctx, id, opts)
	if err != nil {
		e.log.Warn("cannot follow the container's output", "container_id", id, "err", err)
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = stdcopy.StdCopy(stdout, stderr, rc)
		_ = stdout.Close()
		_ = stderr.Close()
	}()
	return func() {
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			e.log.Warn("the container's output did not end with it; cutting it", "container_id", id)
		}
		_ = rc.Close()
		<-done
	}
}

// remove removes a container and its anonymous volumes.
func (e *Executor) remove(ctx context.Context, id, name string) {
	err := e.api.ContainerRemove(ctx, id, container.RemoveOptions{Force: true, RemoveVolumes: true})
	// Not found, or a conflict with a removal under way: gone, or going.
	if err != nil && !cerrdefs.IsNotFound(err) && !cerrdefs.IsConflict(err) {
		e.log.Warn("cannot remove container", "container", name, "err", err)
	}
}

// exitMessage describes a non-zero exit code; a code above 128 is most
// often a signal's.
func exitMessage(code int) string {
	if code > 128 && code < 128+32 {
		return fmt.Sprintf("exited with code %d (128 + signal %d, %v)", code, code-128, syscall.Signal(code-128))
	}
	return fmt.Sprintf("exited with code %d", code)
}

// failErr keeps a nil *job.Failure from becoming a non-nil error.
func failErr(f *job.Failure) error {
	if f == nil {
		return nil
	}
	return f
}
