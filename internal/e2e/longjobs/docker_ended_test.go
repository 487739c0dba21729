package longjobs

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"

	"github.com/fleet-dev/fleet/internal/dockertest"
	"github.com/fleet-dev/fleet/job"
)

// TestDockerContainerThatEndedWhileNoWorkerRan: the worker is killed while
// its container runs; the container exits 3 while no worker runs; the
// worker, back with the same id, settles the job from the container's
// real exit code, without running it again: one result (historytest).
func TestDockerContainerThatEndedWhileNoWorkerRan(t *testing.T) {
	t.Parallel()
	cli := dockertest.Client(t)
	cli.NegotiateAPIVersion(context.Background())
	image := dockertest.TestImage(t)
	f := startFleet(t)
	id := "ended-" + job.NewID()[20:]
	args := []string{"--executor", "docker", "--id", id, "--pool", "docker", "--data-dir", t.TempDir()}
	w := f.worker(t, args...)
	ear := f.listen(t, "docker")
	jobID := f.Submit(t, &job.Request{ID: "exits-" + id, Pool: "docker", Image: image, PullPolicy: job.PullNever,
		Command: []string{"/testprog", "echo", "ready", "sleep", "3s", "echo", "bye", "exit", "3"}, Timeout: dur(time.Minute)})
	waitFor(t, "the container to run", time.Minute, func() bool {
		list := containersOf(t, cli, jobID)
		return len(list) == 1 && list[0].State == container.StateRunning
	})
	w.Kill()
	waitFor(t, "the container to exit while no worker runs", 30*time.Second, func() bool {
		list := containersOf(t, cli, jobID)
		return len(list) == 1 && list[0].State == container.StateExited
	})
	f.worker(t, args...)

	r := f.Await(t, jobID, 90*time.Second)
	if r.Status != job.StatusFailed || r.Attempts != 1 || len(r.History) != 0 || r.ExitCode == nil || *r.ExitCode != 3 ||
		r.Failure == nil || r.Failure.Code != job.CodeExitCode {
		t.Fatalf("result: %s after %d attempts, exit %v, history %+v, failure %+v", r.Status, r.Attempts, r.ExitCode, r.History, r.Failure)
	}
	if !strings.Contains(r.Stdout, "bye") {
		t.Errorf("stdout %q: the container's last line is missing", r.Stdout)
	}
	events := f.Events(t, jobID, 10*time.Second)
	if a := find(events, job.EventHeartbeat, job.PhaseAdopted); a == nil || !strings.Contains(a.Message, "ended while no worker followed it") ||
		count(events, job.EventStarted, "") != 1 {
		t.Errorf("adopted event %+v, %d started events", a, count(events, job.EventStarted, ""))
	}
	waitFor(t, "the settled container to be removed", 10*time.Second, func() bool { return len(containersOf(t, cli, jobID)) == 0 })
	f.requireHistory(t, "docker", []string{jobID}, ear)
}
