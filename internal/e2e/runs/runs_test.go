// Package runs_test runs runs on the real parts: a NATS server with
// JetStream, dispatchers, workers running real processes, and checks
// every node's history against its parents'.
package runs_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/internal/executor/noop"
	"github.com/fleet-dev/fleet/internal/executor/process"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/historytest"
	"github.com/fleet-dev/fleet/internal/worker"
	"github.com/fleet-dev/fleet/job"
)

// sh is a node whose job runs script in sh, after the nodes named.
func sh(id, script string, after ...string) job.RunNode {
	return job.RunNode{ID: id, After: after, Job: &job.Request{Command: []string{"sh", "-c", script}}}
}

// fleet starts a fleet with a process worker of slots slots.
func fleet(t *testing.T, slots int) *fleettest.Fleet {
	t.Helper()
	f := fleettest.Start(t)
	e, err := process.New(process.Config{Dir: t.TempDir(), Grace: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	f.Worker(t, e, worker.Config{Slots: slots, RunningAfter: 20 * time.Millisecond})
	return f
}

// finish submits r and waits for its end.
func finish(t *testing.T, c *client.Client, r *job.RunRequest, within time.Duration) *job.RunEnd {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	reply, err := c.SubmitRun(ctx, r)
	if err != nil {
		t.Fatalf("submit run %s: %v", r.ID, err)
	}
	if reply.Duplicate || reply.State != job.RunRunning || reply.Nodes != len(r.Nodes) {
		t.Fatalf("submit run %s: %+v", r.ID, reply)
	}
	end, err := c.RunResult(ctx, r.ID)
	if err != nil {
		t.Fatalf("run %s: %v", r.ID, err)
	}
	return end
}

// history fails t unless the run's history holds: every node one job,
// ended once, queued only after the nodes it comes after ended and only
// when its rule held (historytest.CheckRun).
func history(t *testing.T, f *fleettest.Fleet, run string) {
	t.Helper()
	js, err := jetstream.New(f.NC)
	if err != nil {
		t.Fatal(err)
	}
	historytest.RequireRun(t, js, f.Queue.Names, job.DefaultTenant, run)
}

// results reads every node's result, by node.
func results(t *testing.T, c *client.Client, end *job.RunEnd) map[string]*job.Result {
	t.Helper()
	out := map[string]*job.Result{}
	for _, n := range end.Nodes {
		if n.State == job.StateCancelled && n.Code != job.CodeCancelled {
			continue // never ran
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		r, err := c.Result(ctx, n.JobID)
		cancel()
		if err != nil {
			t.Fatalf("result of node %s (%s): %v", n.ID, n.JobID, err)
		}
		out[n.ID] = r
	}
	return out
}

// A diamond whose nodes pass outputs on: a writes a value, b and c each
// make it into theirs, d joins them. Every node runs once, after its
// parents ended, and the bytes arrive as they were written.
func TestADiamondPassesOutputsOn(t *testing.T) {
	f := fleet(t, 4)
	a := sh("a", `printf 'seed-42\n' > $FLEET_OUTPUTS/value.txt`)
	a.Job.Outputs = []string{"value.txt"}
	b := sh("b", `printf 'b:' > $FLEET_OUTPUTS/out.txt; cat $FLEET_INPUTS/in.txt >> $FLEET_OUTPUTS/out.txt`, "a")
	b.Job.Outputs, b.InputsFrom = []string{"out.txt"}, map[string]job.OutputOf{"in.txt": {Node: "a", Output: "value.txt"}}
	c := sh("c", `printf 'c:' > $FLEET_OUTPUTS/out.txt; cat $FLEET_INPUTS/in.txt >> $FLEET_OUTPUTS/out.txt`, "a")
	c.Job.Outputs, c.InputsFrom = []string{"out.txt"}, map[string]job.OutputOf{"in.txt": {Node: "a", Output: "value.txt"}}
	d := sh("d", `cat $FLEET_INPUTS/from-b $FLEET_INPUTS/from-c > $FLEET_OUTPUTS/joined.txt`, "b", "c")
	d.Job.Outputs = []string{"joined.txt"}
	d.InputsFrom = map[string]job.OutputOf{"from-b": {Node: "b", Output: "out.txt"}, "from-c": {Node: "c", Output: "out.txt"}}
	end := finish(t, f.Client, &job.RunRequest{ID: "diamond", Nodes: []job.RunNode{a, b, c, d}}, time.Minute)
	if end.State != job.RunSucceeded || end.Round != 1 {
		t.Fatalf("run ended %s in round %d: %+v", end.State, end.Round, end.Nodes)
	}
	rs := results(t, f.Client, end)
	if got := rs["d"].Outputs["joined.txt"]; got != "b:seed-42\nc:seed-42\n" {
		t.Errorf("d's output %q; want b's and c's, each with a's value", got)
	}
	for _, n := range end.Nodes {
		if n.JobID != job.RunJobID("diamond", n.ID, 1) {
			t.Errorf("node %s's job is %s", n.ID, n.JobID)
		}
	}
	after(t, rs, map[string][]string{"b": {"a"}, "c": {"a"}, "d": {"b", "c"}})
	history(t, f, "diamond")
}

// after fails t unless each node started after every parent finished.
func after(t *testing.T, rs map[string]*job.Result, parents map[string][]string) {
	t.Helper()
	for n, ps := range parents {
		r := rs[n]
		if r == nil || r.StartedAt == nil {
			t.Errorf("node %s has no start", n)
			continue
		}
		for _, p := range ps {
			if pr := rs[p]; pr == nil || !pr.FinishedAt.Before(*r.StartedAt) {
				t.Errorf("node %s started at %s, before its parent %s finished", n, r.StartedAt, p)
			}
		}
	}
}

// A chain of 50 nodes runs each after the one before it.
func TestAChainOfFifty(t *testing.T) {
	f := fleet(t, 4)
	var nodes []job.RunNode
	parents := map[string][]string{}
	for i := range 50 {
		n := sh(fmt.Sprintf("n%02d", i), "true")
		if i > 0 {
			n.After = []string{fmt.Sprintf("n%02d", i-1)}
			parents[n.ID] = n.After
		}
		nodes = append(nodes, n)
	}
	end := finish(t, f.Client, &job.RunRequest{ID: "chain", Nodes: nodes}, 2*time.Minute)
	if end.State != job.RunSucceeded {
		t.Fatalf("run ended %s", end.State)
	}
	after(t, results(t, f.Client, end), parents)
	history(t, f, "chain")
}

// A node that fails ends the nodes after it cancelled (upstream_failed)
// without running them; one that runs whatever (all_done) runs; a failure
// handler (any_failed) runs; the run fails.
func TestAFailureCancelsWhatComesAfterAndRunsItsHandlers(t *testing.T) {
	f := fleet(t, 4)
	report := sh("report", "true", "b")
	report.When = job.WhenAllDone
	handler := sh("handler", "true", "b")
	handler.When = job.WhenAnyFailed
	notNeeded := sh("not-needed", "true", "a")
	notNeeded.When = job.WhenAnyFailed
	r := &job.RunRequest{ID: "failing", Nodes: []job.RunNode{
		sh("a", "true"), sh("b", "exit 3", "a"), sh("c", "true", "b"), sh("d", "true", "c"), report, handler, notNeeded,
		sh("after-skip", "true", "not-needed"),
	}}
	end := finish(t, f.Client, r, time.Minute)
	want := map[string]string{
		"a": "succeeded", "b": "failed/exit_code", "c": "cancelled/upstream_failed", "d": "cancelled/upstream_failed",
		"report": "succeeded", "handler": "succeeded", "not-needed": "cancelled/not_triggered",
		"after-skip": "cancelled/not_triggered",
	}
	for _, n := range end.Nodes {
		got := string(n.State)
		if n.Code != "" {
			got += "/" + string(n.Code)
		}
		if got != want[n.ID] {
			t.Errorf("node %s ended %s; want %s", n.ID, got, want[n.ID])
		}
	}
	if end.State != job.RunFailed {
		t.Errorf("run ended %s; want failed", end.State)
	}
	history(t, f, "failing")
}

// A retry runs again what failed and what came after it, as new jobs of
// round 2; what succeeded keeps its job and outputs. Here b fails until a
// file says otherwise.
func TestARetryRunsAgainWhatFailed(t *testing.T) {
	f := fleet(t, 4)
	flag := t.TempDir() + "/ok"
	a := sh("a", `printf 'from-a' > $FLEET_OUTPUTS/v`)
	a.Job.Outputs = []string{"v"}
	b := sh("b", `test -e `+flag+` && cat $FLEET_INPUTS/v > $FLEET_OUTPUTS/v`, "a")
	b.Job.Outputs, b.InputsFrom = []string{"v"}, map[string]job.OutputOf{"v": {Node: "a", Output: "v"}}
	r := &job.RunRequest{ID: "retried", Nodes: []job.RunNode{a, b, sh("c", "true", "b")}}
	end := finish(t, f.Client, r, time.Minute)
	if end.State != job.RunFailed {
		t.Fatalf("first round ended %s; want failed", end.State)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if reply, err := f.Client.RetryRun(ctx, "retried"); err != nil || reply.Round != 2 || !slices.Equal(reply.Retried, []string{"b", "c"}) {
		t.Fatalf("retry: %+v %v", reply, err)
	}
	mustWrite(t, flag)
	end, err := f.Client.RunResult(ctx, "retried")
	if err != nil {
		t.Fatal(err)
	}
	if end.State != job.RunSucceeded || end.Round != 2 {
		t.Fatalf("round 2 ended %s (round %d)", end.State, end.Round)
	}
	jobs := map[string]string{}
	for _, n := range end.Nodes {
		jobs[n.ID] = n.JobID
	}
	if jobs["a"] != "retried:a" || jobs["b"] != "retried:b:2" || jobs["c"] != "retried:c:2" {
		t.Errorf("jobs of round 2: %v", jobs)
	}
	rs := results(t, f.Client, end)
	if rs["b"].Outputs["v"] != "from-a" {
		t.Errorf("b of round 2 got %q from a, whose job of round 1 it kept", rs["b"].Outputs["v"])
	}
	// Retrying a run that succeeded does nothing.
	if reply, err := f.Client.RetryRun(ctx, "retried"); err != nil || !strings.Contains(reply.Message, "succeeded") {
		t.Errorf("retry of a run that succeeded: %+v %v", reply, err)
	}
}

// A run submitted twice is accepted once; a bad run is refused whole,
// naming the node.
func TestTheSameRunTwiceIsAcceptedOnceAndABadOneIsRefused(t *testing.T) {
	f := fleet(t, 2)
	r := &job.RunRequest{ID: "twice", Nodes: []job.RunNode{sh("a", "true"), sh("b", "true", "a")}}
	end := finish(t, f.Client, r, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	again, err := f.Client.SubmitRun(ctx, r)
	if err != nil || !again.Duplicate || again.State != end.State {
		t.Errorf("the same run again: %+v %v", again, err)
	}
	bad := &job.RunRequest{ID: "bad", Nodes: []job.RunNode{sh("a", "true", "c"), sh("b", "true"), sh("c", "true", "a")}}
	_, err = f.Client.SubmitRun(ctx, bad)
	var refused *client.RunRefusedError
	if !errAs(err, &refused) || len(refused.Problems) != 1 || !strings.Contains(refused.Problems[0], "nodes[0] (a).after: a cycle") {
		t.Errorf("a run with a cycle: %v", err)
	}
	if _, err := f.Client.Run(ctx, "bad"); !errorsIsNotFound(err) {
		t.Errorf("a refused run was kept: %v", err)
	}
	// A job of a run's node's id is the run's to queue: a producer's own
	// is refused, and writes nothing on that id.
	_, err = f.Client.Submit(ctx, &job.Request{ID: "twice:a", RunID: "twice", NodeID: "a", Command: []string{"true"}})
	var rejected *client.RejectedError
	if !errAs(err, &rejected) || !strings.Contains(err.Error(), "a run's node's job") {
		t.Errorf("a producer's job with a run's node's id: %v", err)
	}
}

// A fan-out of 1,000 nodes after one, and a fan-in of all of them: the
// thousand are queued at once when the first ends, and the last runs once
// every one of them has.
func TestAFanOutOfAThousandAndItsFanIn(t *testing.T) {
	f := fleettest.Start(t)
	f.Worker(t, noop.Executor{}, worker.Config{Slots: 64, Backend: "noop", RunningAfter: 20 * time.Millisecond})
	nodes := []job.RunNode{sh("root", "true")}
	var mids []string
	for i := range 1000 {
		id := fmt.Sprintf("m%04d", i)
		nodes = append(nodes, sh(id, "true", "root"))
		mids = append(mids, id)
	}
	nodes = append(nodes, sh("sink", "true", mids...))
	end := finish(t, f.Client, &job.RunRequest{ID: "fan", Nodes: nodes}, 2*time.Minute)
	if end.State != job.RunSucceeded || len(end.Nodes) != 1002 {
		t.Fatalf("run ended %s with %d nodes", end.State, len(end.Nodes))
	}
	rs := results(t, f.Client, end)
	parents := map[string][]string{"sink": mids}
	for _, m := range mids {
		parents[m] = []string{"root"}
	}
	after(t, rs, parents)
	history(t, f, "fan")
}

// A run cancelled while its nodes run: the running node is stopped, the
// ones not queued yet end cancelled without running, and the run ends
// cancelled; what had ended stands.
func TestACancelledRunEndsEveryNodeNotEnded(t *testing.T) {
	f := fleet(t, 2)
	r := &job.RunRequest{ID: "stopped", Nodes: []job.RunNode{sh("a", "true"), sh("b", "sleep 60", "a"), sh("c", "true", "b"), sh("d", "true", "c")}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := f.Client.SubmitRun(ctx, r); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		v, err := f.Client.Run(ctx, "stopped")
		if err == nil && v.Nodes[1].State == job.StateRunning {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("b never ran: %+v %v", v, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	reply, err := f.Client.CancelRun(ctx, "stopped")
	if err != nil || !reply.Cancelled {
		t.Fatalf("cancel: %+v %v", reply, err)
	}
	end, err := f.Client.RunResult(ctx, "stopped")
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]string{}
	for _, n := range end.Nodes {
		states[n.ID] = string(n.State) + "/" + string(n.Code)
	}
	want := map[string]string{"a": "succeeded/", "b": "cancelled/cancelled", "c": "cancelled/cancelled", "d": "cancelled/cancelled"}
	if end.State != job.RunCancelled || !maps.Equal(states, want) {
		t.Errorf("run ended %s: %v; want cancelled: %v", end.State, states, want)
	}
	history(t, f, "stopped")
	// A second cancel has nothing to do.
	if reply, err := f.Client.CancelRun(ctx, "stopped"); err != nil || reply.Cancelled {
		t.Errorf("second cancel: %+v %v", reply, err)
	}
}

// A node's attempt knows its run and node (FLEET_RUN_ID, FLEET_NODE_ID),
// and its workspace is laid out under the run's and the node's folders,
// as the seed laid out a run: <dir>/runs/<run>/<node>/<attempt>-…; the
// folders go with the attempt.
func TestANodeKnowsItsRunAndNode(t *testing.T) {
	f := fleettest.Start(t)
	dir := t.TempDir()
	e, err := process.New(process.Config{Dir: dir, Grace: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	f.Worker(t, e, worker.Config{Slots: 2})
	n := sh("train", `printf '%s %s %s' "$FLEET_RUN_ID" "$FLEET_NODE_ID" "$FLEET_WORK" > $FLEET_OUTPUTS/who`)
	n.Job.Outputs = []string{"who"}
	end := finish(t, f.Client, &job.RunRequest{ID: "nightly", Nodes: []job.RunNode{n}}, time.Minute)
	rs := results(t, f.Client, end)
	who := strings.Fields(rs["train"].Outputs["who"])
	if len(who) != 3 || who[0] != "nightly" || who[1] != "train" || !strings.HasPrefix(who[2], dir+"/runs/nightly/train/1-") {
		t.Errorf("the node saw %q; want its run, its node, and a workspace under %s/runs/nightly/train/", who, dir)
	}
	if _, err := os.Stat(dir + "/runs/nightly"); !os.IsNotExist(err) {
		t.Errorf("the run's folder outlived its attempts: %v", err)
	}
}
