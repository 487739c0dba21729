package failover

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/historytest"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// TestAPoolsQueueLivesWithItsStream holds a pool's queue to where
// queue.Placed puts it on a three-node cluster: led by the server that
// leads the pool's stream, with the stream's replicas. When the stream's
// leadership moves (as the balancer or an election moves it), the queue's
// follows. When that server dies for good, the stream and the queue each
// elect a leader among the others, the placer brings them together again,
// and the jobs queued meanwhile run, once each: what losing a server for
// good costs a pool.
func TestAPoolsQueueLivesWithItsStream(t *testing.T) {
	c, env := fleettest.ClusterFleet(t)
	w := fleettest.StartProc(t, "worker", env, "--id", "pw", "--executor", "noop", "--slots", "8")
	w.WaitOutput(t, "worker started", 30*time.Second)
	nc := c.Connect(t)
	cl, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ear := historytest.Listen(t, nc, queue.Names{}, job.DefaultTenant, "default")
	var ids []string
	run := func(prefix string, n int) {
		t.Helper()
		for i := range n {
			id := fmt.Sprintf("%s-%d", prefix, i)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			if _, err := cl.Submit(ctx, &job.Request{ID: id, Command: []string{"true"}}); err != nil {
				t.Fatalf("submit %s: %v", id, err)
			}
			cancel()
			ids = append(ids, id)
		}
	}
	run("first", 5)
	awaitAll(t, cl, ids, time.Minute)

	const stream, name = "FLEET_POOL_default", "q3-default"
	where := func() (leader, queueAt string, queueReplicas int) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if st, err := js.Stream(ctx, stream); err == nil && st.CachedInfo().Cluster != nil {
			leader = st.CachedInfo().Cluster.Leader
		}
		if cons, err := js.Consumer(ctx, stream, name); err == nil && cons.CachedInfo().Cluster != nil {
			queueAt, queueReplicas = cons.CachedInfo().Cluster.Leader, len(cons.CachedInfo().Cluster.Replicas)+1
		}
		return
	}
	placed := func(within time.Duration, why string) string {
		t.Helper()
		deadline := time.Now().Add(within)
		for {
			leader, at, n := where()
			if leader != "" && leader == at && n == 3 {
				return leader
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the stream led by %q, its queue by %q with %d replicas, after %s", why, leader, at, n, within)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	home := placed(20*time.Second, "made")
	t.Logf("the stream and its queue led by %s", home)

	// The stream's leadership moved away by hand: the queue's follows.
	other := c.Name((c.Index(home) + 1) % 3)
	req, _ := json.Marshal(map[string]any{"placement": map[string]string{"preferred": other}})
	if _, err := nc.Request("$JS.API.STREAM.LEADER.STEPDOWN."+stream, req, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	moved := time.Now()
	there := placed(15*time.Second, "after the stream's leadership moved")
	t.Logf("the queue led by %s %s after the stream's leadership moved there", there, time.Since(moved).Round(time.Millisecond))
	run("after-move", 5)

	// Their server dies for good.
	c.Kill(c.Index(there))
	killed := time.Now()
	run("after-loss", 5)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := cl.Result(ctx, "after-loss-0")
	if err != nil {
		t.Fatalf("a job queued after the queue's server died: %v", err)
	}
	took := res.FinishedAt.Sub(killed)
	t.Logf("the first job queued after the server died ran %s after its death", took.Round(time.Millisecond))
	// Two elections of at most 9 s each, at once, and the fleet's second.
	fleettest.Target(t, took <= 12*time.Second, "a job waited %s after the queue's server died, over 12 s", took)
	placed(15*time.Second, "after their server died")
	awaitAll(t, cl, ids, time.Minute)
	c.Restart(c.Index(there))
	c.WaitReady(t, 30*time.Second)
	historytest.Require(t, js, queue.Names{}, job.DefaultTenant, "default", "", ids, ear)
}

// awaitAll waits for each job to succeed.
func awaitAll(t *testing.T, cl *client.Client, ids []string, within time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	for _, id := range ids {
		r, err := cl.Result(ctx, id)
		if err != nil {
			t.Fatalf("result of %s: %v", id, err)
		}
		if r.Status != job.StatusSucceeded {
			t.Fatalf("%s: %s %+v", id, r.Status, r.Failure)
		}
	}
}
