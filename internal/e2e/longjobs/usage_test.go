package longjobs

import (
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/executor/process"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/worker"
	"github.com/fleet-dev/fleet/job"
)

// TestUsageInHeartbeatEvents: a running attempt publishes heartbeat events
// of phase usage with what it uses (here a process, read from /proc), at
// the worker's usage interval and not at every heartbeat.
func TestUsageInHeartbeatEvents(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t)
	e, err := process.New(process.Config{Dir: t.TempDir(), DataDir: t.TempDir(), Grace: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	const progress, interval = 200 * time.Millisecond, time.Second
	f.Worker(t, e, worker.Config{Slots: 1, Progress: progress, UsageInterval: interval})
	id := f.Submit(t, &job.Request{ID: "usage-events", Command: []string{"sh", "-c", "sleep 4"}, Timeout: dur(time.Minute)})
	if r := f.Await(t, id, 30*time.Second); r.Status != job.StatusSucceeded {
		t.Fatalf("result: %s %+v", r.Status, r.Failure)
	}
	events := f.Events(t, id, 10*time.Second)
	beats, usage := count(events, job.EventHeartbeat, ""), count(events, job.EventHeartbeat, job.PhaseUsage)
	t.Logf("%d heartbeat events, %d with usage", beats, usage)
	// About 4 s of running: some 20 heartbeats, some 4 of them with usage.
	if usage < 2 || usage > 6 || beats < 2*usage {
		t.Errorf("%d heartbeat events, %d with usage; want usage about once a second, far from every heartbeat", beats, usage)
	}
	u := find(events, job.EventHeartbeat, job.PhaseUsage)
	if u == nil || u.Usage == nil || u.Usage.MemoryBytes == nil || *u.Usage.MemoryBytes <= 0 ||
		u.Usage.Pids == nil || *u.Usage.Pids < 1 || u.Attempt != 1 {
		t.Errorf("usage event %+v", u)
	} else {
		t.Logf("usage: memory %d bytes, pids %d", *u.Usage.MemoryBytes, *u.Usage.Pids)
	}
}
