package runs_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/historytest"
	"github.com/fleet-dev/fleet/internal/natstest"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// layered is a run of depth layers of width nodes after one root, each
// node of a layer after two of the layer before, and one node after the
// last layer: each node sleeps, then writes its id. A lost attempt is
// tried again, however often its worker dies.
func layered(id string, width, depth int, sleep string) *job.RunRequest {
	lost := 20
	node := func(name string, after ...string) job.RunNode {
		n := sh(name, "sleep "+sleep+"; echo "+name+" > $FLEET_OUTPUTS/out", after...)
		n.Job.Outputs = []string{"out"}
		n.Job.Timeout = dur(time.Minute)
		n.Job.Retry = &job.RetryPolicy{MaxAttempts: 20, MaxLost: &lost, InitialBackoff: dur(50 * time.Millisecond)}
		return n
	}
	r := &job.RunRequest{ID: id, Nodes: []job.RunNode{node("root")}}
	prev := []string{"root"}
	for d := range depth {
		var layer []string
		for w := range width {
			name := fmt.Sprintf("n%d-%d", d, w)
			after := []string{prev[w%len(prev)], prev[(w+1)%len(prev)]}
			if after[0] == after[1] {
				after = after[:1]
			}
			r.Nodes = append(r.Nodes, node(name, after...))
			layer = append(layer, name)
		}
		prev = layer
	}
	r.Nodes = append(r.Nodes, node("join", prev...))
	return r
}

// submitRun submits r until a dispatcher answers: one may be down.
func submitRun(t *testing.T, c *client.Client, r *job.RunRequest) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		reply, err := c.SubmitRun(ctx, r)
		cancel()
		if err == nil {
			if reply.State.Final() || reply.Nodes != len(r.Nodes) {
				t.Fatalf("submit run %s: %+v", r.ID, reply)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("submit run %s: %v", r.ID, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// awaitRun asks for the run's view until it has ended, and returns it.
// The fleet is asked, not listened to: a dispatcher or a server may be
// down when the end is said.
func awaitRun(t *testing.T, c *client.Client, id string, within time.Duration, while func()) *job.RunView {
	t.Helper()
	deadline := time.Now().Add(within)
	var last *job.RunView
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		v, err := c.Run(ctx, id)
		cancel()
		if err == nil {
			if v.State.Final() {
				return v
			}
			last = v
		}
		if while != nil {
			while()
		} else {
			time.Sleep(250 * time.Millisecond)
		}
	}
	t.Fatalf("run %s has not ended after %s: %+v", id, within, last)
	return nil
}

// ended counts the nodes of v that have ended.
func ended(v *job.RunView) int {
	n := 0
	for _, s := range v.Nodes {
		if s.State.Final() {
			n++
		}
	}
	return n
}

// A run through its processes' deaths: two dispatchers and two process
// workers, one of them SIGKILLed and started again every second in turn
// while a run of 1 + 6×6 + 1 nodes goes through. The run succeeds, every
// node's job ended once, each queued only after the nodes it comes after
// ended (historytest.CheckRun), whatever the releaser, the workers or the
// dispatchers were doing when they died.
func TestARunThroughKilledDispatchersAndWorkers(t *testing.T) {
	srv := natstest.Run(t)
	env := []string{"FLEET_NATS_URL=" + srv.URL(), "FLEET_REDIS_URL=", "FLEET_DATA_DIR=" + t.TempDir(), "FLEET_HTTP_ADDR=127.0.0.1:0"}
	dispatcher := func() *fleettest.Proc {
		p := fleettest.StartProc(t, "dispatcher", env)
		p.WaitOutput(t, "dispatcher ready", 30*time.Second)
		return p
	}
	worker := func(i int) *fleettest.Proc {
		p := fleettest.StartProc(t, "worker", env, "--id", fmt.Sprintf("w-%d", i), "--slots", "4",
			"--ack-wait", "2s", "--grace", "100ms")
		p.WaitOutput(t, "worker started", 30*time.Second)
		return p
	}
	procs := []*fleettest.Proc{dispatcher(), dispatcher(), worker(0), worker(1)}
	restart := []func() *fleettest.Proc{dispatcher, dispatcher, func() *fleettest.Proc { return worker(0) }, func() *fleettest.Proc { return worker(1) }}
	nc := srv.Connect(t)
	c, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	r := layered("through-kills", 6, 6, "0.3")
	submitRun(t, c, r)

	kills := 0
	v := awaitRun(t, c, r.ID, 4*time.Minute, func() {
		time.Sleep(time.Second)
		i := kills % len(procs)
		procs[i].Kill()
		kills++
		time.Sleep(200 * time.Millisecond)
		procs[i] = restart[i]()
	})
	t.Logf("run ended %s after %d kills, %d nodes", v.State, kills, len(v.Nodes))
	if kills < 4 {
		t.Errorf("only %d kills while the run went: each process should have died once", kills)
	}
	if v.State != job.RunSucceeded || ended(v) != len(r.Nodes) {
		t.Fatalf("run ended %s with %d of %d nodes ended: %+v", v.State, ended(v), len(r.Nodes), v.Nodes)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	historytest.RequireRun(t, js, queue.Names{}, job.DefaultTenant, r.ID)
}

// A run through a NATS server's death on a three-node cluster: streams of
// three replicas, two dispatchers, two process workers; when a third of
// the run's nodes have ended, the server leading FLEET_RUNS (where the
// run's definition and its nodes' ends are kept, and the releaser's
// consumer) is SIGKILLed. The run succeeds, and its history holds.
func TestARunThroughAKilledNATSServer(t *testing.T) {
	c, env := fleettest.ClusterFleet(t)
	for i := range 2 {
		fleettest.StartProc(t, "worker", env, "--id", fmt.Sprintf("w-%d", i), "--slots", "4",
			"--heartbeat-interval", "10s").
			WaitOutput(t, "worker started", 30*time.Second)
	}
	nc := c.Connect(t)
	cl, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	r := layered("through-a-server", 6, 6, "0.2")
	submitRun(t, cl, r)
	killed := -1
	v := awaitRun(t, cl, r.ID, 4*time.Minute, func() {
		time.Sleep(250 * time.Millisecond)
		if killed >= 0 {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		v, err := cl.Run(ctx, r.ID)
		cancel()
		if err != nil || ended(v) < len(r.Nodes)/3 {
			return
		}
		killed = c.WaitStreamLeader(t, queue.Names{}.RunsStream(), 10*time.Second)
		c.Kill(killed)
		t.Logf("killed %s, the leader of %s, with %d of %d nodes ended", c.Name(killed), queue.Names{}.RunsStream(), ended(v), len(r.Nodes))
	})
	if killed < 0 {
		t.Fatal("the run ended before a server was killed")
	}
	if v.State != job.RunSucceeded || ended(v) != len(r.Nodes) {
		t.Fatalf("run ended %s with %d of %d nodes ended: %+v", v.State, ended(v), len(r.Nodes), v.Nodes)
	}
	// The killed server stays down while the history is read: a replica
	// catching up may answer a direct get with an older last version.
	defer c.Restart(killed)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	historytest.RequireRun(t, js, queue.Names{}, job.DefaultTenant, r.ID)
}

func dur(d time.Duration) *job.Duration { x := job.Duration(d); return &x }
