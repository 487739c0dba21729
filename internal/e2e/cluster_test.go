package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/natstest"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// clusterJob is a job that sleeps for sleep, then writes its id to an output.
func clusterJob(id, sleep string) *job.Request {
	return &job.Request{ID: id, Outputs: []string{"out"}, Timeout: dur(time.Minute),
		Command: []string{"sh", "-c", "sleep " + sleep + "; echo $FLEET_JOB_ID > $FLEET_OUTPUTS/out"}}
}

// submitJobs submits n jobs and returns their ids. A submission that gets
// no answer (see "On a NATS cluster" in docs/running.md) is looked up by its id,
// and sent again if the fleet does not know it: the id makes it run once.
func submitJobs(t *testing.T, c *client.Client, prefix string, n int, sleep string) []string {
	t.Helper()
	var ids []string
	for i := range n {
		ids = append(ids, submitReq(t, c, clusterJob(fmt.Sprintf("%s-%d", prefix, i), sleep)))
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
// new jobs run, and every job ends once (historytest).
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
	ear := listen(t, nc, job.DefaultTenant, "default")
	fresh := submitJobs(t, cl, "fresh", 20, "0")
	awaitJobs(t, cl, fresh, time.Minute)

	// Jobs running while the node that leads the jobs stream dies: their
	// acks, progress, events and results ride through the election.
	running := submitJobs(t, cl, "through-kill", 20, "2")
	victim := c.WaitStreamLeader(t, "FLEET_POOL_default", 10*time.Second)
	t.Logf("killing %s (meta leader %d)", c.Name(victim), c.MetaLeader())
	c.Kill(victim)
	awaitJobs(t, cl, running, 2*time.Minute)
	c.WaitReady(t, 30*time.Second)
	after := submitJobs(t, cl, "after-kill", 10, "0")
	awaitJobs(t, cl, after, time.Minute)
	c.Restart(victim)
	c.WaitReady(t, 30*time.Second)
	for _, p := range append(ds, workers...) {
		if p.Wait(0) {
			t.Fatalf("a process exited when a NATS node died:\n%s", p.Output())
		}
	}
	requireHistory(t, nc, job.DefaultTenant, "default", "", slices.Concat(fresh, running, after), ear)
}

// The node that leads the dispatchers' consumer of the intake stream dies,
// with the pull requests the dispatchers left there. Submissions the stream
// takes after it (JetStream publishes with ids, sent again until stored,
// as a producer that keeps no connection to a dispatcher sends them) run,
// each once (historytest), and no process exits. How soon is a failover
// target (fleettest.Target, make bench-failover): within 20 s of the death,
// the elections of the consumer and of the streams the node led included.
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

	victim := c.ConsumerLeader("FLEET_INTAKE", "dispatcher")
	if victim < 0 {
		t.Fatal("the dispatchers' consumer has no leader")
	}
	t.Logf("killing %s, leader of the dispatchers' consumer", c.Name(victim))
	c.Kill(victim)
	killed := time.Now()
	c.WaitReady(t, 30*time.Second)

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
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Stored: the stream's own election is NATS's, not the dispatchers'
	// (see docs/running.md on submitting while the intake stream elects a
	// leader), so each is sent again with its id until it is.
	var ids []string
	for i := range 5 {
		r := clusterJob(fmt.Sprintf("after-intake-kill-%d", i), "0")
		m := nats.NewMsg("fleet.t.default.intake")
		m.Data, _ = json.Marshal(r)
		m.Header.Set(nats.MsgIdHdr, r.ID)
		if _, err := queue.Publish(ctx, js, m); err != nil {
			t.Fatalf("publish %s: %v", r.ID, err)
		}
		ids = append(ids, r.ID)
	}
	awaitJobs(t, cl, ids, time.Minute)
	took := time.Since(killed)
	t.Logf("submissions ran %s after the consumer's leader died", took.Round(time.Millisecond))
	fleettest.Target(t, took <= 20*time.Second, "submissions ran %s after the consumer's leader died, over 20 s", took.Round(time.Millisecond))
	for _, p := range append(ds, w) {
		if p.Wait(0) {
			t.Fatalf("a process exited when a NATS node died:\n%s", p.Output())
		}
	}
	requireHistory(t, nc, job.DefaultTenant, "default", "", ids, ear)
}

// TestEachPoolHasItsOwnStream gives three pools jobs on a three-node
// cluster: each pool's jobs are in a stream of their own, replicated on the
// three servers, and the dispatchers spread their leaders over the servers,
// also after every leader was moved to one.
func TestEachPoolHasItsOwnStream(t *testing.T) {
	c, env := fleettest.ClusterFleet(t)
	pools := []string{"red", "green", "blue"}
	for _, p := range pools {
		fleettest.StartProc(t, "worker", env, "--id", "w-"+p, "--pool", p, "--slots", "2").WaitOutput(t, "worker started", 30*time.Second)
	}
	nc := c.Connect(t)
	cl, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, p := range pools {
		r := clusterJob("in-"+p, "0")
		r.Pool = p
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if _, err := cl.Submit(ctx, r); err != nil {
			t.Fatal(err)
		}
		cancel()
		ids = append(ids, r.ID)
	}
	awaitJobs(t, cl, ids, time.Minute)

	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	leaders := map[string]string{}
	for _, p := range pools {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		st, err := js.Stream(ctx, "FLEET_POOL_"+p)
		cancel()
		if err != nil {
			t.Fatalf("pool %s: %v", p, err)
		}
		info := st.CachedInfo()
		if got := info.Config.Subjects; len(got) != 1 || got[0] != "fleet.p."+p+".>" {
			t.Errorf("FLEET_POOL_%s captures %v, want only fleet.p.%s.>", p, got, p)
		}
		if info.Config.Replicas != 3 || info.Cluster == nil || info.Cluster.Leader == "" || len(info.Cluster.Replicas) != 2 {
			t.Errorf("FLEET_POOL_%s: %d replicas, cluster %+v; want three servers, one leading", p, info.Config.Replicas, info.Cluster)
		} else {
			leaders[p] = info.Cluster.Leader
		}
		if info.Config.Retention != jetstream.LimitsPolicy || info.Config.RePublish == nil {
			t.Errorf("FLEET_POOL_%s retention %v, republish %+v; want limits, republished", p, info.Config.Retention, info.Config.RePublish)
		}
	}
	t.Logf("leaders: %v", leaders)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, v1 := range []string{"FLEET_JOBS", "FLEET_JOBS_" + pools[0], "FLEET_RESULTS", "KV_fleet-jobs"} {
		if _, err := js.Stream(ctx, v1); !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Errorf("the v1 stream %s: %v, want none on a fleet without v1", v1, err)
		}
	}

	// The dispatchers spread the pools' leaders, one server each.
	spread := func(within time.Duration) {
		t.Helper()
		deadline := time.Now().Add(within)
		for {
			leaders := map[int]string{}
			for _, p := range pools {
				leaders[c.StreamLeader("FLEET_POOL_"+p)] = p
			}
			if len(leaders) == 3 && leaders[-1] == "" {
				t.Logf("pools led by %v", leaders)
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the pools' jobs streams are led by %v (server: pool), not by three servers", leaders)
			}
			time.Sleep(time.Second)
		}
	}
	spread(time.Minute)

	// Move every pool's leader to one server, as a cluster may end up after
	// restarts: the dispatchers spread them again.
	for _, p := range pools {
		stream := "FLEET_POOL_" + p
		deadline := time.Now().Add(time.Minute)
		for c.StreamLeader(stream) != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: its leader did not move to %s", stream, c.Name(0))
			}
			req, _ := json.Marshal(map[string]any{"placement": map[string]string{"preferred": c.Name(0)}})
			_, _ = nc.Request("$JS.API.STREAM.LEADER.STEPDOWN."+stream, req, 5*time.Second)
			time.Sleep(time.Second)
		}
	}
	t.Logf("every pool led by %s", c.Name(0))
	spread(time.Minute)
}

// TestPauseOnACluster pauses a pool of a fleet on a three-node cluster (two
// dispatchers, worker processes) and SIGKILLs the server leading the pools
// bucket while the pool is paused: the pause holds through the election,
// the pool's jobs wait while another pool's run, and after the resume (and
// the server's restart) they all run once (historytest, in each pool). A
// job with not_before starts after it there too.
func TestPauseOnACluster(t *testing.T) {
	c, env := fleettest.ClusterFleet(t)
	var heldWorkers []*fleettest.Proc
	for _, p := range []string{"held", "free"} {
		for i := range 2 {
			w := fleettest.StartProc(t, "worker", env, "--id", fmt.Sprintf("w-%s-%d", p, i), "--pool", p, "--slots", "2")
			w.WaitOutput(t, "worker started", 30*time.Second)
			if p == "held" {
				heldWorkers = append(heldWorkers, w)
			}
		}
	}
	nc := c.Connect(t)
	cl, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	heldEar, freeEar := listen(t, nc, job.DefaultTenant, "held"), listen(t, nc, job.DefaultTenant, "free")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := cl.PausePool(ctx, "held", "cluster test"); err != nil {
		t.Fatal(err)
	}
	for _, w := range heldWorkers { // each reads it within a second
		w.WaitOutput(t, "pool paused", 10*time.Second)
	}

	leader := c.WaitStreamLeader(t, "KV_fleet-pools", 30*time.Second)
	c.Kill(leader)
	var held, free []string
	for i := range 4 {
		r := clusterJob(fmt.Sprintf("held-%d", i), "0")
		r.Pool = "held"
		s, err := cl.Submit(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, s.JobID)
		r = clusterJob(fmt.Sprintf("free-%d", i), "0")
		r.Pool = "free"
		if s, err = cl.Submit(ctx, r); err != nil {
			t.Fatal(err)
		}
		free = append(free, s.JobID)
	}
	awaitJobs(t, cl, free, time.Minute)
	time.Sleep(3 * time.Second)
	for _, id := range held {
		st, err := cl.Status(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if st.Job.State != job.StateQueued {
			t.Fatalf("%s is %s while its pool is paused (the pools bucket's leader was killed)", id, st.Job.State)
		}
	}
	c.Restart(leader)
	if s, err := cl.ResumePool(ctx, "held"); err != nil || s.Paused {
		t.Fatalf("resume: %+v, %v", s, err)
	}
	at := time.Now().Add(3 * time.Second)
	r := clusterJob("held-later", "0")
	r.Pool, r.NotBefore = "held", &at
	if _, err := cl.Submit(ctx, r); err != nil {
		t.Fatal(err)
	}
	awaitJobs(t, cl, append(held, "held-later"), time.Minute)
	res, err := cl.Result(ctx, "held-later")
	if err != nil {
		t.Fatal(err)
	}
	if res.StartedAt == nil || res.StartedAt.Before(at) {
		t.Errorf("the not_before job started at %v, before %s", res.StartedAt, at)
	}
	requireHistory(t, nc, job.DefaultTenant, "held", "", append(held, "held-later"), heldEar)
	requireHistory(t, nc, job.DefaultTenant, "free", "", free, freeEar)
}
