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
	"sync/atomic"
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
	subject   string
	data      []byte
	headers   nats.Header
	delivered uint64
	seq       uint64 // its stream sequence: the revision of the record it is
}

var _ jetstream.Msg = (*fakeMsg)(nil)

func (m *fakeMsg) Metadata() (*jetstream.MsgMetadata, error) {
	return &jetstream.MsgMetadata{NumDelivered: m.delivered, Sequence: jetstream.SequencePair{Stream: m.seq}}, nil
}
func (m *fakeMsg) Data() []byte                    { return m.data }
func (m *fakeMsg) Headers() nats.Header            { return m.headers }
func (m *fakeMsg) Subject() string                 { return m.subject }
func (m *fakeMsg) Reply() string                   { return "$JS.ACK.FLEET_POOL_default.jobs-default.1.1.1.0.0" }
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
	notices []*job.Event
	ended   []*job.NodeEnded
	dlq     int
	fail    map[string]error
	// onWrite, when set, runs before each record write: a test changes
	// the stored record there, as a dispatcher's cancel would.
	onWrite func(j *memJournal, rec *job.Record)
}

func newJournal(o *ops) *memJournal {
	return &memJournal{ops: o, records: map[string][]byte{}, revs: map[string]uint64{}, fail: map[string]error{}}
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

func (j *memJournal) Record(_ context.Context, k queue.JobKey) (*job.Record, uint64, error) {
	j.ops.add("read record")
	if err := j.failing("read record"); err != nil {
		return nil, 0, err
	}
	rec := j.get(k.ID)
	if rec == nil {
		return nil, 0, queue.ErrNotFound
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	return rec, j.revs[k.ID], nil
}

// WriteRecord logs "record <state> <attempt> <event>[/<phase>]": a
// version of the record says what happened.
func (j *memJournal) WriteRecord(_ context.Context, rec *job.Record, rev uint64) (uint64, error) {
	if j.onWrite != nil {
		f := j.onWrite
		j.onWrite = nil
		f(j, rec)
	}
	ev := string(rec.Event)
	if rec.Phase != "" {
		ev += "/" + rec.Phase
	}
	if rec.Result != nil {
		ev += " +result"
	}
	j.ops.add("record %s %d %s", rec.State, rec.Attempt, ev)
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

// SendRecord does not send when a write's failure is planned: the test
// means the write that a delivery makes alone.
func (j *memJournal) SendRecord(rec *job.Record, rev uint64) (answer, error) {
	j.mu.Lock()
	_, planned := j.fail["record"]
	j.mu.Unlock()
	if planned {
		return nil, errors.New("not sent: the next write fails")
	}
	return sendBy(j.WriteRecord, rec, rev)
}

// sendBy is a fake journal's SendRecord: its WriteRecord, with the answer
// in a future as JetStream gives it, a refusal as the error of a wrong
// last sequence.
func sendBy(write func(context.Context, *job.Record, uint64) (uint64, error), rec *job.Record, rev uint64) (answer, error) {
	a := memAnswer{ok: make(chan *jetstream.PubAck, 1), err: make(chan error, 1)}
	seq, err := write(context.Background(), rec, rev)
	switch {
	case errors.Is(err, queue.ErrConflict):
		a.err <- &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamWrongLastSequence, Description: "wrong last sequence"}
	case err != nil:
		a.err <- err
	default:
		a.ok <- &jetstream.PubAck{Sequence: seq}
	}
	return a, nil
}

type memAnswer struct {
	ok  chan *jetstream.PubAck
	err chan error
}

func (a memAnswer) Ok() <-chan *jetstream.PubAck { return a.ok }
func (a memAnswer) Err() <-chan error            { return a.err }

type memPending struct {
	j    *memJournal
	what string
}

func (p memPending) Wait(context.Context) error {
	p.j.ops.add("stored %s", p.what)
	return p.j.failing("stored " + p.what)
}

func (j *memJournal) Notice(e *job.Event) error {
	what := "notice " + string(e.Type)
	if e.Phase != "" {
		what += "/" + e.Phase
	}
	j.ops.add("%s", what)
	j.mu.Lock()
	j.notices = append(j.notices, e)
	j.mu.Unlock()
	return j.failing(what)
}

func (j *memJournal) NodeEnded(tenant string, e *job.NodeEnded) (pending, error) {
	j.ops.add("node ended %s %s", e.NodeID, e.State)
	if err := j.failing("node ended"); err != nil {
		return nil, err
	}
	j.mu.Lock()
	j.ended = append(j.ended, e)
	j.mu.Unlock()
	return memPending{j, "node ended"}, nil
}

func (j *memJournal) DeadLetter(queue.JobKey, []byte, *job.Failure, int) (pending, error) {
	j.ops.add("dead letter")
	if err := j.failing("dead letter"); err != nil {
		return nil, err
	}
	j.mu.Lock()
	j.dlq++
	j.mu.Unlock()
	return memPending{j, "dead letter"}, nil
}

// testWorker is a Worker with nothing but what a delivery's pipeline
// uses: its config, slots (its producer's), metrics and the journal; no
// NATS.
func testWorker(t testing.TB, j journal, cfg Config) *Worker {
	t.Helper()
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if cfg.ID == "" {
		cfg.ID = "w1"
	}
	cfg.Backend = "test"
	cfg = cfg.WithDefaults()
	w := &Worker{cfg: cfg, names: cfg.Queue.Names, log: cfg.Logger, journal: j}
	w.m = newMetrics(noopMeter, w)
	w.p = &fakeProducer{}
	w.sealer, _ = queue.NewSealer(make([]byte, 32))
	w.scope = newScopes(context.Background())
	t.Cleanup(w.scope.giveUp)
	w.completer = newCompleter(j, cfg.Slots, w.m)
	if err := w.completer.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := w.completer.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return w
}

// fakeProducer is the first stage of a testWorker: it pulls nothing, and
// counts the slots given back.
type fakeProducer struct{ freed atomic.Int64 }

func (*fakeProducer) Start(context.Context, context.Context) error { return nil }
func (*fakeProducer) Halt()                                        {}
func (*fakeProducer) Wait()                                        {}
func (*fakeProducer) Close(context.Context) error                  { return nil }
func (p *fakeProducer) Free()                                      { p.freed.Add(1) }
func (*fakeProducer) Ran(string, time.Duration)                    {}
func (*fakeProducer) Paused() bool                                 { return false }

// jobMessage returns the message that queued a request, as the
// dispatcher writes it: the first version of the job's record, at stream
// sequence seq.
func jobMessage(t testing.TB, o *ops, r *job.Request, seq uint64, delivered uint64) *fakeMsg {
	t.Helper()
	r.Normalize()
	rec := queuedRecord(r)
	data, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	names := queue.Names{}
	return &fakeMsg{ops: o, subject: names.PoolJob(r.Pool, queue.KindQueued(r.Priority), job.DefaultTenant, r.ID),
		data: data, headers: nats.Header{}, delivered: delivered, seq: seq}
}

// queuedRecord is the record version that queues a request.
func queuedRecord(r *job.Request) *job.Record {
	r.Normalize()
	sub := time.Now().Add(-time.Second)
	return &job.Record{ID: r.ID, Tenant: job.DefaultTenant, Pool: r.Pool, Priority: r.Priority, State: job.StateQueued,
		Event: job.EventQueued, MaxAttempts: r.Retry.MaxAttempts, SubmittedAt: sub, UpdatedAt: sub, Request: r}
}

// wantOps fails unless the log is exactly want.
func wantOps(t *testing.T, got, want []string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("what happened, in order:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

var errNATS = errors.New("nats: timeout")
