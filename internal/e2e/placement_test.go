package e2e

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
// queue.Placed puts it on a three-node cluster: one replica, on the server
// that leads the pool's stream. When the stream's leadership moves away
// (as an election moves it), it goes back to the queue's server. When that
// server dies for good, the stream elects a leader among the others, the
// pool's workers make the queue again there after queue.LostAfter, and the
// jobs queued meanwhile run, once each: what losing a server for good
// costs a pool.
func TestAPoolsQueueLivesWithItsStream(t *testing.T) {
	c, env := clusterWithDispatchers(t)
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
	where := func() (leader string, replicas int, queueAt string, queueReplicas int) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if st, err := js.Stream(ctx, stream); err == nil && st.CachedInfo().Cluster != nil {
			leader, replicas = st.CachedInfo().Cluster.Leader, st.CachedInfo().Config.Replicas
		}
		if cons, err := js.Consumer(ctx, stream, name); err == nil && cons.CachedInfo().Cluster != nil {
			queueAt, queueReplicas = cons.CachedInfo().Cluster.Leader, cons.CachedInfo().Config.Replicas
		}
		return
	}
	placed := func(within time.Duration, why string) string {
		t.Helper()
		deadline := time.Now().Add(within)
		for {
			leader, replicas, at, n := where()
			if leader != "" && leader == at && n == 1 && replicas == 3 {
				return leader
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the stream led by %q (%d replicas), its queue by %q with %d replicas, after %s", why, leader, replicas, at, n, within)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	home := placed(20*time.Second, "made")
	t.Logf("the stream and its queue on %s", home)

	// Its leadership moved away by hand, as an election may: it goes back.
	other := c.Name((c.Index(home) + 1) % 3)
	req, _ := json.Marshal(map[string]any{"placement": map[string]string{"preferred": other}})
	if _, err := nc.Request("$JS.API.STREAM.LEADER.STEPDOWN."+stream, req, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	moved := time.Now()
	if back := placed(15*time.Second, "after its leadership moved"); back != home {
		t.Errorf("the queue moved to %s, the stream was to come back to %s", back, home)
	}
	t.Logf("the stream's leadership back with its queue on %s %s after it moved to %s", home, time.Since(moved).Round(time.Millisecond), other)
	run("after-move", 5)

	// The queue's server dies for good.
	c.Kill(c.Index(home))
	killed := time.Now()
	run("after-loss", 5)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := cl.Result(ctx, "after-loss-0")
	if err != nil {
		t.Fatalf("a job queued after the queue's server died: %v", err)
	}
	took := res.FinishedAt.Sub(killed)
	t.Logf("the first job queued after the queue's server died ran %s after its death (queue.LostAfter %s)", took.Round(time.Millisecond), queue.LostAfter)
	if took > queue.LostAfter+15*time.Second {
		t.Errorf("a job waited %s after the queue's server died, over queue.LostAfter and 15 s", took)
	}
	w.WaitOutput(t, "made a queue again whose consumer was lost with its server", 10*time.Second)
	awaitAll(t, cl, ids, time.Minute)
	c.Restart(c.Index(home))
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
