package e2e

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// Sharing on a three-node cluster through a failover: two dispatchers and
// two process workers share pool "shared"; tenant low has 40 jobs queued
// at priority 5 and running when the server leading the pool's stream
// (and, with it, the state the workers schedule from: the queues'
// consumers and the records) is SIGKILLed; tenant urgent then queues 6
// jobs at priority 1. Jobs start again within two heartbeat intervals of
// the kill, the urgent jobs before low's that wait, and every job ends
// with one result, run once or, when its attempt was lost with the
// server, again (historytest, with an ear for each tenant).
func TestSharingThroughALeaderFailover(t *testing.T) {
	// The workers beat every 10 s here (3 s by default): an election on
	// this machine's cluster takes 2 to 8 s alone and more beside other
	// suites, and the bound is two beats.
	const heartbeat = 10 * time.Second
	c, env := fleettest.ClusterFleet(t)
	for i := range 2 {
		fleettest.StartProc(t, "worker", env, "--id", fmt.Sprintf("w-shared-%d", i), "--pool", "shared", "--slots", "2",
			"--heartbeat-interval", heartbeat.String()).
			WaitOutput(t, "worker started", 30*time.Second)
	}
	tenant := func(name string) *client.Client {
		cl, err := client.New(c.Connect(t), client.WithTenant(name))
		if err != nil {
			t.Fatal(err)
		}
		return cl
	}
	low, urgent := tenant("low"), tenant("urgent")
	nc := c.Connect(t)
	lowEar, hiEar := listen(t, nc, "low", "shared"), listen(t, nc, "urgent", "shared")
	req := func(id string, p int) *job.Request {
		r := clusterJob(id, "0.3")
		r.Pool, r.Priority = "shared", p
		return r
	}
	var lowIDs, hiIDs []string
	for i := range 40 {
		lowIDs = append(lowIDs, submitReq(t, low, req(fmt.Sprintf("low-%02d", i), 5)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	waitFor(t, "low's jobs running", 30*time.Second, func() bool {
		st, err := low.Status(ctx, lowIDs[3])
		return err == nil && st.Job.State != job.StateQueued
	})
	victim := c.WaitStreamLeader(t, "FLEET_POOL_shared", 10*time.Second)
	killed := time.Now()
	c.Kill(victim)
	t.Logf("killed %s, the leader of FLEET_POOL_shared", c.Name(victim))
	for i := range 6 {
		hiIDs = append(hiIDs, submitReq(t, urgent, req(fmt.Sprintf("hi-%d", i), 1)))
	}
	queuedHi := time.Now()
	awaitJobs(t, urgent, hiIDs, 2*time.Minute)
	awaitJobs(t, low, lowIDs, 2*time.Minute)
	// (The killed server stays down while the histories are read: a
	// replica that catches up may answer a direct get with an older last
	// version.)
	defer c.Restart(victim)

	type run struct {
		id       string
		start    time.Time
		attempts int
	}
	var runs []run
	for _, set := range []struct {
		cl  *client.Client
		ids []string
	}{{low, lowIDs}, {urgent, hiIDs}} {
		for _, id := range set.ids {
			r, err := set.cl.Result(ctx, id)
			if err != nil || r.StartedAt == nil {
				t.Fatalf("result of %s: %+v %v", id, r, err)
			}
			runs = append(runs, run{id, *r.StartedAt, r.Attempts})
			// A history read from a replica still catching up may not hold
			// the final version yet: read it again until it does.
			finals := 0
			for try := 0; finals == 0 && try < 50; try++ {
				if try > 0 {
					time.Sleep(200 * time.Millisecond)
				}
				h, err := set.cl.History(ctx, id)
				if err != nil {
					t.Fatal(err)
				}
				finals = 0
				for _, rec := range h.Records {
					if rec.State.Final() {
						finals++
					}
				}
			}
			if finals != 1 {
				t.Errorf("%s has %d final versions", id, finals)
			}
		}
	}
	sort.Slice(runs, func(i, j int) bool { return runs[i].start.Before(runs[j].start) })
	// Jobs start again within two heartbeat intervals of the kill.
	var firstAfter time.Time
	for _, r := range runs {
		if r.start.After(killed) {
			firstAfter = r.start
			break
		}
	}
	if gap := firstAfter.Sub(killed); firstAfter.IsZero() || gap > 2*heartbeat {
		t.Errorf("the first start after the kill came %s after it (bound: two heartbeat intervals, %s)", gap, 2*heartbeat)
	}
	// Once urgent's jobs are queued, low's start only as urgent's have all
	// started (a slot's pull in flight may still bring one of low's each).
	var lastHi time.Time
	for _, r := range runs {
		if r.id[:2] == "hi" {
			lastHi = r.start
		}
	}
	overtook := 0
	for _, r := range runs {
		if r.id[:3] == "low" && r.start.After(queuedHi) && r.start.Before(lastHi) {
			overtook++
		}
	}
	t.Logf("the first start after the kill: %s; urgent's last start %s after they were queued; low's that started between: %d",
		firstAfter.Sub(killed).Round(time.Millisecond), lastHi.Sub(queuedHi).Round(time.Millisecond), overtook)
	if overtook > 4 {
		t.Errorf("%d of low's priority-5 jobs started after urgent's priority-1 jobs were queued, before they had all started", overtook)
	}
	// The queues are the consumers the docs name.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	qs, err := queue.Queues(ctx, js, queue.Config{}, "shared")
	if err != nil || qs[queue.QueueKey{Priority: 5, Tenant: "low"}] == nil || qs[queue.QueueKey{Priority: 1, Tenant: "urgent"}] == nil {
		t.Errorf("the pool's queues: %v %v", qs, err)
	}
	requireHistory(t, nc, "low", "shared", "", lowIDs, lowEar)
	requireHistory(t, nc, "urgent", "shared", "", hiIDs, hiEar)
}

// submitReq submits r, looking it up when the answer was lost (see
// submitJobs), and returns its id.
func submitReq(t *testing.T, c *client.Client, r *job.Request) string {
	t.Helper()
	deadline := time.Now().Add(45 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := c.Submit(ctx, r)
		cancel()
		if err == nil {
			return r.ID
		}
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, serr := c.Status(sctx, r.ID)
		scancel()
		if serr == nil {
			t.Logf("submit %s: %v; the fleet has it", r.ID, err)
			return r.ID
		}
		if time.Now().After(deadline) {
			t.Fatalf("submit %s: %v", r.ID, err)
		}
		t.Logf("submit %s: %v; again", r.ID, err)
	}
}
