package longjobs

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/volume"

	"github.com/fleet-dev/fleet/internal/dockertest"
	"github.com/fleet-dev/fleet/internal/executor/docker"
	"github.com/fleet-dev/fleet/internal/executor/process"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/worker"
	"github.com/fleet-dev/fleet/job"
)

// A job's data directory (persist) through the whole fleet: its first
// attempt writes a checkpoint and fails, the second reads it back; the
// directory goes when the job ends, and when it is cancelled, running or
// waiting for a retry.

// checkpointing retries once, at once.
func checkpointing(id string) *job.Request {
	return &job.Request{ID: id, Persist: &job.Persist{Enabled: true}, Timeout: dur(time.Minute),
		Retry: &job.RetryPolicy{MaxAttempts: 2, InitialBackoff: dur(100 * time.Millisecond)}}
}

func TestPersistOnProcesses(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t)
	data := t.TempDir()
	e, err := process.New(process.Config{Dir: t.TempDir(), DataDir: data, Grace: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	f.Worker(t, e, worker.Config{Slots: 4, DataSweep: 300 * time.Millisecond})
	dirs := func() []string {
		entries, _ := os.ReadDir(data)
		var names []string
		for _, d := range entries {
			names = append(names, d.Name())
		}
		return names
	}

	t.Run("retry_reads_the_checkpoint", func(t *testing.T) {
		r := checkpointing("counter")
		r.Command = []string{"sh", "-c", `if [ -f "$FLEET_DATA/counter" ]; then cp "$FLEET_DATA/counter" "$FLEET_OUTPUTS/counter"; ` +
			`else echo 1 > "$FLEET_DATA/counter"; exit 1; fi`}
		r.Outputs = []string{"counter"}
		res := f.Await(t, f.Submit(t, r), 30*time.Second)
		if res.Status != job.StatusSucceeded || res.Attempts != 2 || res.Outputs["counter"] != "1\n" {
			t.Fatalf("result: %s after %d attempts, outputs %q, failure %+v", res.Status, res.Attempts, res.Outputs, res.Failure)
		}
		waitFor(t, "the data directory to go", 5*time.Second, func() bool { return !contains(dirs(), "counter") })
	})

	t.Run("cancelled_while_running", func(t *testing.T) {
		r := checkpointing("cancel-running")
		r.Command = []string{"sh", "-c", `echo 1 > "$FLEET_DATA/c"; sleep 60`}
		id := f.Submit(t, r)
		waitFor(t, "the checkpoint", 20*time.Second, func() bool {
			_, err := os.Stat(filepath.Join(data, id, "c"))
			return err == nil
		})
		if _, err := f.Client.Cancel(context.Background(), id); err != nil {
			t.Fatal(err)
		}
		if res := f.Await(t, id, 30*time.Second); res.Status != job.StatusCancelled {
			t.Fatalf("result: %s", res.Status)
		}
		waitFor(t, "the data directory to go", 5*time.Second, func() bool { return !contains(dirs(), id) })
	})

	t.Run("cancelled_while_waiting_for_a_retry", func(t *testing.T) {
		r := checkpointing("cancel-waiting")
		r.Retry.InitialBackoff = dur(time.Hour)
		r.Retry.MaxBackoff = dur(time.Hour)
		r.Command = []string{"sh", "-c", `echo 1 > "$FLEET_DATA/c"; exit 1`}
		id := f.Submit(t, r)
		waitFor(t, "the retry to be scheduled", 20*time.Second, func() bool {
			s, err := f.Client.Status(context.Background(), id)
			return err == nil && s.Job.State == job.StateRetrying
		})
		if !contains(dirs(), id) {
			t.Fatal("no data directory after the first attempt")
		}
		// The dispatcher finishes a job that waits; a worker's sweep
		// removes its data directory.
		if _, err := f.Client.Cancel(context.Background(), id); err != nil {
			t.Fatal(err)
		}
		if res := f.Await(t, id, 30*time.Second); res.Status != job.StatusCancelled {
			t.Fatalf("result: %s", res.Status)
		}
		waitFor(t, "the sweep to remove the data directory", 5*time.Second, func() bool { return !contains(dirs(), id) })
	})
}

func TestPersistOnDocker(t *testing.T) {
	t.Parallel()
	cli := dockertest.Client(t)
	image := dockertest.TestImage(t)
	f := fleettest.Start(t)
	e, err := docker.New(docker.Config{Dir: t.TempDir(), Grace: 500 * time.Millisecond, Logger: fleettest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	f.Worker(t, e, worker.Config{Slots: 2, Backend: "docker", DataSweep: 300 * time.Millisecond})
	volumes := func(id string) int {
		list, err := cli.VolumeList(context.Background(), volume.ListOptions{Filters: filters.NewArgs(filters.Arg("label", docker.LabelDataJobID+"="+id))})
		if err != nil {
			t.Fatal(err)
		}
		return len(list.Volumes)
	}
	id := "resume-" + job.NewID()[20:]
	r := checkpointing(id)
	r.Image, r.PullPolicy = image, job.PullNever
	r.Command = []string{"/testprog", "resume", "$FLEET_DATA/counter"}
	f.Submit(t, r)
	// While the job runs, its volume is there for the next attempt.
	waitFor(t, "the job's data volume", 20*time.Second, func() bool { return volumes(id) == 1 })
	res := f.Await(t, id, time.Minute)
	if res.Status != job.StatusSucceeded || res.Attempts != 2 || strings.TrimSpace(res.Stdout) != "1" ||
		len(res.History) != 1 || res.History[0].ExitCode == nil || *res.History[0].ExitCode != 1 {
		t.Fatalf("result: %s after %d attempts, stdout %q, history %+v", res.Status, res.Attempts, res.Stdout, res.History)
	}
	waitFor(t, "the data volume to go", 5*time.Second, func() bool { return volumes(id) == 0 })

	// A job cancelled while it runs loses its volume too.
	id = "cancelled-" + job.NewID()[20:]
	r = checkpointing(id)
	r.Image, r.PullPolicy = image, job.PullNever
	r.Command = []string{"/testprog", "write", "$FLEET_DATA/c", "1", "echo", "ready", "sleep", "60s"}
	f.Submit(t, r)
	waitFor(t, "the cancelled job to run", 30*time.Second, func() bool {
		s, err := f.Client.Status(context.Background(), id)
		return err == nil && s.Job.State == job.StateRunning && volumes(id) == 1
	})
	if _, err := f.Client.Cancel(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	if res := f.Await(t, id, 30*time.Second); res.Status != job.StatusCancelled {
		t.Fatalf("the cancelled job: %s %+v", res.Status, res.Failure)
	}
	waitFor(t, "the cancelled job's data volume to go", 10*time.Second, func() bool { return volumes(id) == 0 })
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
