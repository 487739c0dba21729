package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/natstest"
	"github.com/fleet-dev/fleet/job"
)

// clusterJob is a job that sleeps for sleep, then writes its id to an output.
func clusterJob(id, sleep string) *job.Request {
	return &job.Request{ID: id, Outputs: []string{"out"}, Timeout: dur(time.Minute),
		Command: []string{"sh", "-c", "sleep " + sleep + "; echo $FLEET_JOB_ID > $FLEET_OUTPUTS/out"}}
}

// submitJobs submits n jobs and returns their ids. A submission that gets
// no answer (see "On a NATS cluster" in README.md) is looked up by its id,
// and sent again if the fleet does not know it: the id makes it run once.
func submitJobs(t *testing.T, c *client.Client, prefix string, n int, sleep string) []string {
	t.Helper()
	deadline := time.Now().Add(45 * time.Second)
	var ids []string
	for i := range n {
		r := clusterJob(fmt.Sprintf("%s-%d", prefix, i), sleep)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := c.Submit(ctx, r)
			cancel()
			if err == nil {
				break
			}
			sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, serr := c.Status(sctx, r.ID)
			scancel()
			if serr == nil {
				t.Logf("submit %s: %v; the fleet has it", r.ID, err)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("submit %s: %v", r.ID, err)
			}
			t.Logf("submit %s: %v; again", r.ID, err)
		}
		ids = append(ids, r.ID)
	}
	return ids
}

// awaitJobs waits for each job to succeed with its own output, once.
func awaitJobs(t *testing.T, c *client.Client, ids []string, within time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := c.Result(ctx, id)
			if err != nil {
				t.Errorf("result of %s: %v", id, err)
				return
			}
			if r.Status != job.StatusSucceeded || r.Outputs["out"] != id+"\n" {
				t.Errorf("%s: %s %q", id, r.Status, r.Outputs["out"])
			}
		}()
	}
	wg.Wait()
}

// The fleet as a user runs it on a three-node cluster. Process workers
// started first, while the cluster still elects its leaders and before any
// dispatcher, wait and say so; two dispatchers started at the same instant
// with --replicas 3 both become ready, quickly; jobs run. The node leading
// the jobs stream is killed while jobs run: they finish, no process exits,
// and new jobs run.
func TestFleetOnAFreshClusterStartsInAnyOrder(t *testing.T) {
	fleettest.Binary(t, "worker") // built before the cluster starts, so the workers meet its election
	c := natstest.RunCluster(t, 3)
	env := []string{"FLEET_NATS_URL=" + c.URLs(), "FLEET_REDIS_URL=", "FLEET_DATA_DIR=" + t.TempDir()}
	var workers []*fleettest.Proc
	for i := range 3 {
		workers = append(workers, fleettest.StartProc(t, "worker", env, "--id", fmt.Sprintf("cw-%d", i), "--slots", "4", "--ack-wait", "5s"))
	}
	for _, w := range workers {
		w.WaitOutput(t, "waiting for JetStream", 20*time.Second)
	}
	// Nobody has created anything: the workers keep waiting.
	time.Sleep(2 * time.Second)
	for _, w := range workers {
		if w.Wait(0) || strings.Contains(w.Output(), "worker started") {
			t.Fatalf("a worker did not wait for a dispatcher:\n%s", w.Output())
		}
	}

	denv := append(env, "FLEET_HTTP_ADDR=127.0.0.1:0")
	began := time.Now()
	ds := []*fleettest.Proc{
		fleettest.StartProc(t, "dispatcher", denv, "--replicas", "3"),
		fleettest.StartProc(t, "dispatcher", denv, "--replicas", "3"),
	}
	for _, d := range ds {
		d.WaitOutput(t, "dispatcher ready", 30*time.Second)
	}
	ready := time.Since(began)
	t.Logf("both dispatchers ready %s after they started", ready.Round(time.Millisecond))
	if ready > 15*time.Second {
		t.Errorf("the dispatchers took %s to start on a fresh cluster", ready)
	}
	for _, w := range workers {
		w.WaitOutput(t, "worker started", 30*time.Second)
	}

	nc := c.Connect(t)
	cl, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	awaitJobs(t, cl, submitJobs(t, cl, "fresh", 20, "0"), time.Minute)

	// Jobs running while the node that leads the jobs stream dies: their
	// acks, progress, events and results ride through the election.
	running := submitJobs(t, cl, "through-kill", 20, "2")
	victim := c.WaitStreamLeader(t, "FLEET_JOBS", 10*time.Second)
	t.Logf("killing %s (meta leader %d)", c.Name(victim), c.MetaLeader())
	c.Kill(victim)
	awaitJobs(t, cl, running, 2*time.Minute)
	c.WaitReady(t, 30*time.Second)
	awaitJobs(t, cl, submitJobs(t, cl, "after-kill", 10, "0"), time.Minute)
	c.Restart(victim)
	c.WaitReady(t, 30*time.Second)
	for _, p := range append(ds, workers...) {
		if p.Wait(0) {
			t.Fatalf("a process exited when a NATS node died:\n%s", p.Output())
		}
	}
}

// The node that leads the dispatchers' consumer of the submit stream dies,
// with the pull requests the dispatchers left there. Submissions the stream
// takes after it (core publishes with ids, as a fire-and-forget producer
// sends them) run within seconds, and no process exits.
func TestDispatchersResumeWhenTheirConsumerLeaderDies(t *testing.T) {
	fleettest.Binary(t, "worker")
	c := natstest.RunCluster(t, 3)
	c.WaitReady(t, 30*time.Second)
	env := []string{"FLEET_NATS_URL=" + c.URLs(), "FLEET_REDIS_URL=", "FLEET_DATA_DIR=" + t.TempDir(),
		"FLEET_HTTP_ADDR=127.0.0.1:0"}
	ds := []*fleettest.Proc{
		fleettest.StartProc(t, "dispatcher", env, "--replicas", "3"),
		fleettest.StartProc(t, "dispatcher", env, "--replicas", "3"),
	}
	for _, d := range ds {
		d.WaitOutput(t, "dispatcher ready", 30*time.Second)
	}
	w := fleettest.StartProc(t, "worker", env, "--id", "cw", "--slots", "4")
	w.WaitOutput(t, "worker started", 30*time.Second)

	victim := c.ConsumerLeader("FLEET_SUBMIT", "dispatcher")
	if victim < 0 {
		t.Fatal("the dispatchers' consumer has no leader")
	}
	t.Logf("killing %s, leader of the dispatchers' consumer", c.Name(victim))
	c.Kill(victim)
	killed := time.Now()
	c.WaitReady(t, 30*time.Second)
	// Until the submit stream has a leader, what is published to it is
	// not stored; until then its info is not answered either.
	c.WaitStreamLeader(t, "FLEET_SUBMIT", 30*time.Second)

	nc := c.Connect(t)
	cl, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lastSeq := func() uint64 {
		t.Helper()
		for {
			// Each request with a deadline of its own: one sent in an
			// election is dropped, not answered.
			rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
			s, err := js.Stream(rctx, "FLEET_SUBMIT")
			rcancel()
			if err == nil {
				return s.CachedInfo().State.LastSeq
			}
			if ctx.Err() != nil {
				t.Fatalf("stream info: %v", err)
			}
		}
	}
	before := lastSeq()
	var ids []string
	for i := range 5 {
		r := clusterJob(fmt.Sprintf("after-intake-kill-%d", i), "0")
		body, _ := json.Marshal(r)
		if err := nc.Publish("fleet.submit", body); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.ID)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// Stored: otherwise, not the dispatchers' doing (see README.md on
	// submitting while the submit stream elects a leader).
	for stored := uint64(0); stored < 5; stored = lastSeq() - before {
		if ctx.Err() != nil {
			t.Fatalf("the submit stream took %d of 5 submissions", stored)
		}
		time.Sleep(100 * time.Millisecond)
	}
	awaitJobs(t, cl, ids, time.Minute)
	took := time.Since(killed)
	t.Logf("submissions ran %s after the consumer's leader died", took.Round(time.Millisecond))
	if took > 20*time.Second {
		t.Errorf("submissions ran %s after the consumer's leader died", took.Round(time.Millisecond))
	}
	for _, p := range append(ds, w) {
		if p.Wait(0) {
			t.Fatalf("a process exited when a NATS node died:\n%s", p.Output())
		}
	}
}
