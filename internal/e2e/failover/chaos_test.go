package failover

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/natstest"
	"github.com/fleet-dev/fleet/internal/redistest"
)

// TestChaosOnACluster runs the fleet as it runs for real: a three-node
// cluster with streams of three replicas, two dispatchers started at the
// same instant, three process workers with capacity in Redis, jobs offered
// at a steady pace, on each submit path, while the node leading the jobs
// stream, then the meta leader, then a third node are killed with SIGKILL
// and restarted two seconds later. Every job ends with
// exactly one result, in the stream and as heard by subscribers
// (historytest), none fails or times out because of the failures. A
// process following the tenant's feed with a durable consumer, killed
// with SIGKILL once in between and started again, acknowledges every
// result once, none twice, and the feed holds each once. With
// the targets on (fleettest.Targets, make bench-failover), the jobs run
// once undisturbed first, and the runs are held to them: the worst
// submit→result latency under 10 s, the throughput over the run at least
// 0.9 times the undisturbed run's.
func TestChaosOnACluster(t *testing.T) {
	// Paced for 36 s, so that each kill is twelve seconds from the next: a
	// node killed takes the leadership of its Raft groups with it, their
	// followers elect another in 4 to 9 s, and the node rejoins when it is
	// restarted.
	const (
		jobs = 3600
		rate = 100 // jobs per second offered
	)
	fleettest.Binary(t, "worker")
	c := natstest.RunCluster(t, 3)
	c.WaitReady(t, 30*time.Second)
	rs := redistest.Start(t)
	env := []string{"FLEET_NATS_URL=" + c.URLs(), "FLEET_REDIS_URL=" + rs.URL(), "FLEET_DATA_DIR=" + t.TempDir(),
		"FLEET_HTTP_ADDR=127.0.0.1:0", "FLEET_HEARTBEAT_INTERVAL=1s"}
	ds := []*fleettest.Proc{
		fleettest.StartProc(t, "dispatcher", env, "--replicas", "3"),
		fleettest.StartProc(t, "dispatcher", env, "--replicas", "3"),
	}
	for _, d := range ds {
		d.WaitOutput(t, "dispatcher ready", 30*time.Second)
	}
	var workers []*fleettest.Proc
	for i := range 3 {
		w := fleettest.StartProc(t, "worker", env, "--id", fmt.Sprintf("storm-%d", i), "--slots", "16", "--grace", "100ms")
		w.WaitOutput(t, "worker started", 30*time.Second)
		workers = append(workers, w)
	}

	// The baseline of the throughput target: the same jobs undisturbed.
	var calm run
	if fleettest.Targets() {
		calm = offer(t, c, "calm", jobs, rate, false, nil)
		t.Logf("undisturbed: %d jobs in %s, %.0f jobs/s, submit→result p50 %s, worst %s",
			calm.jobs, calm.took.Round(time.Millisecond), calm.rate(), calm.p50.Round(time.Millisecond), calm.worst.Round(time.Millisecond))
	}
	kills := func() []kill {
		return []kill{
			{at: 3 * time.Second, why: "leader of FLEET_POOL_default", pick: func() int { return c.StreamLeader("FLEET_POOL_default") }},
			{at: 15 * time.Second, why: "meta leader", pick: c.MetaLeader},
			{at: 27 * time.Second, why: "a third node"},
		}
	}
	// The feed's reader, killed between the second and the third node.
	feed := startFeedReader(t, c, "chaos")
	feed.restartAfter(21 * time.Second)
	storm := offer(t, c, "storm", jobs, rate, false, kills())
	// The other submit path: a JetStream publish on the intake subject,
	// sent again with its id until acknowledged.
	stored := offer(t, c, "stored", jobs, rate, true, kills())
	// A killed node takes the leadership of its Raft groups with it; their
	// followers elect another 4 to 9 s after the last heartbeat they had
	// from it. A pool's queues live with its stream's leader (queue.Placed),
	// so that a job meets one election, and what the fleet adds to it
	// (TestFailoverCostsOnlyTheElections) is well under a second: the worst
	// stays under 10 s.
	report(t, "three nodes killed, submitted by request", storm, calm)
	report(t, "three nodes killed, submitted to the intake stream", stored, calm)
	var ids []string
	for _, r := range []run{storm, stored} {
		for _, tm := range r.timings {
			ids = append(ids, tm.id)
		}
	}
	js, err := jetstream.New(c.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	feed.requireEvery(t, js, ids, 2*time.Minute)
	requireOnceInFeed(t, js, ids)
	for _, p := range append(ds, workers...) {
		if p.Wait(0) {
			t.Fatalf("a process exited when NATS nodes died:\n%s", p.Output())
		}
	}
}
