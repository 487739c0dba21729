package queue_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/natstest"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// findBundle is a server with the streams of pools default and gpu, the
// job store, and what it logged.
type findBundle struct {
	ctx   context.Context
	js    jetstream.JetStream
	jobs  *queue.Jobs
	names queue.Names
	logs  *logLines
}

func setupFind(t *testing.T) *findBundle {
	t.Helper()
	s := natstest.Run(t)
	js, err := jetstream.New(s.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	c := queue.Config{}.WithDefaults()
	for _, p := range []string{"default", "gpu"} {
		if _, err := queue.EnsurePoolStream(ctx, js, c, p, slog.Default()); err != nil {
			t.Fatal(err)
		}
	}
	logs := &logLines{}
	return &findBundle{ctx: ctx, js: js, jobs: queue.NewJobs(js, c.Names).WithLogger(slog.New(logs)), names: c.Names, logs: logs}
}

// queue queues a job as a dispatcher does, its body saying it was
// submitted at submitted, and returns its record and revision.
func (b *findBundle) queue(t *testing.T, k queue.JobKey, submitted time.Time) (*job.Record, uint64) {
	t.Helper()
	rec := &job.Record{ID: k.ID, Tenant: k.Tenant, Pool: k.Pool, Priority: 2, State: job.StateQueued, Event: job.EventQueued,
		SubmittedAt: submitted, UpdatedAt: submitted, Request: &job.Request{Command: []string{"true"}}}
	rev, err := b.jobs.Queue(b.ctx, rec, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	return rec, rev
}

// run writes the running version of a queued job.
func (b *findBundle) run(t *testing.T, queued *job.Record, rev uint64) (*job.Record, uint64) {
	t.Helper()
	r := queued.Version()
	r.State, r.Event, r.Attempt, r.WorkerID = job.StateRunning, job.EventStarted, 1, "w-"+queued.Pool
	rev, err := b.jobs.Write(b.ctx, r, rev)
	if err != nil {
		t.Fatal(err)
	}
	return r, rev
}

// forge publishes a version on a subject as a worker could, whatever
// its body says, and returns its sequence.
func (b *findBundle) forge(t *testing.T, subject string, body any) uint64 {
	t.Helper()
	data, ok := body.([]byte)
	if !ok {
		var err error
		if data, err = json.Marshal(body); err != nil {
			t.Fatal(err)
		}
	}
	ack, err := b.js.Publish(b.ctx, subject, data)
	if err != nil {
		t.Fatalf("publish %s: %v", subject, err)
	}
	return ack.Sequence
}

// forgery is a copy of rec as a worker of another pool would make it: a
// later submission, another worker, the state given, the pool given.
func forgery(rec *job.Record, pool string, state job.State) *job.Record {
	f := rec.Version()
	f.Pool, f.State, f.WorkerID = pool, state, "forged"
	f.SubmittedAt = time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC)
	if state.Final() {
		f.Result = &job.Result{JobID: rec.ID, Pool: pool, Status: job.StatusFailed, Outputs: map[string]string{"out.txt": "forged"}}
	}
	return f
}

func (b *findBundle) find(t *testing.T, k queue.JobKey) (*job.Record, uint64) {
	t.Helper()
	rec, rev, err := b.jobs.Find(b.ctx, k.Tenant, k.ID, []string{"default", "gpu"})
	if err != nil {
		t.Fatalf("find %s/%s: %v", k.Tenant, k.ID, err)
	}
	return rec, rev
}

// TestFindBelievesTheQueuedPool: versions of a gpu job forged in pool
// default, final or not, their bodies naming gpu (a copy) or default,
// each submitted later by its body, do not make Find answer them: the
// job's pool is the one that queued it, and a write at the revision Find
// answers is a compare-and-set on the gpu job.
func TestFindBelievesTheQueuedPool(t *testing.T) {
	b := setupFind(t)
	k := queue.JobKey{Tenant: "acme", Pool: "gpu", ID: "j1"}
	queued, rev := b.queue(t, k, time.Now())
	running, rev := b.run(t, queued, rev)
	for _, f := range []struct {
		kind, pool string
		state      job.State
	}{{"r", "gpu", job.StateFailed}, {"r", "default", job.StateFailed}, {"s", "gpu", job.StateRunning}, {"s", "default", job.StateQueued}} {
		b.forge(t, b.names.PoolJob("default", f.kind, k.Tenant, k.ID), forgery(running, f.pool, f.state))
		rec, got := b.find(t, k)
		if got != rev || rec.Pool != "gpu" || rec.State != job.StateRunning || rec.WorkerID != "w-gpu" {
			t.Fatalf("after a forged %s version naming pool %s in pool default: %+v at %d, want the running gpu version at %d",
				f.kind, f.pool, rec, got, rev)
		}
	}
	cancelled := running.Version()
	cancelled.CancelRequested = true
	if _, err := b.jobs.Write(b.ctx, cancelled, rev); err != nil {
		t.Fatalf("a write at the revision Find answered: %v", err)
	}
}

// TestFindPicksTheLaterQueued: when two pools have genuine queued
// versions of a tenant's id, the one the stream stored later wins, not
// the one whose body says it was submitted later.
func TestFindPicksTheLaterQueued(t *testing.T) {
	b := setupFind(t)
	for _, order := range [][2]string{{"default", "gpu"}, {"gpu", "default"}} {
		id := "j-" + order[1]
		b.queue(t, queue.JobKey{Tenant: "acme", Pool: order[0], ID: id}, time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC))
		time.Sleep(2 * time.Millisecond)
		later, rev := b.queue(t, queue.JobKey{Tenant: "acme", Pool: order[1], ID: id}, time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC))
		rec, got := b.find(t, queue.Key(later))
		if rec.Pool != order[1] || got != rev {
			t.Fatalf("queued in %s, then in %s: found in %s at %d", order[0], order[1], rec.Pool, got)
		}
		// A later state in the earlier pool changes nothing.
		first, frev, err := b.jobs.Latest(b.ctx, queue.JobKey{Tenant: "acme", Pool: order[0], ID: id})
		if err != nil {
			t.Fatal(err)
		}
		b.run(t, first, frev)
		if rec, _ := b.find(t, queue.Key(later)); rec.Pool != order[1] || rec.State != job.StateQueued {
			t.Fatalf("after the earlier pool's job ran: found %s in %s", rec.State, rec.Pool)
		}
	}
	// Another tenant's job of the same id is not looked at.
	if _, _, err := b.jobs.Find(b.ctx, "beta", "j-gpu", []string{"default", "gpu"}); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("tenant beta's j-gpu: %v, want ErrNotFound", err)
	}
}

// TestFindARejection: a job that was only rejected is found by its
// rejection, stored on its kind x subject (or, written before that kind,
// on s); a later version a worker of another pool forged for that id does
// not win over it; a job rejected in one pool and queued in another is
// found where it was queued.
func TestFindARejection(t *testing.T) {
	b := setupFind(t)
	k := queue.JobKey{Tenant: "acme", Pool: "gpu", ID: "refused"}
	now := time.Now()
	rejected := &job.Record{ID: k.ID, Tenant: k.Tenant, Pool: k.Pool, State: job.StateRejected, Event: job.EventRejected,
		SubmittedAt: now, UpdatedAt: now, Message: "no live worker"}
	rev, err := b.jobs.Write(b.ctx, rejected, 0)
	if err != nil {
		t.Fatal(err)
	}
	s, err := b.js.Stream(b.ctx, b.names.PoolStreamV2("gpu"))
	if err != nil {
		t.Fatal(err)
	}
	if m, err := s.GetMsg(b.ctx, rev); err != nil || m.Subject != b.names.PoolJob("gpu", queue.KindRejected, k.Tenant, k.ID) {
		t.Fatalf("the rejection was stored on %v (%v), want kind %s", m, err, queue.KindRejected)
	}
	old := queue.JobKey{Tenant: "acme", Pool: "gpu", ID: "refused-before"}
	before := *rejected
	before.ID = old.ID
	orev := b.forge(t, b.names.PoolJob("gpu", queue.KindState, old.Tenant, old.ID), &before)
	if rec, got := b.find(t, old); rec.State != job.StateRejected || got != orev {
		t.Fatalf("a rejection of kind s, written before kind x: %+v at %d", rec, got)
	}
	b.forge(t, b.names.PoolJob("default", "r", k.Tenant, k.ID), forgery(rejected, "default", job.StateSucceeded))
	if rec, got := b.find(t, k); rec.Pool != "gpu" || rec.State != job.StateRejected || got != rev {
		t.Fatalf("a rejected job: %+v at %d", rec, got)
	}

	// Rejected in default, then queued in gpu.
	again := queue.JobKey{Tenant: "acme", Pool: "default", ID: "moved"}
	r := *rejected
	r.ID, r.Pool = again.ID, again.Pool
	if _, err := b.jobs.Write(b.ctx, &r, 0); err != nil {
		t.Fatal(err)
	}
	queued, qrev := b.queue(t, queue.JobKey{Tenant: "acme", Pool: "gpu", ID: "moved"}, now)
	if rec, got := b.find(t, again); rec.Pool != "gpu" || rec.State != job.StateQueued || got != qrev || rec.ID != queued.ID {
		t.Fatalf("rejected in default, queued in gpu: %+v at %d", rec, got)
	}

	// Nothing at all, or only versions no reader believes.
	if _, _, err := b.jobs.Find(b.ctx, "acme", "never", []string{"default", "gpu"}); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("an id with no version: %v", err)
	}
	b.forge(t, b.names.PoolJob("default", "s", "acme", "ghost"), forgery(rejected, "gpu", job.StateRunning))
	if _, _, err := b.jobs.Find(b.ctx, "acme", "ghost", []string{"default", "gpu"}); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("an id whose only version names another pool: %v", err)
	}
}

// TestReadersIgnoreVersionsThatNameAnotherJob: versions on a job's
// subjects whose bodies name another pool, tenant or id, or do not
// decode, are ignored by Latest, LastState, History and Find, which
// answer the last version that agrees, at the revision of the job's last
// message (a compare-and-set there succeeds); each read logs what it
// ignored once.
func TestReadersIgnoreVersionsThatNameAnotherJob(t *testing.T) {
	b := setupFind(t)
	k := queue.JobKey{Tenant: "acme", Pool: "gpu", ID: "j3"}
	queued, rev := b.queue(t, k, time.Now())
	running, rev := b.run(t, queued, rev)
	other := func(f func(r *job.Record)) *job.Record {
		r := forgery(running, "gpu", job.StateFailed)
		f(r)
		return r
	}
	var forged []uint64
	for _, body := range []any{
		other(func(r *job.Record) { r.Pool = "default" }),
		other(func(r *job.Record) { r.Tenant = "beta" }),
		other(func(r *job.Record) { r.ID = "j4" }),
		[]byte("not a record"),
	} {
		forged = append(forged, b.forge(t, b.names.PoolJob("gpu", "r", k.Tenant, k.ID), body))
	}
	last := forged[len(forged)-1]

	b.logs.reset()
	rec, got, err := b.jobs.Latest(b.ctx, k)
	if err != nil || rec.State != job.StateRunning || rec.WorkerID != "w-gpu" || got != last {
		t.Fatalf("Latest: %+v at %d, %v; want the running version at %d", rec, got, err, last)
	}
	b.logs.once(t, "Latest", "fleet.p.gpu.r.acme.j3")

	state, final, err := b.jobs.LastState(b.ctx, k)
	if err != nil || state != job.StateRunning || final {
		t.Fatalf("LastState: %s, final %v, %v", state, final, err)
	}
	b.logs.once(t, "LastState", "fleet.p.gpu.r.acme.j3")

	recs, seqs, err := b.jobs.History(b.ctx, k)
	if err != nil || len(recs) != 2 || len(seqs) != 2 || seqs[1] != rev || recs[1].State != job.StateRunning {
		t.Fatalf("History: %d versions at %v, %v; want queued and running, running at %d", len(recs), seqs, err, rev)
	}
	b.logs.once(t, "History", "fleet.p.gpu.r.acme.j3")

	rec, got = b.find(t, k)
	if rec.State != job.StateRunning || got != last {
		t.Fatalf("Find: %+v at %d", rec, got)
	}
	b.logs.once(t, "Find", "fleet.p.gpu.r.acme.j3")

	// A cancel, as the dispatcher writes it, at the revision read.
	next := rec.Version()
	next.CancelRequested = true
	if _, err := b.jobs.Write(b.ctx, next, got); err != nil {
		t.Fatalf("a write at the revision Latest answered: %v", err)
	}
	if rec, _, err := b.jobs.Latest(b.ctx, k); err != nil || !rec.CancelRequested {
		t.Fatalf("after the write: %+v, %v", rec, err)
	}

	// A job whose only version names another job has none.
	ghost := queue.JobKey{Tenant: "acme", Pool: "gpu", ID: "ghost"}
	seq := b.forge(t, b.names.PoolJob("gpu", "s", ghost.Tenant, ghost.ID), other(func(r *job.Record) { r.ID = "someone-else" }))
	if _, got, err := b.jobs.Latest(b.ctx, ghost); !errors.Is(err, queue.ErrNotFound) || got != seq {
		t.Fatalf("Latest of a job with no version that agrees: %d, %v; want ErrNotFound at %d", got, err, seq)
	}
}

// logLines is a slog handler that keeps the warnings it is given.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) Enabled(context.Context, slog.Level) bool { return true }
func (l *logLines) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logLines) WithGroup(string) slog.Handler            { return l }
func (l *logLines) Handle(_ context.Context, r slog.Record) error {
	if r.Level < slog.LevelWarn {
		return nil
	}
	line := r.Message
	r.Attrs(func(a slog.Attr) bool {
		line += " " + a.String()
		return true
	})
	l.mu.Lock()
	l.lines = append(l.lines, line)
	l.mu.Unlock()
	return nil
}

func (l *logLines) reset() {
	l.mu.Lock()
	l.lines = nil
	l.mu.Unlock()
}

// once checks that one warning was logged since the last check, naming
// subject, and forgets it.
func (l *logLines) once(t *testing.T, what, subject string) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.lines) != 1 || !strings.Contains(l.lines[0], "subject="+subject) {
		t.Fatalf("%s logged %q; want one warning naming %s", what, l.lines, subject)
	}
	l.lines = nil
}
