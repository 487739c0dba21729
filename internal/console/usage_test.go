package console

import (
	"testing"
	"time"

	"github.com/fleet-dev/fleet/job"
)

// TestUsageOfARunningJob: the job page shows what its attempt uses, from
// the heartbeat of the worker that runs it, and nothing for another
// attempt.
func TestUsageOfARunningJob(t *testing.T) {
	cpu, mem, lim, pids := 97.4, int64(12<<20+5), int64(384<<20), int64(3)
	live := []*job.Heartbeat{
		{WorkerID: "other", Running: []job.RunningAttempt{{JobID: "j", Attempt: 2, Usage: &job.Usage{CPUPercent: &cpu}}}},
		{WorkerID: "w", Running: []job.RunningAttempt{{JobID: "j", Attempt: 2, StartedAt: time.Now(),
			Usage: &job.Usage{ObservedAt: time.Now(), CPUPercent: &cpu, MemoryBytes: &mem, MemoryLimitBytes: &lim, Pids: &pids}}}},
	}
	rec := &job.Record{ID: "j", State: job.StateRunning, Attempt: 2, WorkerID: "w"}
	if got, want := usageOf(live, rec), "cpu 97% · memory 12Mi of 384Mi · 3 processes"; got != want {
		t.Errorf("usage %q, want %q", got, want)
	}
	rec.Attempt = 1
	if got := usageOf(live, rec); got != "" {
		t.Errorf("usage of an attempt no worker runs: %q", got)
	}
}
