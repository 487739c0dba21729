package failover

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/natstest"
	"github.com/fleet-dev/fleet/internal/redistest"
)

// TestFailoverCostsOnlyTheElections kills the three servers of a cluster
// in turn, 4.5 s apart, each started again two seconds after its kill,
// while jobs are offered at 150 a second to two dispatchers and three
// workers, on each submit path. Every job ends with one result
// (historytest); the target (fleettest.Target): none waits more than a second
// beyond the time what holds it had no leader, as the servers' logs tell
// it: its pool's stream and its queue; on the intake path, the intake
// stream and the dispatchers' consumer of it too. What the fleet adds to
// the cluster's elections is to be at most a second (a write or a pull
// lost with a server, a leadership moved by the placer).
//
// A pool's queue is a Raft group of its own, led by its stream's leader
// (queue.Placed): when that server dies, the two elect apart, and a job
// waits for the later. That is the cluster's, and counted as such here;
// "beyond its stream's election alone" is not what the fleet achieves (see
// docs/running.md).
func TestFailoverCostsOnlyTheElections(t *testing.T) {
	const (
		jobs = 1500
		rate = 150
	)
	fleettest.Binary(t, "worker")
	c := natstest.RunCluster(t, 3)
	c.WaitReady(t, 30*time.Second)
	rs := redistest.Start(t)
	env := []string{"FLEET_NATS_URL=" + c.URLs(), "FLEET_REDIS_URL=" + rs.URL(), "FLEET_DATA_DIR=" + t.TempDir(),
		"FLEET_HTTP_ADDR=127.0.0.1:0", "FLEET_HEARTBEAT_INTERVAL=1s"}
	var procs []*fleettest.Proc
	for range 2 {
		d := fleettest.StartProc(t, "dispatcher", env, "--replicas", "3")
		d.WaitOutput(t, "dispatcher ready", 30*time.Second)
		procs = append(procs, d)
	}
	for i := range 3 {
		w := fleettest.StartProc(t, "worker", env, "--id", fmt.Sprintf("fo-%d", i), "--executor", "noop", "--slots", "32")
		w.WaitOutput(t, "worker started", 30*time.Second)
		procs = append(procs, w)
	}
	offer(t, c, "warm", 300, rate, false, nil)
	kills := func() []kill {
		return []kill{
			{at: time.Second, why: "leader of FLEET_POOL_default", pick: func() int { return c.StreamLeader("FLEET_POOL_default") }},
			{at: 5500 * time.Millisecond, why: "meta leader", pick: c.MetaLeader},
			{at: 10 * time.Second, why: "a third node"},
		}
	}
	for _, path := range []struct {
		name   string
		stored bool
		held   []string // the streams that hold its jobs on the way
	}{
		{"submitted by request", false, []string{"FLEET_POOL_default", "FLEET_POOL_default > q3-default"}},
		{"submitted to the intake stream", true, []string{"FLEET_POOL_default", "FLEET_POOL_default > q3-default", "FLEET_INTAKE", "FLEET_INTAKE > dispatcher"}},
	} {
		began := time.Now()
		r := offer(t, c, fmt.Sprintf("fo%v", path.stored), jobs, rate, path.stored, kills())
		var gaps []natstest.Interval
		for _, s := range path.held {
			for _, g := range c.Leaderless(s, began, time.Now()) {
				t.Logf("%s: %s had no leader from +%s for %s", path.name, s, g.From.Sub(began).Round(time.Millisecond), g.To.Sub(g.From).Round(time.Millisecond))
				gaps = append(gaps, g)
			}
		}
		type late struct {
			timing
			excess time.Duration
		}
		var lates []late
		for _, j := range r.timings {
			wait := j.finished.Sub(j.sent)
			var held time.Duration
			for _, g := range union(gaps) {
				held += g.Overlap(j.sent, j.finished)
			}
			lates = append(lates, late{j, wait - held})
		}
		slices.SortFunc(lates, func(a, b late) int { return int(a.excess - b.excess) })
		excess := make([]time.Duration, len(lates))
		for i, l := range lates {
			excess[i] = l.excess
		}
		worst, worstExcess := lates[len(lates)-1].timing, lates[len(lates)-1].excess
		// Where the slowest spent their time: each version as stored.
		for _, l := range lates[max(0, len(lates)-5):] {
			line := fmt.Sprintf("%s: sent at +%s, %s beyond the elections:", l.id, l.sent.Sub(began).Round(time.Millisecond), l.excess.Round(time.Millisecond))
			for _, v := range r.history.Jobs["default/"+l.id] {
				line += fmt.Sprintf(" %s %s +%s;", v.Kind, v.Rec.State, v.At.Sub(l.sent).Round(time.Millisecond))
			}
			t.Log(line)
		}
		t.Logf("%s: %d jobs, %.0f jobs/s, worst submit→result %s; beyond the elections: p50 %s, p99 %s, worst %s (%s)",
			path.name, r.jobs, r.rate(), r.worst.Round(time.Millisecond), excess[len(excess)/2].Round(time.Millisecond),
			excess[len(excess)*99/100].Round(time.Millisecond), worstExcess.Round(time.Millisecond), worst.id)
		fleettest.Target(t, worstExcess <= time.Second, "%s: job %s waited %s beyond the time the streams that hold it had no leader, over 1 s",
			path.name, worst.id, worstExcess.Round(time.Millisecond))
	}
	for _, p := range procs {
		if p.Wait(0) {
			t.Fatalf("a process exited when NATS servers died:\n%s", p.Output())
		}
	}
}

// union merges overlapping intervals.
func union(in []natstest.Interval) []natstest.Interval {
	s := slices.Clone(in)
	slices.SortFunc(s, func(a, b natstest.Interval) int { return a.From.Compare(b.From) })
	var out []natstest.Interval
	for _, i := range s {
		if n := len(out); n > 0 && !i.From.After(out[n-1].To) {
			if i.To.After(out[n-1].To) {
				out[n-1].To = i.To
			}
			continue
		}
		out = append(out, i)
	}
	return out
}
