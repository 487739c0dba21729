package producer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/capacity"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// The fakes of the pull loop's tests: a queue's consumer whose fetches the
// test answers, the source that makes such consumers, and an attempt stage
// that records what it was handed.

var errFake = errors.New("not part of the fake")

// fakeBatch is one fetch's answer: the test sends its messages and ends it
// with an error (or none), as the server would.
type fakeBatch struct {
	n     int // what the fetch asked for
	msgs  chan jetstream.Msg
	mu    sync.Mutex
	err   error
	ended bool
}

func newBatch(n int) *fakeBatch {
	return &fakeBatch{n: n, msgs: make(chan jetstream.Msg, max(n, 1)+16)}
}

func (b *fakeBatch) Messages() <-chan jetstream.Msg { return b.msgs }

func (b *fakeBatch) Error() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

// send hands messages to the fetch.
func (b *fakeBatch) send(msgs ...jetstream.Msg) {
	for _, m := range msgs {
		b.msgs <- m
	}
}

// end closes its channel, after which Error says err; a second end does
// nothing.
func (b *fakeBatch) end(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ended {
		return
	}
	b.ended, b.err = true, err
	close(b.msgs)
}

// endedBatch is an answer already complete: msgs, then err.
func endedBatch(err error, msgs ...jetstream.Msg) *fakeBatch {
	b := newBatch(len(msgs))
	b.send(msgs...)
	b.end(err)
	return b
}

// fakeConsumer is a queue's consumer. Fetch and FetchNoWait return what
// the test's functions say; by default an open batch, which the test
// finds among calls and answers. Info returns what info says.
type fakeConsumer struct {
	name string

	mu      sync.Mutex
	fetch   func(n int) (*fakeBatch, error) // Fetch's; nil: an open batch
	noWait  func(n int) (*fakeBatch, error) // FetchNoWait's; nil: an open batch
	info    func() (*jetstream.ConsumerInfo, error)
	batches []*fakeBatch // every batch returned, in order
	infos   int          // Info calls
	pending uint64       // what CachedInfo says waits
	// calls receives each batch that Fetch or FetchNoWait returns.
	calls chan *fakeBatch
}

var _ jetstream.Consumer = (*fakeConsumer)(nil)

func newConsumer(name string) *fakeConsumer {
	return &fakeConsumer{name: name, calls: make(chan *fakeBatch, 1000)}
}

func (c *fakeConsumer) answer(f func(int) (*fakeBatch, error), n int) (jetstream.MessageBatch, error) {
	b, err := newBatch(n), error(nil)
	if f != nil {
		b, err = f(n)
	}
	if err != nil {
		return nil, err
	}
	b.n = n
	c.mu.Lock()
	c.batches = append(c.batches, b)
	c.mu.Unlock()
	c.calls <- b
	return b, nil
}

func (c *fakeConsumer) Fetch(n int, _ ...jetstream.FetchOpt) (jetstream.MessageBatch, error) {
	c.mu.Lock()
	f := c.fetch
	c.mu.Unlock()
	return c.answer(f, n)
}

func (c *fakeConsumer) FetchNoWait(n int) (jetstream.MessageBatch, error) {
	c.mu.Lock()
	f := c.noWait
	c.mu.Unlock()
	return c.answer(f, n)
}

func (c *fakeConsumer) Info(context.Context) (*jetstream.ConsumerInfo, error) {
	c.mu.Lock()
	c.infos++
	f := c.info
	c.mu.Unlock()
	if f == nil {
		return &jetstream.ConsumerInfo{Name: c.name}, nil
	}
	return f()
}

func (c *fakeConsumer) CachedInfo() *jetstream.ConsumerInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	return &jetstream.ConsumerInfo{Name: c.name, NumPending: c.pending}
}

func (c *fakeConsumer) infoCalls() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.infos
}

func (c *fakeConsumer) setFetch(f func(n int) (*fakeBatch, error)) {
	c.mu.Lock()
	c.fetch = f
	c.mu.Unlock()
}

func (c *fakeConsumer) setNoWait(f func(n int) (*fakeBatch, error)) {
	c.mu.Lock()
	c.noWait = f
	c.mu.Unlock()
}

func (c *fakeConsumer) setInfo(f func() (*jetstream.ConsumerInfo, error)) {
	c.mu.Lock()
	c.info = f
	c.mu.Unlock()
}

// endAll ends the batches still open, as their expiry would.
func (c *fakeConsumer) endAll(err error) {
	c.mu.Lock()
	bs := append([]*fakeBatch(nil), c.batches...)
	c.mu.Unlock()
	for _, b := range bs {
		b.end(err)
	}
}

// next waits for the next batch handed out, or fails the test.
func (c *fakeConsumer) next(t *testing.T) *fakeBatch {
	t.Helper()
	select {
	case b := <-c.calls:
		return b
	case <-time.After(5 * time.Second):
		t.Fatalf("consumer %s: no fetch within 5s", c.name)
		return nil
	}
}

// none fails the test if a fetch comes within d: what a correct pull loop
// never does, so the wait cannot make a correct one fail.
func (c *fakeConsumer) none(t *testing.T, d time.Duration, why string) {
	t.Helper()
	select {
	case b := <-c.calls:
		t.Fatalf("consumer %s: a fetch of %d %s", c.name, b.n, why)
	case <-time.After(d):
	}
}

func (c *fakeConsumer) Consume(jetstream.MessageHandler, ...jetstream.PullConsumeOpt) (jetstream.ConsumeContext, error) {
	return nil, errFake
}
func (c *fakeConsumer) Messages(...jetstream.PullMessagesOpt) (jetstream.MessagesContext, error) {
	return nil, errFake
}
func (c *fakeConsumer) Next(...jetstream.FetchOpt) (jetstream.Msg, error) { return nil, errFake }
func (c *fakeConsumer) FetchBytes(int, ...jetstream.FetchOpt) (jetstream.MessageBatch, error) {
	return nil, errFake
}

// fakeSource makes a fresh fakeConsumer at each bind, unless bindFn says
// otherwise, and lists what listFn says.
type fakeSource struct {
	mu     sync.Mutex
	bindFn func(ctx context.Context, k queue.QueueKey) (jetstream.Consumer, error)
	listFn func(ctx context.Context) (map[queue.QueueKey]*jetstream.ConsumerInfo, error)
	binds  []queue.QueueKey
	lists  int
	made   map[queue.QueueKey][]*fakeConsumer // by bind, in order
}

func (s *fakeSource) bind(ctx context.Context, k queue.QueueKey) (jetstream.Consumer, error) {
	s.mu.Lock()
	s.binds = append(s.binds, k)
	f := s.bindFn
	s.mu.Unlock()
	if f != nil {
		return f(ctx, k)
	}
	c := newConsumer(queue.Names{}.QueueConsumer(k.Priority, k.Tenant))
	s.mu.Lock()
	if s.made == nil {
		s.made = map[queue.QueueKey][]*fakeConsumer{}
	}
	s.made[k] = append(s.made[k], c)
	s.mu.Unlock()
	return c, nil
}

func (s *fakeSource) list(ctx context.Context) (map[queue.QueueKey]*jetstream.ConsumerInfo, error) {
	s.mu.Lock()
	s.lists++
	f := s.listFn
	s.mu.Unlock()
	if f == nil {
		return nil, nil
	}
	return f(ctx)
}

func (s *fakeSource) bindCount(k queue.QueueKey) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, b := range s.binds {
		if b == k {
			n++
		}
	}
	return n
}

func (s *fakeSource) listCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lists
}

// fakeRun is the attempt stage: it records each message handed on and,
// when autoFree, gives its slot back at once.
type fakeRun struct {
	p        *Producer
	autoFree bool
	got      chan jetstream.Msg
	mu       sync.Mutex
	held     map[string]capacity.Holding
	running  int
	// known are the consumers the test made, ended when the pull stops.
	known []*fakeConsumer
}

var _ Attempts = (*fakeRun)(nil)

func (r *fakeRun) Deliver(msg jetstream.Msg) {
	r.got <- msg
	if r.autoFree {
		r.p.Free()
	}
}

func (r *fakeRun) Running() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.running
}

func (r *fakeRun) Holdings() map[string]capacity.Holding {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]capacity.Holding{}
	for t, h := range r.held {
		out[t] = h
	}
	return out
}

// delivered waits for n messages handed on and returns them.
func (r *fakeRun) delivered(t *testing.T, n int) []jetstream.Msg {
	t.Helper()
	var out []jetstream.Msg
	for len(out) < n {
		select {
		case m := <-r.got:
			out = append(out, m)
		case <-time.After(5 * time.Second):
			t.Fatalf("%d messages handed on within 5s; want %d", len(out), n)
		}
	}
	return out
}

// nothingDelivered fails the test if a message is handed on now.
func (r *fakeRun) nothingDelivered(t *testing.T) {
	t.Helper()
	select {
	case m := <-r.got:
		t.Fatalf("handed on %s", m.Subject())
	default:
	}
}

// testProducer is a producer of cfg's pool over src, handing on to the
// fakeRun it returns, with no NATS (nc and js nil) unless the test sets
// them. Its pull context ends with the test, and every goroutine it
// started is waited for.
func testProducer(t *testing.T, cfg Config, src source) (*Producer, *fakeRun) {
	t.Helper()
	cfg.Pool = cmp.Or(cfg.Pool, job.DefaultPool)
	cfg.FetchWait = cmp.Or(cfg.FetchWait, time.Second)
	cfg.PausePoll = cmp.Or(cfg.PausePoll, time.Second)
	cfg.Queue = cfg.Queue.WithDefaults()
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	run := &fakeRun{got: make(chan jetstream.Msg, 1000), held: map[string]capacity.Holding{}}
	p := New(cfg, run)
	p.src = src
	p.ctx, p.cancel = context.WithCancel(context.Background())
	run.p = p
	t.Cleanup(func() { stopPull(t, p) })
	return p, run
}

// stopPull halts p, ends the fetches of every consumer it knows as their
// expiry would, and waits for its goroutines.
func stopPull(t *testing.T, p *Producer) {
	t.Helper()
	p.Halt()
	done := make(chan struct{})
	go func() { p.pulling.Wait(); close(done) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		p.qs.queues.mu.Lock()
		list := append([]*workQueue(nil), p.qs.list...)
		p.qs.queues.mu.Unlock()
		for _, q := range list {
			if c, ok := q.cons.(*fakeConsumer); ok {
				c.endAll(nil)
			}
		}
		if run, ok := p.run.(*fakeRun); ok {
			run.mu.Lock()
			for _, c := range run.known {
				c.endAll(nil)
			}
			run.mu.Unlock()
		}
		if src, ok := p.src.(*fakeSource); ok {
			src.mu.Lock()
			for _, cs := range src.made {
				for _, c := range cs {
					c.endAll(nil)
				}
			}
			src.mu.Unlock()
		}
		select {
		case <-done:
			return
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Error("the pull did not end within 10s of its halt")
			return
		}
	}
}

// addQueue adds a queue of key k over c to p, with pending waiting.
func addQueue(p *Producer, k queue.QueueKey, c jetstream.Consumer, pending int64) *workQueue {
	q := &workQueue{key: k, cons: c}
	q.pending.Store(pending)
	if fc, ok := c.(*fakeConsumer); ok {
		if run, ok := p.run.(*fakeRun); ok {
			run.mu.Lock()
			run.known = append(run.known, fc)
			run.mu.Unlock()
		}
	}
	p.qs.add(q)
	return q
}

// startPull starts p's pull loop, as Start does.
func startPull(p *Producer) {
	p.pulling.Add(1)
	go p.pull()
}

// eventually polls cond until it holds, or fails the test after 5s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 5s: %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// freeSlots is how many of p's slots are free.
func freeSlots(p *Producer) int {
	p.slots.mu.Lock()
	defer p.slots.mu.Unlock()
	return p.slots.free
}

// ops is what the messages of a test were told, in order.
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

// pullMsg is a job message of subject, whose metadata says how many wait
// after it (noMeta: its metadata cannot be read); what it is told goes to
// ops.
type pullMsg struct {
	ops     *ops
	subject string
	pending uint64
	noMeta  bool
}

var _ jetstream.Msg = (*pullMsg)(nil)

func (m *pullMsg) Metadata() (*jetstream.MsgMetadata, error) {
	if m.noMeta {
		return nil, errFake
	}
	return &jetstream.MsgMetadata{NumDelivered: 1, NumPending: m.pending}, nil
}
func (m *pullMsg) Data() []byte                    { return nil }
func (m *pullMsg) Headers() nats.Header            { return nil }
func (m *pullMsg) Subject() string                 { return m.subject }
func (m *pullMsg) Reply() string                   { return "" }
func (m *pullMsg) Ack() error                      { m.ops.add("ack"); return nil }
func (m *pullMsg) DoubleAck(context.Context) error { m.ops.add("ack"); return nil }
func (m *pullMsg) Nak() error                      { m.ops.add("nak"); return nil }
func (m *pullMsg) NakWithDelay(d time.Duration) error {
	m.ops.add("nak %s", d)
	return nil
}
func (m *pullMsg) InProgress() error { return nil }
func (m *pullMsg) Term() error       { m.ops.add("term"); return nil }
func (m *pullMsg) TermWithReason(r string) error {
	m.ops.add("term %s", r)
	return nil
}

// msgOf makes a message of subject s, pending after it.
func msgOf(o *ops, s string, pending uint64) *pullMsg {
	return &pullMsg{ops: o, subject: s, pending: pending}
}
