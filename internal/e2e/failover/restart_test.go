package failover

import (
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/natstest"
	"github.com/fleet-dev/fleet/internal/redistest"
)

// TestKillAndRestartOneServer runs the fleet as one machine runs it: one
// nats-server with file storage, a dispatcher with admission, one no-op
// worker with 64 slots, jobs offered at a steady pace, and the server
// SIGKILLed three times while they run, each time started again two
// seconds later with its store. Once on each submit path, every job ends
// with one result: one final version in the pool's stream, none after it,
// no attempt going back, none heard twice (historytest); none is lost or
// fails. The targets (fleettest.Target): the worst submit→result under
// 10 s, the throughput over the run at 0.9 times the undisturbed run's or
// more (that run made only with the targets on).
//
// After a restart, JetStream may deliver a job again as if for the first
// time (its consumer's state was not flushed before the kill): the worker
// must find that the job ended and leave it.
func TestKillAndRestartOneServer(t *testing.T) {
	const (
		jobs = 1200
		rate = 100 // jobs per second offered: a run lasts 12 s
	)
	fleettest.Binary(t, "worker")
	c := natstest.RunServer(t)
	c.WaitReady(t, 30*time.Second)
	rs := redistest.Start(t)
	env := []string{"FLEET_NATS_URL=" + c.URLs(), "FLEET_REDIS_URL=" + rs.URL(), "FLEET_DATA_DIR=" + t.TempDir(),
		"FLEET_HTTP_ADDR=127.0.0.1:0", "FLEET_HEARTBEAT_INTERVAL=1s"}
	d := fleettest.StartProc(t, "dispatcher", env)
	d.WaitOutput(t, "dispatcher ready", 30*time.Second)
	w := fleettest.StartProc(t, "worker", env, "--id", "one", "--executor", "noop", "--slots", "64")
	w.WaitOutput(t, "worker started", 30*time.Second)

	var calm run
	if fleettest.Targets() {
		calm = offer(t, c, "calm", jobs, rate, false, nil)
		t.Logf("undisturbed: %d jobs in %s, %.0f jobs/s, submit→result p50 %s, worst %s",
			calm.jobs, calm.took.Round(time.Millisecond), calm.rate(), calm.p50.Round(time.Millisecond), calm.worst.Round(time.Millisecond))
	}
	kills := func() []kill {
		return []kill{
			{at: 2 * time.Second, why: "the server"},
			{at: 5500 * time.Millisecond, why: "the server again"},
			{at: 9 * time.Second, why: "the server a third time"},
		}
	}
	report(t, "killed three times, submitted by request", offer(t, c, "storm", jobs, rate, false, kills()), calm)
	report(t, "killed three times, submitted to the intake stream", offer(t, c, "stored", jobs, rate, true, kills()), calm)
	for _, p := range []*fleettest.Proc{d, w} {
		if p.Wait(0) {
			t.Fatalf("a process exited when the NATS server died:\n%s", p.Output())
		}
	}
}
