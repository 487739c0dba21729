package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// The fakes of the settle tests: a job message and a journal in memory,
// both writing what happens to one log, in order.

// ops is the log the fakes share.
type ops struct {
	mu  sync.Mutex
	log []string
}

func (o *ops) add(format string, args ...any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.log = append(o.log, fmt.Sprintf(format, args...))
}

func (o *ops) all() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.log...)
}

// fakeMsg is a delivered job message.
type fakeMsg struct {
	ops       *ops
	data      []byte
	headers   nats.Header
	delivered uint64
}

var _ jetstream.Msg = (*fakeMsg)(nil)

func (m *fakeMsg) Metadata() (*jetstream.MsgMetadata, error) {
	return &jetstream.MsgMetadata{NumDelivered: m.delivered}, nil
}
func (m *fakeMsg) Data() []byte                    { return m.data }
func (m *fakeMsg) Headers() nats.Header            { return m.headers }
func (m *fakeMsg) Subject() string                 { return "fleet.jobs.default" }
func (m *fakeMsg) Reply() string                   { return "$JS.ACK.FLEET_JOBS_default.jobs-default.1.1.1.0.0" }
func (m *fakeMsg) Ack() error                      { m.ops.add("ack"); return nil }
func (m *fakeMsg) DoubleAck(context.Context) error { m.ops.add("ack"); return nil }
func (m *fakeMsg) Nak() error                      { m.ops.add("nak"); return nil }
func (m *fakeMsg) NakWithDelay(d time.Duration) error {
	m.ops.add("nak %s", d)
	return nil
}
func (m *fakeMsg) InProgress() error { return nil } // timing, not order: not logged
func (m *fakeMsg) Term() error       { m.ops.add("term"); return nil }
func (m *fakeMsg) TermWithReason(r string) error {
	m.ops.add("term %s", r)
	return nil
}

// memJournal keeps records, events and results in memory. fail makes the
// named operation fail (see failing).
type memJournal struct {
	ops     *ops
	mu      sync.Mutex
	records map[string][]byte
	revs    map[string]uint64
	results map[string]*job.Result
	events  []*job.Event
	dlq     int
	fail    map[string]error
	// onWrite, when set, runs before each record write: a test changes
	// the stored record there, as a dispatcher's cancel would.
	onWrite func(j *memJournal, rec *job.Record)
}

func newJournal(o *ops) *memJournal {
	return &memJournal{ops: o, records: map[string][]byte{}, revs: map[string]uint64{}, results: map[string]*job.Result{},
		fail: map[string]error{}}
}

var _ journal = (*memJournal)(nil)

// failing returns the error planned for op, once.
func (j *memJournal) failing(op string) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	err := j.fail[op]
	delete(j.fail, op)
	return err
}

// put stores a record as it is, as the dispatcher would; its revision
// grows by one.
func (j *memJournal) put(rec *job.Record) uint64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.putLocked(rec)
}

func (j *memJournal) putLocked(rec *job.Record) uint64 {
	data, _ := json.Marshal(rec)
	j.records[rec.ID] = data
	j.revs[rec.ID]++
	return j.revs[rec.ID]
}

func (j *memJournal) get(id string) *job.Record {
	j.mu.Lock()
	defer j.mu.Unlock()
	var rec job.Record
	if err := json.Unmarshal(j.records[id], &rec); err != nil {
		return nil
	}
	return &rec
}

func (j *memJournal) Record(_ context.Context, id string) (*job.Record, uint64, error) {
	j.ops.add("read record")
	if err := j.failing("read record"); err != nil {
		return nil, 0, err
	}
	rec := j.get(id)
	if rec == nil {
		return nil, 0, queue.ErrNotFound
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	return rec, j.revs[id], nil
}

func (j *memJournal) WriteRecord(_ context.Context, rec *job.Record, rev uint64) (uint64, error) {
	if j.onWrite != nil {
		f := j.onWrite
		j.onWrite = nil
		f(j, rec)
	}
	j.ops.add("record %s %d", rec.State, rec.Attempt)
	if err := j.failing("record"); err != nil {
		return 0, err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.revs[rec.ID] != rev {
		return 0, queue.ErrConflict
	}
	return j.putLocked(rec), nil
}

type memPending struct {
	j    *memJournal
	what string
}

func (p memPending) Wait(context.Context) error {
	p.j.ops.add("stored %s", p.what)
	return p.j.failing("stored " + p.what)
}

func (j *memJournal) Event(e *job.Event, _ int) (pending, error) {
	what := "event " + string(e.Type)
	if e.Phase != "" {
		what += "/" + e.Phase
	}
	j.ops.add("%s", what)
	if err := j.failing(what); err != nil {
		return nil, err
	}
	j.mu.Lock()
	j.events = append(j.events, e)
	j.mu.Unlock()
	if e.Type == job.EventLog || e.Type == job.EventHeartbeat {
		return nil, nil
	}
	return memPending{j, what}, nil
}

func (j *memJournal) DeadLetter(_, _ string, _ []byte, _ string, _ *job.Failure, _ int) (pending, error) {
	j.ops.add("dead letter")
	if err := j.failing("dead letter"); err != nil {
		return nil, err
	}
	j.mu.Lock()
	j.dlq++
	j.mu.Unlock()
	return memPending{j, "dead letter"}, nil
}

func (j *memJournal) Result(_ context.Context, res *job.Result) (*job.Result, error) {
	j.ops.add("result %s", res.Status)
	if err := j.failing("result"); err != nil {
		return nil, err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if old := j.results[res.JobID]; old != nil {
		return old, nil
	}
	j.results[res.JobID] = res
	return res, nil
}

func (j *memJournal) StoredResult(_ context.Context, id string) (*job.Result, error) {
	j.ops.add("read result")
	if err := j.failing("read result"); err != nil {
		return nil, err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.results[id], nil
}

// testWorker is a Worker with nothing but what a delivery's pipeline
// uses: its config, slots, metrics and the journal; no NATS.
func testWorker(t testing.TB, j journal, cfg Config) *Worker {
	t.Helper()
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if cfg.ID == "" {
		cfg.ID = "w1"
	}
	cfg.Backend = "test"
	cfg = cfg.WithDefaults()
	w := &Worker{cfg: cfg, names: cfg.Queue.Names, log: cfg.Logger, slots: newSlots(cfg.Slots), journal: j,
		running: map[string]*delivery{}}
	w.m = newMetrics(noopMeter, w)
	w.settling, w.giveUp = context.WithCancel(context.Background())
	w.runCtx, w.stopRuns = context.WithCancelCause(w.settling)
	t.Cleanup(w.giveUp)
	return w
}

// request returns a job message's body and headers for a request.
func jobMessage(t testing.TB, o *ops, r *job.Request, rev uint64, delivered uint64) *fakeMsg {
	t.Helper()
	r.Normalize()
	data, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	h := nats.Header{}
	h.Set(queue.HeaderMsgID, r.ID)
	h.Set(queue.HeaderSubmittedAt, time.Now().Add(-time.Second).UTC().Format(time.RFC3339Nano))
	if rev > 0 {
		h.Set(queue.HeaderRecordRev, fmt.Sprint(rev))
	}
	return &fakeMsg{ops: o, data: data, headers: h, delivered: delivered}
}

// wantOps fails unless the log is exactly want.
func wantOps(t *testing.T, got, want []string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("what happened, in order:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

var errNATS = errors.New("nats: timeout")
