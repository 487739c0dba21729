package queue_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/natstest"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// runsStore sets up the streams and returns the runs' store and a
// JetStream context.
func runsStore(t *testing.T) (*queue.Runs, jetstream.JetStream, queue.Names) {
	t.Helper()
	s := natstest.Run(t)
	js := newJS(t, s.Connect(t))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := queue.Config{}.WithDefaults()
	if err := queue.Setup(ctx, js, c, slog.Default()); err != nil {
		t.Fatal(err)
	}
	return queue.NewRuns(js, c.Names), js, c.Names
}

// A node's end written on another pool's subject of the node, after the
// node's own, does not hide it: the reader gets the last end of each
// subject.
func TestNodesEndedReadsEachPoolsSubjectOfANode(t *testing.T) {
	rs, _, _ := runsStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	own := &job.NodeEnded{RunID: "r", NodeID: "a", JobID: "r:a", Pool: "gpu", Round: 1, State: job.StateSucceeded}
	other := &job.NodeEnded{RunID: "r", NodeID: "a", JobID: "r:a", Pool: "cpu", Round: 1, State: job.StateFailed}
	for _, e := range []*job.NodeEnded{own, other} {
		if err := rs.NodeEnded(ctx, e, "t"); err != nil {
			t.Fatal(err)
		}
	}
	ends, err := rs.NodesEnded(ctx, "t", "r")
	if err != nil {
		t.Fatal(err)
	}
	if len(ends) != 2 || ends[0].Pool != "gpu" || ends[1].Pool != "cpu" {
		t.Fatalf("ends %+v; want gpu's, then cpu's", ends)
	}
}

// An end of an earlier round written again after a later round's, on the
// same subject (a copy of the old round's job acknowledged, a cancel of
// it: the subject names no round), does not hide the later one: the
// reader gets every end, and the run keeps the one of its round. Before,
// it got the last of each subject, and the node's end in round 2 was
// lost: the round never ended.
func TestAnEarlierRoundsEndWrittenAgainHidesNoLaterOne(t *testing.T) {
	rs, _, _ := runsStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	first := &job.NodeEnded{RunID: "r", NodeID: "a", JobID: "r:a", Pool: "gpu", Round: 1, State: job.StateFailed, At: time.Now()}
	second := &job.NodeEnded{RunID: "r", NodeID: "a", JobID: job.RunJobID("r", "a", 2), Pool: "gpu", Round: 2, State: job.StateSucceeded, At: time.Now()}
	for _, e := range []*job.NodeEnded{first, second, first} {
		if err := rs.NodeEnded(ctx, e, "t"); err != nil {
			t.Fatal(err)
		}
	}
	ends, err := rs.NodesEnded(ctx, "t", "r")
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range ends {
		found = found || e.Round == 2 && e.JobID == second.JobID
	}
	if !found {
		t.Fatalf("ends %+v; round 2's is not among them", ends)
	}
}

// A message stored beforehand on another subject of the runs' stream,
// with the message id the fleet's write would have had if it were
// derived from the run (what a pool's worker can write on its own
// subjects), does not keep a run's definition, a node's end or a round's
// summary from being stored: the stream would take each for a duplicate
// of it, and drop it.
func TestRunsWritesCannotBeTakenFirstByTheirIDs(t *testing.T) {
	rs, js, names := runsStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, id := range []string{"t/r/def", "t/r:a/ended", "t/r/end/1", "t/r/cancel/1", "t/r/retry/2"} {
		m := nats.NewMsg(names.RunNodeEnded("t", "r", "cpu", "a"))
		m.Data = []byte(`{}`)
		m.Header.Set(jetstream.MsgIDHeader, id)
		if ack, err := js.PublishMsg(ctx, m); err != nil || ack.Duplicate {
			t.Fatalf("the message with id %s: %+v, %v", id, ack, err)
		}
	}
	rec := &job.RunRecord{RunID: "r", Tenant: "t", SubmittedAt: time.Now(),
		Nodes: []job.RunNodeRecord{{ID: "a", Pool: "gpu", Job: &job.Request{Command: []string{"true"}}}}}
	if _, err := rs.Define(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if got, err := rs.Def(ctx, "t", "r"); err != nil || got.RunID != "r" {
		t.Fatalf("the definition: %+v, %v", got, err)
	}
	if err := rs.NodeEnded(ctx, &job.NodeEnded{RunID: "r", NodeID: "a", JobID: "r:a", Pool: "gpu", Round: 1,
		State: job.StateFailed}, "t"); err != nil {
		t.Fatal(err)
	}
	ends, err := rs.NodesEnded(ctx, "t", "r")
	if err != nil {
		t.Fatal(err)
	}
	if len(ends) != 1 || ends[0].Pool != "gpu" {
		t.Fatalf("node ends %+v; want gpu's", ends)
	}
	if err := rs.Cancel(ctx, &job.RunCancel{RunID: "r", Tenant: "t", Round: 1}); err != nil {
		t.Fatal(err)
	}
	if err := rs.End(ctx, &job.RunEnd{RunID: "r", Tenant: "t", Round: 1, State: job.RunFailed}); err != nil {
		t.Fatal(err)
	}
	if err := rs.Retry(ctx, &job.RunRetry{RunID: "r", Tenant: "t", Round: 2, Nodes: []string{"a"}}); err != nil {
		t.Fatal(err)
	}
	rounds, err := rs.Rounds(ctx, "t", "r")
	if err != nil {
		t.Fatal(err)
	}
	if !rounds.Cancelled[1] || rounds.Ended[1] == nil || rounds.Round() != 2 {
		b, _ := json.Marshal(rounds)
		t.Fatalf("rounds %s; want round 1 cancelled and ended, round 2 started", b)
	}
	// Each is written once: a second write of each is refused.
	if _, err := rs.Define(ctx, rec); err != queue.ErrRunExists {
		t.Errorf("the definition again: %v", err)
	}
	if err := rs.End(ctx, &job.RunEnd{RunID: "r", Tenant: "t", Round: 1, State: job.RunFailed}); err != queue.ErrRunExists {
		t.Errorf("the summary again: %v", err)
	}
}
