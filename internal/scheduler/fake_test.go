package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// memBucket is a Bucket and a Publisher in memory, for the tests on a
// fake clock: what the scheduler does with the schedules' bucket, with
// its compare-and-sets, and nothing that waits on a network. Options
// (IgnoreDeletes, LastRevision) are not read: their types are the
// client's own; deleted keys are never in a watch's first values, and a
// delete always succeeds.
type memBucket struct {
	// staysOpen: Stop leaves a watch's channel open, as nats.go's may
	// once its context ended while Watch made it (queue.Watched).
	staysOpen bool
	// watched, when set, is told of each watch once its first values are
	// in its channel, before Watch returns.
	watched func(keys string)

	mu       sync.Mutex
	rev      uint64
	keys     map[string]*memEntry
	watchers []*memWatcher
}

type memEntry struct {
	key   string
	value []byte
	rev   uint64
	op    jetstream.KeyValueOp
}

func (e *memEntry) Bucket() string                  { return "SCHEDULES" }
func (e *memEntry) Key() string                     { return e.key }
func (e *memEntry) Value() []byte                   { return e.value }
func (e *memEntry) Revision() uint64                { return e.rev }
func (e *memEntry) Created() time.Time              { return time.Time{} }
func (e *memEntry) Delta() uint64                   { return 0 }
func (e *memEntry) Operation() jetstream.KeyValueOp { return e.op }

func newMemBucket() *memBucket { return &memBucket{keys: map[string]*memEntry{}} }

func (b *memBucket) Bucket() string { return "SCHEDULES" }

func (b *memBucket) Get(_ context.Context, key string) (jetstream.KeyValueEntry, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e, ok := b.keys[key]
	if !ok || e.op != jetstream.KeyValuePut {
		return nil, jetstream.ErrKeyNotFound
	}
	return e, nil
}

func (b *memBucket) Create(_ context.Context, key string, value []byte, _ ...jetstream.KVCreateOpt) (uint64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e, ok := b.keys[key]; ok && e.op == jetstream.KeyValuePut {
		return 0, jetstream.ErrKeyExists
	}
	return b.put(key, value, jetstream.KeyValuePut), nil
}

func (b *memBucket) Update(_ context.Context, key string, value []byte, revision uint64) (uint64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var last uint64
	if e, ok := b.keys[key]; ok {
		last = e.rev
	}
	if last != revision {
		return 0, fmt.Errorf("update %s: %w", key, jetstream.ErrKeyRevisionMismatch)
	}
	return b.put(key, value, jetstream.KeyValuePut), nil
}

func (b *memBucket) Delete(_ context.Context, key string, _ ...jetstream.KVDeleteOpt) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.put(key, nil, jetstream.KeyValueDelete)
	return nil
}

// put stores a version of key and hands it to the watchers; b.mu held.
func (b *memBucket) put(key string, value []byte, op jetstream.KeyValueOp) uint64 {
	b.rev++
	e := &memEntry{key: key, value: value, rev: b.rev, op: op}
	b.keys[key] = e
	for _, w := range b.watchers {
		w.send(e)
	}
	return b.rev
}

func (b *memBucket) Watch(_ context.Context, keys string, _ ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	prefix, ok := strings.CutSuffix(keys, ">")
	if !ok {
		return nil, fmt.Errorf("memBucket watches only <prefix>.>, not %q", keys)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	w := &memWatcher{b: b, prefix: prefix, updates: make(chan jetstream.KeyValueEntry, 4096)}
	var first []*memEntry
	for _, e := range b.keys {
		if strings.HasPrefix(e.key, prefix) && e.op == jetstream.KeyValuePut {
			first = append(first, e)
		}
	}
	for _, e := range first {
		w.updates <- e
	}
	w.updates <- nil // the first values are all there
	b.watchers = append(b.watchers, w)
	if b.watched != nil {
		b.watched(keys)
	}
	return w, nil
}

// PublishMsgAsync takes a write to the bucket's subject of a key, with
// the compare-and-set of its header, and answers it at once.
func (b *memBucket) PublishMsgAsync(m *nats.Msg, _ ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	key, ok := strings.CutPrefix(m.Subject, "$KV."+b.Bucket()+".")
	if !ok {
		return nil, fmt.Errorf("memBucket: a write to %s", m.Subject)
	}
	f := &memFuture{m: m, ok: make(chan *jetstream.PubAck, 1), err: make(chan error, 1)}
	want, err := strconv.ParseUint(m.Header.Get(jetstream.ExpectedLastSubjSeqHeader), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("memBucket: the expected revision: %w", err)
	}
	if rev, err := b.Update(context.Background(), key, m.Data, want); err != nil {
		f.err <- err
	} else {
		f.ok <- &jetstream.PubAck{Sequence: rev}
	}
	return f, nil
}

// state reads what the firings of a schedule did.
func (b *memBucket) state(tenant, name string) (job.ScheduleState, uint64) {
	e, err := b.Get(context.Background(), StateKey(tenant, name))
	if err != nil {
		return job.ScheduleState{}, 0
	}
	var st job.ScheduleState
	if err := json.Unmarshal(e.Value(), &st); err != nil {
		panic(err)
	}
	return st, e.Revision()
}

type memFuture struct {
	m   *nats.Msg
	ok  chan *jetstream.PubAck
	err chan error
}

func (f *memFuture) Ok() <-chan *jetstream.PubAck { return f.ok }
func (f *memFuture) Err() <-chan error            { return f.err }
func (f *memFuture) Msg() *nats.Msg               { return f.m }

type memWatcher struct {
	b       *memBucket
	prefix  string
	updates chan jetstream.KeyValueEntry
	stopped bool
}

// send hands e to w if it follows its key; b.mu held.
func (w *memWatcher) send(e *memEntry) {
	if !w.stopped && strings.HasPrefix(e.key, w.prefix) {
		w.updates <- e
	}
}

func (w *memWatcher) Updates() <-chan jetstream.KeyValueEntry { return w.updates }

func (w *memWatcher) Stop() error {
	w.b.mu.Lock()
	defer w.b.mu.Unlock()
	if !w.stopped {
		w.stopped = true
		if !w.b.staysOpen {
			close(w.updates)
		}
	}
	return nil
}

// submitted is one submission the fake dispatcher was asked to make.
type submitted struct {
	id string
	at time.Time // when it was asked, on the bubble's clock
	// how it was asked: "submit" (the request encoded), "valid" (the
	// request made ready) or "batch" (made ready, in a batch).
	how string
}

// fakeDispatcher answers the scheduler as a dispatcher would, and keeps
// what it was asked.
type fakeDispatcher struct {
	mu        sync.Mutex
	subs      []submitted
	cancelled []string
	// fail, when set, fails the submission of id when it returns an error.
	fail func(id string) error
	// states are the jobs' last states, by id; a job not there is not
	// found.
	states map[string]job.State
}

func newFakeDispatcher() *fakeDispatcher { return &fakeDispatcher{states: map[string]job.State{}} }

func (f *fakeDispatcher) submit(req *job.Request, how string) (*job.SubmitReply, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.subs = append(f.subs, submitted{id: req.ID, at: time.Now(), how: how})
	if f.fail != nil {
		if err := f.fail(req.ID); err != nil {
			return nil, err
		}
	}
	return &job.SubmitReply{JobID: req.ID, Pool: "default", State: job.StateQueued}, nil
}

func (f *fakeDispatcher) Submit(_ context.Context, _ string, data []byte) (*job.SubmitReply, error) {
	var req job.Request
	if err := json.Unmarshal(data, &req); err != nil {
		return nil, fmt.Errorf("decode the request: %w", err)
	}
	return f.submit(&req, "submit")
}

func (f *fakeDispatcher) SubmitValid(_ context.Context, _ string, req *job.Request) (*job.SubmitReply, error) {
	return f.submit(req, "valid")
}

func (f *fakeDispatcher) SubmitBatch(subs []Submission, answered func(int, *job.SubmitReply, error)) {
	for i, s := range subs {
		reply, err := f.submit(s.Req, "batch")
		answered(i, reply, err)
	}
}

func (f *fakeDispatcher) Cancel(_ context.Context, _, id string) (*job.CancelReply, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cancelled = append(f.cancelled, id)
	f.states[id] = job.StateCancelled
	return &job.CancelReply{}, nil
}

func (f *fakeDispatcher) LastState(_ context.Context, k queue.JobKey) (job.State, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, ok := f.states[k.ID]
	if !ok {
		return "", false, fmt.Errorf("job %s: %w", k.ID, queue.ErrNotFound)
	}
	return st, st.Final(), nil
}

func (f *fakeDispatcher) OpenSecrets(queue.JobKey, *job.Request, string) error { return nil }

// submissions is a copy of what was submitted so far.
func (f *fakeDispatcher) submissions() []submitted {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]submitted(nil), f.subs...)
}

var errUnavailable = errors.New("no responders")
