package process

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/fleet-dev/fleet/internal/workspace"
)

// Recover kills what an earlier life of worker workerID left running and
// removes its workspaces, those kept by KeepFailed included.
//
// A worker killed mid-attempt takes the attempt's process with it (it is
// started with Pdeathsig), but not the processes that one started: they
// keep running, reparented, with nothing left to stop them. They are found
// by their workspace: a process whose environment holds the workspace's
// FLEET_WORK, or whose working directory is in the workspace. A job that
// changes both for its children hides them.
//
// Like the other executors, it never reattaches: the job comes back by
// redelivery, as a new attempt.
func (e *Executor) Recover(ctx context.Context, workerID string) error {
	entries, err := os.ReadDir(e.cfg.Dir)
	if err != nil {
		return fmt.Errorf("attempts folder: %w", err)
	}
	var roots []string
	for _, entry := range entries {
		roots = append(roots, filepath.Join(e.cfg.Dir, entry.Name()))
	}
	// The attempts of runs' nodes, a folder deeper each (see
	// workspace.RunsDir).
	nodes, _ := filepath.Glob(filepath.Join(e.cfg.Dir, workspace.RunsDir, "*", "*", "*"))
	roots = append(roots, nodes...)
	var errs []error
	for _, root := range roots {
		owner, err := os.ReadFile(filepath.Join(root, ownerFile))
		if err != nil || string(owner) != workerID {
			continue // another worker's, or not a workspace
		}
		if err := killIn(ctx, root); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := (&workspace.Dir{Root: root}).Remove(); err != nil {
			errs = append(errs, fmt.Errorf("remove workspace %s: %w", root, err))
		}
	}
	return errors.Join(errs...)
}

// killIn kills, with SIGKILL, the processes of the workspace at root, and
// waits until they are gone.
func killIn(ctx context.Context, root string) error {
	marker := []byte("FLEET_WORK=" + filepath.Join(root, "work"))
	inside := func(p string) bool { return p == root || strings.HasPrefix(p, root+string(filepath.Separator)) }
	find := func() []int {
		procs, _ := filepath.Glob("/proc/[0-9]*")
		var pids []int
		for _, p := range procs {
			pid, err := strconv.Atoi(filepath.Base(p))
			if err != nil || pid == os.Getpid() {
				continue
			}
			env, _ := os.ReadFile(filepath.Join(p, "environ"))
			cwd, _ := os.Readlink(filepath.Join(p, "cwd"))
			if bytes.Contains(append([]byte{0}, env...), append(append([]byte{0}, marker...), 0)) || inside(cwd) {
				pids = append(pids, pid)
			}
		}
		return pids
	}
	// Killed processes take a moment to go: look again every 20 ms, for
	// ten seconds at most.
	b := backoff.WithContext(backoff.WithMaxRetries(backoff.NewConstantBackOff(20*time.Millisecond), 500), ctx)
	return backoff.Retry(func() error {
		pids := find()
		if len(pids) == 0 {
			return nil
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		return fmt.Errorf("processes %v of workspace %s are still running", pids, root)
	}, b)
}
