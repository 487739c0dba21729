package runs

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/natstest"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// jobs is the releaser's side of the jobs for these tests: it notes every
// job queued, and fails the queueing of a node while fail says so.
type jobs struct {
	mu     sync.Mutex
	queued []string // node ids, in the order their jobs were queued
	fail   func(node string) bool
}

func (j *jobs) QueueAll(_ context.Context, _ string, reqs []*job.Request) []error {
	j.mu.Lock()
	defer j.mu.Unlock()
	errs := make([]error, len(reqs))
	for i, req := range reqs {
		if j.fail != nil && j.fail(req.NodeID) {
			errs[i] = errors.New("the store is away")
			continue
		}
		if !slices.Contains(j.queued, req.NodeID) {
			j.queued = append(j.queued, req.NodeID)
		}
	}
	return errs
}

func (j *jobs) EndUnqueued(context.Context, *job.Record) (bool, error) { return true, nil }
func (j *jobs) Cancel(context.Context, string, string) error           { return nil }
func (j *jobs) Last(context.Context, queue.JobKey) (*job.Record, error) {
	return nil, queue.ErrNotFound
}
func (j *jobs) has(node string) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Contains(j.queued, node)
}
func (j *jobs) setFail(f func(string) bool) { j.mu.Lock(); j.fail = f; j.mu.Unlock() }
func (j *jobs) snapshot() []string          { j.mu.Lock(); defer j.mu.Unlock(); return slices.Clone(j.queued) }

// A chain a → b → c of tenant t, pool p, defined in the runs' stream.
func chain(t *testing.T) (jetstream.JetStream, *queue.Runs, *job.RunRecord, queue.Config) {
	t.Helper()
	ns := natstest.Run(t)
	nc := ns.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := queue.Config{}.WithDefaults()
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, cfg.RunsStream()); err != nil {
		t.Fatal(err)
	}
	rec := record([]string{"a", "b<-a", "c<-b"}, nil)
	rec.RunID = "chain"
	for i := range rec.Nodes {
		rec.Nodes[i].Job = &job.Request{Command: []string{"true"}}
	}
	runs := queue.NewRuns(js, cfg.Names)
	if _, err := runs.Define(ctx, rec); err != nil {
		t.Fatal(err)
	}
	return js, runs, rec, cfg
}

func ended(t *testing.T, runs *queue.Runs, rec *job.RunRecord, node string) {
	t.Helper()
	e := &job.NodeEnded{RunID: rec.RunID, NodeID: node, JobID: job.RunJobID(rec.RunID, node, 1), Pool: "p", Round: 1,
		State: job.StateSucceeded, At: time.Now()}
	if err := runs.NodeEnded(context.Background(), e, rec.Tenant); err != nil {
		t.Fatal(err)
	}
}

func until(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !ok(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after 30s: not %s", what)
		}
	}
}

func start(t *testing.T, js jetstream.JetStream, j Jobs, cfg queue.Config) *Releaser {
	t.Helper()
	r := New(js, j, Config{Queue: cfg, PinnedTTL: time.Second})
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop(context.Background()) })
	return r
}

// A node end whose work failed comes back, and is done then, although
// the releaser that took it counted the end the first time.
func TestANodeEndWhoseWorkFailedReleasesWhenItComesBack(t *testing.T) {
	js, runs, rec, cfg := chain(t)
	j := &jobs{fail: func(node string) bool { return node == "b" }}
	start(t, js, j, cfg)
	until(t, "a queued", func() bool { return j.has("a") })
	ended(t, runs, rec, "a")
	time.Sleep(300 * time.Millisecond) // b's queueing fails, and a's end is handed back
	j.setFail(nil)
	until(t, "b queued once its queueing works", func() bool { return j.has("b") })
	ended(t, runs, rec, "b")
	until(t, "c queued", func() bool { return j.has("c") })
	if got := j.snapshot(); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("queued %v; want a, b, c", got)
	}
}

// A releaser that took a run's definition stops (its dispatcher dies);
// the next one knows nothing of the run, and reads it when the first
// node's end comes: the end it reads is that very message's, which
// must still release the node after it.
func TestTheNextReleaserReleasesWhatAnEndItReadCallsFor(t *testing.T) {
	js, runs, rec, cfg := chain(t)
	j := &jobs{}
	first := New(js, j, Config{Queue: cfg, PinnedTTL: time.Second})
	if err := first.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	until(t, "a queued", func() bool { return j.has("a") })
	if err := first.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	ended(t, runs, rec, "a")
	start(t, js, j, cfg)
	until(t, "b queued by the next releaser", func() bool { return j.has("b") })
	ended(t, runs, rec, "b")
	until(t, "c queued", func() bool { return j.has("c") })
	ended(t, runs, rec, "c")
	until(t, "the run's end written", func() bool {
		rr, err := runs.Rounds(context.Background(), rec.Tenant, rec.RunID)
		return err == nil && rr.Ended[1] != nil && rr.Ended[1].State == job.RunSucceeded
	})
}
