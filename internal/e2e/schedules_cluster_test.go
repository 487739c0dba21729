package e2e

import (
	"context"
	"maps"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/natstest"
	"github.com/fleet-dev/fleet/job"
)

// TestScheduleSurvivesTheLossOfItsBucketsLeader runs the fleet on a
// three-node cluster, two dispatcher processes with --replicas 3 and a
// schedule every 2 s, and SIGKILLs the NATS server leading the schedules'
// bucket (KV_fleet-schedules, three replicas): the bucket elects another
// leader, and the schedule goes on firing, every slot from its first
// firing to its last once (no job id queued twice, none missed), the
// slots after the kill too, each job run once with one result
// (historytest), no firing counted missed.
func TestScheduleSurvivesTheLossOfItsBucketsLeader(t *testing.T) {
	const (
		every  = 2 * time.Second
		name   = "on-cluster"
		bucket = "KV_fleet-schedules"
	)
	began := time.Now()
	fleettest.Binary(t, "dispatcher") // built before the clock starts
	c := natstest.RunCluster(t, 3)
	c.WaitReady(t, 30*time.Second)
	env := []string{"FLEET_NATS_URL=" + c.URLs(), "FLEET_REDIS_URL=", "FLEET_DATA_DIR=" + t.TempDir(),
		"FLEET_HTTP_ADDR=127.0.0.1:0"}
	ds := []*fleettest.Proc{
		fleettest.StartProc(t, "dispatcher", env, "--replicas", "3", "--log-level", "info"),
		fleettest.StartProc(t, "dispatcher", env, "--replicas", "3", "--log-level", "info"),
	}
	for _, d := range ds {
		d.WaitOutput(t, "dispatcher ready", 30*time.Second)
	}
	w := fleettest.StartProc(t, "worker", env, "--id", "sched-cw", "--slots", "4")
	w.WaitOutput(t, "worker started", 30*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nc := c.Connect(t)
	cl, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ear := listen(t, nc, job.DefaultTenant, "default")
	s, err := js.Stream(ctx, bucket)
	if err != nil {
		t.Fatalf("the schedules' bucket: %v", err)
	}
	if r := s.CachedInfo().Config.Replicas; r != 3 {
		t.Fatalf("the schedules' bucket has %d replicas, want 3 (--replicas 3)", r)
	}
	if _, err := cl.CreateSchedule(ctx, &job.Schedule{Name: name, Every: dur(every), Overlap: job.OverlapAllow,
		Template: &job.Request{Command: []string{"true"}}}); err != nil {
		t.Fatalf("create the schedule: %v", err)
	}
	read := func() map[string][]*job.Record {
		t.Helper()
		for {
			// Each read with a deadline of its own: a request sent in an
			// election is dropped, not answered.
			rctx, rcancel := context.WithTimeout(ctx, 3*time.Second)
			recs, err := readFirings(rctx, js, name)
			rcancel()
			if err == nil {
				return recs
			}
			if ctx.Err() != nil {
				t.Fatalf("read the firings: %v", err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	wait := func(n int, within time.Duration) map[string][]*job.Record {
		t.Helper()
		deadline := time.Now().Add(within)
		for {
			recs := read()
			if len(recs) >= n {
				return recs
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d firings within %s, want %d", len(recs), within, n)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	wait(2, 3*every+time.Second)

	victim := c.StreamLeader(bucket)
	if victim < 0 {
		t.Fatalf("%s has no leader", bucket)
	}
	c.Kill(victim)
	killed := time.Now()
	t.Logf("killed %s, leader of %s", c.Name(victim), bucket)
	leader := c.WaitStreamLeader(t, bucket, 20*time.Second)
	t.Logf("%s leads %s %s after the kill", c.Name(leader), bucket, time.Since(killed).Round(time.Millisecond))

	// Three more firings after the new leader's election, made once each.
	n := len(read())
	recs := wait(n+3, 4*every+10*time.Second)
	var slots []time.Time
	for id, rs := range recs {
		if len(rs) != 1 {
			t.Errorf("job %s queued %d times", id, len(rs))
		}
		at, err := time.Parse(job.FiringLayout, rs[0].Labels[job.LabelFiring])
		if err != nil {
			t.Fatalf("job %s: label %s: %v", id, job.LabelFiring, err)
		}
		if want := job.FiringID(name, at); id != want {
			t.Errorf("job id %s, want %s", id, want)
		}
		slots = append(slots, at)
		t.Logf("firing %s queued %s late", at.Format(time.TimeOnly), rs[0].SubmittedAt.Sub(at).Round(time.Millisecond))
	}
	sort.Slice(slots, func(i, j int) bool { return slots[i].Before(slots[j]) })
	for i := 1; i < len(slots); i++ {
		if gap := slots[i].Sub(slots[i-1]); gap != every {
			t.Errorf("firings %s and %s: %s apart, want %s (a slot missed)", slots[i-1].Format(time.TimeOnly),
				slots[i].Format(time.TimeOnly), gap, every)
		}
	}
	if last := slots[len(slots)-1]; !last.After(killed.Add(every)) {
		t.Errorf("no firing after the kill: the last is %s, the kill at %s", last.Format(time.TimeOnly), killed.Format(time.TimeOnly))
	}
	for id := range recs {
		r, err := cl.Result(ctx, id)
		if err != nil || r.Status != job.StatusSucceeded || r.Attempts != 1 {
			t.Errorf("job %s: %+v, %v", id, r, err)
		}
	}
	info, err := cl.Schedule(ctx, name)
	if err != nil {
		t.Fatalf("show the schedule: %v", err)
	}
	if info.State.Missed != 0 || info.State.Made < int64(len(recs)) {
		t.Errorf("the schedule's counts: made %d, missed %d; %d jobs", info.State.Made, info.State.Missed, len(recs))
	}
	for _, p := range append(ds, w) {
		if p.Wait(0) {
			t.Fatalf("a process exited when a NATS node died:\n%s", p.Output())
		}
	}
	// The schedule fires on: the firings read above must have ended,
	// and any later one may still run.
	requireHistory(t, nc, job.DefaultTenant, "default", name+"-", slices.Collect(maps.Keys(recs)), ear)
	t.Logf("the test took %s", time.Since(began).Round(time.Millisecond))
}
