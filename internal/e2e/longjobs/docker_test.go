package longjobs

import (
	"context"
	"encoding/json"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"

	"github.com/fleet-dev/fleet/internal/dockertest"
	"github.com/fleet-dev/fleet/internal/executor/docker"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/job"
)

// containersOf lists the containers of a fleet job.
func containersOf(t *testing.T, cli *client.Client, id string) []container.Summary {
	t.Helper()
	list, err := cli.ContainerList(context.Background(), container.ListOptions{All: true,
		Filters: filters.NewArgs(filters.Arg("label", docker.LabelJobID+"="+id))})
	if err != nil {
		t.Fatal(err)
	}
	return list
}

// TestDockerAdoptionWithTheSameID: a container running sleep 20 loses its
// worker 5 s in (a SIGKILL; a SIGTERM with --handoff); the worker comes
// back with the same id, keeps the container at start, and adopts it when
// the job's message comes back: the same container finishes, the job
// succeeds after one attempt with its output, with one result
// (historytest: the adoption's version keeps the attempt's number).
func TestDockerAdoptionWithTheSameID(t *testing.T) {
	cli := dockertest.Client(t)
	// Once before the subtests share the client: its first call negotiates
	// the API version, unguarded.
	cli.NegotiateAPIVersion(context.Background())
	image := dockertest.TestImage(t)
	for _, tc := range []struct {
		name    string
		handoff bool
	}{{"sigkill", false}, {"sigterm_handoff", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := startFleet(t)
			id := "dock-" + job.NewID()[20:]
			args := []string{"--executor", "docker", "--id", id, "--pool", "docker", "--data-dir", t.TempDir()}
			if tc.handoff {
				args = append(args, "--handoff")
			}
			first := f.worker(t, args...)
			ear := f.listen(t, "docker")
			jobID := f.Submit(t, &job.Request{ID: "sleeper-" + id, Pool: "docker", Image: image, PullPolicy: job.PullNever,
				Command: []string{"/testprog", "echo", "ready", "sleep", "20s", "write", "$FLEET_OUTPUTS/out.txt", "slept", "echo", "woke"},
				Outputs: []string{"out.txt"}, Timeout: dur(2 * time.Minute)})
			var c container.Summary
			waitFor(t, "the container to run", time.Minute, func() bool {
				list := containersOf(t, cli, jobID)
				if len(list) == 1 && list[0].State == container.StateRunning {
					c = list[0]
					return true
				}
				return false
			})
			time.Sleep(time.Until(time.Unix(c.Created, 0).Add(5 * time.Second)))
			if tc.handoff {
				first.Signal(syscall.SIGTERM)
				if !first.Wait(20 * time.Second) {
					t.Fatal("the worker did not stop within 20 s of SIGTERM with --handoff")
				}
			} else {
				first.Kill()
			}
			if list := containersOf(t, cli, jobID); len(list) != 1 || list[0].State != container.StateRunning {
				t.Fatalf("the container does not run on without its worker: %+v", list)
			}
			stopped := time.Now()
			metricsAddr := freeAddr(t)
			f.worker(t, append(slices.Clone(args), "--metrics-addr", metricsAddr)...)

			r := f.Await(t, jobID, 90*time.Second)
			t.Logf("result %s after %s (attempts %d)", r.Status, time.Since(stopped).Round(time.Second), r.Attempts)
			if r.Status != job.StatusSucceeded || r.Attempts != 1 || len(r.History) != 0 || r.Outputs["out.txt"] != "slept" {
				t.Fatalf("result: %s after %d attempts, outputs %q, history %+v, failure %+v", r.Status, r.Attempts, r.Outputs, r.History, r.Failure)
			}
			if !strings.Contains(r.Stdout, "woke") {
				t.Errorf("stdout %q: the lines printed after the adoption are missing", r.Stdout)
			}
			events := f.Events(t, jobID, 10*time.Second)
			adopted := find(events, job.EventHeartbeat, job.PhaseAdopted)
			name := strings.TrimPrefix(c.Names[0], "/")
			final := 0
			for _, e := range events {
				if e.Type.Final() {
					final++
				}
			}
			if adopted == nil || !strings.Contains(adopted.Message, name) || count(events, job.EventStarted, "") != 1 ||
				final != 1 || count(events, job.EventRetryScheduled, "") != 0 {
				t.Errorf("adopted event %+v (want it to name container %s), %d started events, %d final, %d retries", adopted, name,
					count(events, job.EventStarted, ""), final, count(events, job.EventRetryScheduled, ""))
			}
			waitFor(t, "the adopted container to be removed", 10*time.Second, func() bool { return len(containersOf(t, cli, jobID)) == 0 })
			if v, ok := scrape(t, metricsAddr, "fleet_worker_attempts_adopted_total"); !ok || v != 1 {
				t.Errorf("fleet_worker_attempts_adopted_total of the worker back: %v (found %v), want 1", v, ok)
			}
			f.requireHistory(t, "docker", []string{jobID}, ear)
		})
	}
}

// TestDockerLiveUsage: while a container spins a CPU, the worker's
// heartbeat, fleetctl status and fleetctl top show it using CPU and
// memory. How much of a core it gets depends on what runs beside it (the
// conformance test's spinner got 6.2% with two make tests on this 2-core
// machine), so only that it uses some is held; the figures are logged.
func TestDockerLiveUsage(t *testing.T) {
	const spinning = 0 // percent of a core
	t.Parallel()
	dockertest.Client(t)
	image := dockertest.TestImage(t)
	f := startFleet(t)
	f.worker(t, "--executor", "docker", "--id", "spinner-host", "--pool", "docker", "--data-dir", t.TempDir(), "--heartbeat-interval", "500ms")
	id := f.Submit(t, &job.Request{ID: "spinner", Pool: "docker", Image: image, PullPolicy: job.PullNever,
		Command: []string{"/testprog", "spin", "20s"}, Timeout: dur(time.Minute)})

	var seen *job.Usage
	waitFor(t, "the spinner's usage in the worker's heartbeat", 15*time.Second, func() bool {
		hbs, err := f.caps.Workers(context.Background(), "docker")
		if err != nil || len(hbs) != 1 {
			return false
		}
		for _, r := range hbs[0].Running {
			if u := r.Usage; r.JobID == id && u != nil && u.CPUPercent != nil && *u.CPUPercent > spinning && u.MemoryBytes != nil && *u.MemoryBytes > 0 {
				seen = u
				return true
			}
		}
		return false
	})
	t.Logf("heartbeat: cpu %.1f%%, memory %d bytes, pids %v", *seen.CPUPercent, *seen.MemoryBytes, *seen.Pids)

	var status struct {
		Job   *job.Record `json:"job"`
		Usage *job.Usage  `json:"usage"`
	}
	waitFor(t, "the spinner's usage in fleetctl status", 5*time.Second, func() bool {
		cmd := exec.Command(fleettest.Binary(t, "fleetctl"), "status", id, "-o", "json")
		cmd.Env = append(cmd.Environ(), f.env...)
		out, err := cmd.Output()
		if err != nil || json.Unmarshal(out, &status) != nil {
			return false
		}
		u := status.Usage
		return status.Job.State == job.StateRunning && u != nil && u.CPUPercent != nil && *u.CPUPercent > spinning && u.MemoryBytes != nil && *u.MemoryBytes > 0
	})
	t.Logf("fleetctl status: cpu %.1f%%, memory %d bytes", *status.Usage.CPUPercent, *status.Usage.MemoryBytes)
	cmd := exec.Command(fleettest.Binary(t, "fleetctl"), "status", id)
	cmd.Env = append(cmd.Environ(), f.env...)
	if out, err := cmd.Output(); err != nil || !strings.Contains(string(out), "usage:     cpu ") {
		t.Errorf("fleetctl status, as text, shows no usage: %v\n%s", err, out)
	}
	// fleetctl top lists the running attempt with what it uses.
	var top []struct {
		JobID    string     `json:"job_id"`
		Attempt  int        `json:"attempt"`
		WorkerID string     `json:"worker_id"`
		Usage    *job.Usage `json:"usage"`
	}
	waitFor(t, "the spinner in fleetctl top", 5*time.Second, func() bool {
		cmd := exec.Command(fleettest.Binary(t, "fleetctl"), "top", "--pool", "docker", "-o", "json")
		cmd.Env = append(cmd.Environ(), f.env...)
		out, err := cmd.Output()
		if err != nil || json.Unmarshal(out, &top) != nil || len(top) != 1 {
			return false
		}
		u := top[0].Usage
		return top[0].JobID == id && top[0].Attempt == 1 && top[0].WorkerID == "spinner-host" &&
			u != nil && u.CPUPercent != nil && *u.CPUPercent > spinning && u.MemoryBytes != nil && *u.MemoryBytes > 0
	})
	cmd = exec.Command(fleettest.Binary(t, "fleetctl"), "top")
	cmd.Env = append(cmd.Environ(), f.env...)
	if out, err := cmd.Output(); err != nil || !strings.Contains(string(out), id) || !strings.Contains(string(out), "%") {
		t.Errorf("fleetctl top, as text: %v\n%s", err, out)
	}
	if r := f.Await(t, id, time.Minute); r.Status != job.StatusSucceeded {
		t.Errorf("the spinner: %s %+v", r.Status, r.Failure)
	}
}

// TestDockerJobOfAnotherHostWaitsThenRunsAgain: a job whose container ran
// where only its worker can reach it (another data directory: another
// host, as far as a worker can tell) waits for that worker up to
// --adopt-wait; then its attempt is lost and runs again here, with one
// result (historytest); and when the old worker comes back, it removes
// the container its job no longer needs.
func TestDockerJobOfAnotherHostWaitsThenRunsAgain(t *testing.T) {
	t.Parallel()
	cli := dockertest.Client(t)
	cli.NegotiateAPIVersion(context.Background())
	image := dockertest.TestImage(t)
	f := startFleet(t)
	suffix := job.NewID()[20:]
	hostA := []string{"--executor", "docker", "--id", "host-a-" + suffix, "--pool", "docker", "--data-dir", t.TempDir()}
	a := f.worker(t, hostA...)
	ear := f.listen(t, "docker")
	id := f.Submit(t, &job.Request{ID: "elsewhere-" + suffix, Pool: "docker", Image: image, PullPolicy: job.PullNever,
		Command: []string{"/testprog", "echo", "ready", "sleep", "6s"}, Timeout: dur(time.Minute)})
	waitFor(t, "the container to run", time.Minute, func() bool {
		list := containersOf(t, cli, id)
		return len(list) == 1 && list[0].State == container.StateRunning
	})
	a.Kill()
	killed := time.Now()
	f.worker(t, "--executor", "docker", "--id", "host-b-"+suffix, "--pool", "docker", "--data-dir", t.TempDir(), "--adopt-wait", "4s")

	r := f.Await(t, id, 90*time.Second)
	t.Logf("result %s after %s", r.Status, time.Since(killed).Round(time.Second))
	if r.Status != job.StatusSucceeded || r.Attempts != 2 || r.WorkerID != "host-b-"+suffix || len(r.History) != 1 ||
		r.History[0].Failure == nil || r.History[0].Failure.Code != job.CodeWorkerLost ||
		!strings.Contains(r.History[0].Failure.Message, "did not come back within the adopt wait of 4s") {
		t.Fatalf("result: %s after %d attempts on %s, history %+v", r.Status, r.Attempts, r.WorkerID, r.History)
	}
	events := f.Events(t, id, 10*time.Second)
	if e := find(events, job.EventHeartbeat, job.PhaseAwaitingOwner); e == nil || !strings.Contains(e.Message, "host-a-"+suffix) {
		t.Errorf("awaiting_owner event: %+v", e)
	}
	// The first container ran on, unadopted; its worker, back, removes it.
	f.worker(t, hostA...)
	waitFor(t, "the old worker to remove the container of the lost attempt", 30*time.Second, func() bool {
		for _, c := range containersOf(t, cli, id) {
			if c.Labels[docker.LabelAttempt] == "1" {
				return false
			}
		}
		return true
	})
	f.requireHistory(t, "docker", []string{id}, ear)
}
