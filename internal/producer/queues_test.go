package producer

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/capacity"
	"github.com/fleet-dev/fleet/internal/natstest"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// The pool's queues as the producer sees them (queues.go): pulls in the
// plan's order, binding to queues heard of, listings, and the tenants'
// view; against fake consumers, or a real server where NATS itself is
// what is tested.

var (
	keyHigh = queue.QueueKey{Priority: 1, Tenant: "h"}
	keyLow  = queue.QueueKey{Priority: 5, Tenant: "l"}
	keyB    = queue.QueueKey{Priority: job.DefaultPriority, Tenant: "b"}
)

// acquire takes n of p's slots, as the pull loop does before it plans.
func acquire(t *testing.T, p *Producer, n int) {
	t.Helper()
	if got, _ := p.slots.tryAcquire(n); got != n {
		t.Fatalf("took %d slots; want %d", got, n)
	}
}

// A plan over several queues pulls from the higher priority first, gives
// back at once the slots it found nothing for, learns what is left on a
// queue from the last message's metadata, counts a queue that brought
// fewer than asked as empty, and says it is done once every pull ended.
func TestPullPlannedFollowsThePlan(t *testing.T) {
	p, run := testProducer(t, Config{Slots: 6}, &fakeSource{})
	high, low := newConsumer("high"), newConsumer("low")
	qh := addQueue(p, keyHigh, high, 2)
	ql := addQueue(p, keyLow, low, 3)
	acquire(t, p, 6)
	var done atomic.Int32
	if !p.pullPlanned(6, func() { done.Add(1) }) {
		t.Fatal("pullPlanned asked for nothing with 5 jobs waiting")
	}
	// 5 are known to wait: the sixth slot is given back before any pull
	// ends.
	if n := freeSlots(p); n != 1 {
		t.Errorf("%d slots free while the pulls are open; want the 1 the plan did not use", n)
	}
	bh, bl := high.next(t), low.next(t)
	if bh.n != 2 || bl.n != 3 {
		t.Fatalf("asked high for %d, low for %d; want 2 and 3", bh.n, bl.n)
	}
	o := &ops{}
	// high says 4 more came meanwhile (NumPending after its last
	// message); low brings 1 of 3, whose metadata cannot be read.
	bh.send(msgOf(o, "h1", 5), msgOf(o, "h2", 4))
	bh.end(nil)
	low1 := msgOf(o, "l1", 0)
	low1.noMeta = true
	bl.send(low1)
	subjects := map[string]bool{}
	for _, m := range run.delivered(t, 3) {
		subjects[m.Subject()] = true
	}
	if !subjects["h1"] || !subjects["h2"] || !subjects["l1"] {
		t.Errorf("handed on %v; want h1, h2 and l1", subjects)
	}
	eventually(t, "high's pending from its last message", func() bool { return qh.pending.Load() == 4 })
	if done.Load() != 0 {
		t.Error("done before low's pull ended")
	}
	bl.end(nil)
	eventually(t, "done once both pulls ended", func() bool { return done.Load() == 1 })
	if n := ql.pending.Load(); n != 0 {
		t.Errorf("low brought 1 of the 3 asked: pending %d; want 0", n)
	}
	// 6 taken: 1 given back at once, 3 handed on; low's 2 unfilled go
	// back as its pull ends.
	if n := freeSlots(p); n != 3 {
		t.Errorf("%d slots free after the pulls; want 3 (1 unused, 2 low did not fill)", n)
	}
	time.Sleep(10 * time.Millisecond)
	if done.Load() != 1 {
		t.Errorf("done called %d times; want once", done.Load())
	}
}

// With one slot, only the higher priority is asked.
func TestPullPlannedTakesTheHigherPriorityFirst(t *testing.T) {
	p, _ := testProducer(t, Config{Slots: 1}, &fakeSource{})
	high, low := newConsumer("high"), newConsumer("low")
	addQueue(p, keyLow, low, 9)
	addQueue(p, keyHigh, high, 1)
	acquire(t, p, 1)
	if !p.pullPlanned(1, func() {}) {
		t.Fatal("asked for nothing")
	}
	if b := high.next(t); b.n != 1 {
		t.Errorf("asked high for %d; want 1", b.n)
	}
	low.none(t, 20*time.Millisecond, "of low priority with the only slot planned for high")
}

// Nothing known to wait: pullPlanned asks for nothing and leaves the
// slots to its caller.
func TestPullPlannedWithNothingWaiting(t *testing.T) {
	p, _ := testProducer(t, Config{Slots: 2}, &fakeSource{})
	a, b := newConsumer("a"), newConsumer("b")
	addQueue(p, keyA, a, 0)
	addQueue(p, keyB, b, 0)
	acquire(t, p, 2)
	if p.pullPlanned(2, func() { t.Error("done called for a plan that asked nothing") }) {
		t.Error("pullPlanned says it asked, with nothing waiting")
	}
	if n := freeSlots(p); n != 0 {
		t.Errorf("pullPlanned gave back %d slots it said were the caller's", n)
	}
}

// An empty pull from a queue a dispatcher said a job was on its way to is
// tried again a moment later (the queue is rung); one no word announced
// is not.
func TestPullFromRingsAnExpectedQueueAgain(t *testing.T) {
	p, _ := testProducer(t, Config{Slots: 2}, &fakeSource{})
	a, b := newConsumer("a"), newConsumer("b")
	a.setNoWait(func(int) (*fakeBatch, error) { return endedBatch(jetstream.ErrNoMessages), nil })
	b.setNoWait(func(int) (*fakeBatch, error) { return endedBatch(jetstream.ErrNoMessages), nil })
	qa := addQueue(p, keyA, a, 1)
	qb := addQueue(p, keyB, b, 1)
	qa.expect()
	start := time.Now().UnixNano()
	acquire(t, p, 2)
	p.pullFrom(take{q: qa, n: 1})
	p.pullFrom(take{q: qb, n: 1})
	if n := freeSlots(p); n != 2 {
		t.Errorf("%d slots free after two empty pulls; want both back", n)
	}
	// Both brought fewer than asked: empty, until the ring.
	if qb.pending.Load() != 0 {
		t.Errorf("b pending %d after an empty pull; want 0", qb.pending.Load())
	}
	eventually(t, "the expected queue rung again", func() bool { return qa.rung.Load() >= start })
	if qa.pending.Load() != 1 {
		t.Errorf("a pending %d once rung; want 1", qa.pending.Load())
	}
	select {
	case <-p.qs.wake:
	default:
		t.Error("the ring did not wake the pull loop")
	}
	time.Sleep(20 * time.Millisecond)
	if qb.rung.Load() != 0 {
		t.Error("a queue nobody announced a job for was rung")
	}
}

// A pull nobody answered says nothing of what waits: the queue keeps what
// it was known to hold, and the consumer is asked whether it exists; a
// pull that fails because the consumer is gone makes the queue again.
func TestPullFromUnansweredOrGone(t *testing.T) {
	src := &fakeSource{}
	p, _ := testProducer(t, Config{Slots: 2}, src)
	a, b := newConsumer("a"), newConsumer("b")
	a.setNoWait(func(int) (*fakeBatch, error) { return endedBatch(nats.ErrNoResponders), nil })
	b.setNoWait(func(int) (*fakeBatch, error) { return nil, jetstream.ErrConsumerDeleted })
	qa := addQueue(p, keyA, a, 3)
	addQueue(p, keyB, b, 3)
	acquire(t, p, 2)
	qa.pending.Add(-1) // counted as taken by the plan
	p.pullFrom(take{q: qa, n: 1})
	if n := qa.pending.Load(); n != 2 {
		t.Errorf("after an unanswered pull a holds %d; want the 2 the plan left", n)
	}
	eventually(t, "the unanswered consumer asked about", func() bool { return a.infoCalls() == 1 })
	p.pullFrom(take{q: p.qs.get(keyB), n: 1})
	if n := src.bindCount(keyB); n != 1 {
		t.Errorf("a pull from a deleted consumer made the queue %d times; want once", n)
	}
	if q := p.qs.get(keyB); q == nil || q.cons == b {
		t.Error("b was not made again")
	}
	if n := freeSlots(p); n != 2 {
		t.Errorf("%d slots free after the two pulls; want 2", n)
	}
}

// A second queue bound while a pull request waits on the pool's only
// queue cuts its wait: its slots come back at once for the plan. What the
// cut request brings after, when every slot runs the new queue's jobs, is
// handed back to its queue with a delay that outlasts the request
// (NakWithDelay), not handed on, and the queue is rung then.
func TestBindingASecondQueueCutsTheWaitAndHandsBack(t *testing.T) {
	src := &fakeSource{}
	fetchWait := 300 * time.Millisecond
	p, run := testProducer(t, Config{Slots: 2, FetchWait: fetchWait, PausePoll: time.Minute}, src)
	a := newConsumer("a")
	qa := addQueue(p, keyA, a, 0)
	started := time.Now()
	startPull(p)
	ba := a.next(t)
	if ba.n != 2 {
		t.Fatalf("asked the only queue for %d; want 2", ba.n)
	}
	asked := time.Now()
	qb, err := p.bindQueue(context.Background(), keyB)
	if err != nil {
		t.Fatal(err)
	}
	if src.bindCount(keyB) != 1 {
		t.Fatal("bindQueue did not bind through the source")
	}
	if again, _ := p.bindQueue(context.Background(), keyB); again != qb || src.bindCount(keyB) != 1 {
		t.Error("binding to a known queue bound again")
	}
	// Nothing is known to wait: the loop plans nothing and leaves the
	// slots the cut gave back free.
	eventually(t, "the cut request's slots back", func() bool { return freeSlots(p) == 2 })

	// b gets two jobs: the loop pulls both, and every slot is b's.
	b := src.made[keyB][0]
	qb.pending.Store(1)
	p.qs.ring(qb)
	bb := b.next(t)
	if bb.n != 2 {
		t.Fatalf("asked b for %d; want 2", bb.n)
	}
	o := &ops{}
	late := msgOf(o, "late", 0)
	rung := qa.rung.Load()
	sent := time.Now()
	ba.send(late)
	eventually(t, "the late job handed back", func() bool { return len(o.all()) == 1 })
	heard := time.Now()
	run.nothingDelivered(t)
	op := o.all()[0]
	d, err := time.ParseDuration(strings.TrimPrefix(op, "nak "))
	if !strings.HasPrefix(op, "nak ") || err != nil {
		t.Fatalf("the late job: %q; want a nak with a delay", op)
	}
	// The job comes back handBackAfter after the cut request expires
	// (FetchWait after it was made, between started and asked), counted
	// from the hand-back (between sent and heard); at once plus
	// handBackAfter if it had expired already. The bounds hold whatever
	// the machine's speed.
	lo := max(started.Add(fetchWait).Sub(heard), 0) + handBackAfter
	hi := max(asked.Add(fetchWait).Sub(sent), 0) + handBackAfter
	if d < lo || d > hi {
		t.Errorf("handed back with a delay of %v; want from %v to %v", d, lo, hi)
	}
	// The queue is rung once the delay is over, not before.
	eventually(t, "a rung once the hand-back is due", func() bool { return qa.rung.Load() != rung })
	if at := time.Unix(0, qa.rung.Load()); at.Before(sent.Add(d)) {
		t.Errorf("rung %v after the late job was sent; want at least its delay, %v", at.Sub(sent), d)
	}
}

// A queue of a higher priority heard of, whose bind does not answer yet
// (its consumer has no leader: made while its stream elected one), holds
// back the pool's only queue: the pull request waiting there has its
// wait cut, and no fetch goes to it while the bind lasts. Once bound, the
// new queue, with the one job heard of, is pulled from first.
func TestAHigherQueueBeingBoundHoldsTheLowerOnes(t *testing.T) {
	release := make(chan struct{})
	hi := newConsumer("hi")
	src := &fakeSource{}
	src.bindFn = func(ctx context.Context, k queue.QueueKey) (jetstream.Consumer, error) {
		select {
		case <-release:
			return hi, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	p, run := testProducer(t, Config{Slots: 2, FetchWait: time.Minute, PausePoll: time.Minute}, src)
	lo := newConsumer("lo")
	addQueue(p, keyLow, lo, 100)
	run.mu.Lock()
	run.known = append(run.known, hi)
	run.mu.Unlock()
	startPull(p)
	if b := lo.next(t); b.n != 2 {
		t.Fatalf("asked the only queue for %d; want 2", b.n)
	}
	p.heard(keyHigh, true)
	eventually(t, "the waiting pull request cut, its slots back", func() bool { return freeSlots(p) == 2 })
	lo.none(t, 300*time.Millisecond, "from the lower queue while the higher one is bound")
	close(release)
	if b := hi.next(t); b.n != 1 {
		t.Errorf("asked the new queue for %d; want 1, the job heard of", b.n)
	}
}

// A queue heard of twice at once is bound by one goroutine: the second
// word finds it being bound, and the queue is rung once, by the goroutine
// that bound it. A word on a known queue rings it, and notes a job on its
// way when a dispatcher told it.
func TestHeardBindsOnceAQueueHeardTwice(t *testing.T) {
	release := make(chan struct{})
	src := &fakeSource{}
	src.bindFn = func(ctx context.Context, k queue.QueueKey) (jetstream.Consumer, error) {
		<-release
		return newConsumer(k.Tenant), nil
	}
	p, _ := testProducer(t, Config{Slots: 2}, src)
	addQueue(p, keyA, newConsumer("a"), 100)
	p.heard(keyB, false)
	eventually(t, "the bind started", func() bool { return src.bindCount(keyB) == 1 })
	p.heard(keyB, false)
	if p.qs.startBinding(keyB) {
		t.Error("startBinding allowed a second goroutine while one binds")
	}
	close(release)
	eventually(t, "the queue bound", func() bool { return p.qs.get(keyB) != nil })
	eventually(t, "the binding ended", func() bool {
		if !p.qs.startBinding(keyB) {
			return false
		}
		p.qs.endBinding(keyB)
		return true
	})
	if n := p.qs.get(keyB).pending.Load(); n != 1 {
		t.Errorf("the queue heard of twice at once holds %d; want 1 (rung by the one goroutine that bound it)", n)
	}
	if n := src.bindCount(keyB); n != 1 {
		t.Errorf("bound %d times; want once", n)
	}
	qa := p.qs.get(keyA)
	p.heard(keyA, true)
	if qa.pending.Load() != 101 || qa.told.Load() == 0 {
		t.Errorf("a known queue heard of: pending %d, told %d; want 101 and a time", qa.pending.Load(), qa.told.Load())
	}
}

// startBinding lets one goroutine bind a queue at a time, per queue;
// endBinding lets the next.
func TestStartBindingOnePerQueue(t *testing.T) {
	qs := &queueSet{queues: newQueues()}
	if !qs.startBinding(keyA) || !qs.startBinding(keyB) {
		t.Fatal("the first binding of a queue refused")
	}
	if qs.startBinding(keyA) {
		t.Error("a second binding of a while one runs")
	}
	qs.endBinding(keyA)
	if !qs.startBinding(keyA) {
		t.Error("a binding of a refused after the last ended")
	}
	if qs.startBinding(keyB) {
		t.Error("b's binding ended with a's")
	}
}

// bindHeard tries again, bindPause later, after a bind that failed, each
// try bounded by bindTry; it gives up as soon as the pull stops.
func TestBindHeardTriesAgainUntilThePullStops(t *testing.T) {
	var mu sync.Mutex
	var deadlines []time.Duration
	fails := 1
	src := &fakeSource{}
	src.bindFn = func(ctx context.Context, k queue.QueueKey) (jetstream.Consumer, error) {
		mu.Lock()
		defer mu.Unlock()
		d, _ := ctx.Deadline()
		deadlines = append(deadlines, time.Until(d))
		if fails != 0 {
			fails--
			return nil, nats.ErrTimeout
		}
		return newConsumer(k.Tenant), nil
	}
	p, _ := testProducer(t, Config{Slots: 1}, src)
	start := time.Now()
	q, err := p.bindHeard(keyB)
	if err != nil || q == nil || p.qs.get(keyB) != q {
		t.Fatalf("bindHeard: %v, %v; want the queue bound at the second try", q, err)
	}
	if took := time.Since(start); took < bindPause {
		t.Errorf("the second try came %v after the first; want bindPause, %v", took, bindPause)
	}
	mu.Lock()
	if len(deadlines) != 2 {
		t.Errorf("%d tries; want 2", len(deadlines))
	}
	for _, d := range deadlines {
		if d > bindTry || d < bindTry-time.Second {
			t.Errorf("a try bounded by %v; want bindTry, %v", d, bindTry)
		}
	}
	fails = -1 // from now on every bind fails
	mu.Unlock()

	ended := make(chan error, 1)
	go func() { _, err := p.bindHeard(keyA); ended <- err }()
	eventually(t, "a first try", func() bool { return src.bindCount(keyA) >= 1 })
	p.Halt()
	select {
	case err := <-ended:
		if err == nil {
			t.Error("bindHeard stopped by halt says it bound")
		}
	case <-time.After(time.Second):
		t.Fatal("bindHeard went on a second after the pull stopped")
	}
}

// refreshQueues binds to the queues listed and stores what waits on each,
// waking the loop when any has work; it lists again no sooner than
// listEvery, and after a listing that failed no sooner than listBackoff.
func TestRefreshQueuesListsNoMoreOftenThanSaid(t *testing.T) {
	var fail atomic.Bool
	src := &fakeSource{listFn: func(context.Context) (map[queue.QueueKey]*jetstream.ConsumerInfo, error) {
		if fail.Load() {
			return nil, nats.ErrTimeout
		}
		return map[queue.QueueKey]*jetstream.ConsumerInfo{
			keyA: {NumPending: 3, NumAckPending: 1},
			keyB: {},
		}, nil
	}}
	p, _ := testProducer(t, Config{Slots: 2}, src)
	ctx := context.Background()
	before := time.Now()
	p.refreshQueues(ctx)
	qa, qb := p.qs.get(keyA), p.qs.get(keyB)
	if qa == nil || qb == nil {
		t.Fatalf("after a listing of a and b: a %v, b %v", qa, qb)
	}
	if qa.pending.Load() != 3 || qa.unacked.Load() != 1 || qb.pending.Load() != 0 {
		t.Errorf("a holds %d pending, %d unacked; b %d pending; want 3, 1 and 0", qa.pending.Load(), qa.unacked.Load(), qb.pending.Load())
	}
	select {
	case <-p.qs.wake:
	default:
		t.Error("a listing with work waiting did not wake the pull loop")
	}
	if next := p.qs.nextList.Sub(before); next < listEvery || next > listEvery+time.Second {
		t.Errorf("next listing %v later; want listEvery, %v", next, listEvery)
	}
	p.refreshQueues(ctx)
	if n := src.listCount(); n != 1 {
		t.Errorf("listed %d times within listEvery; want once", n)
	}

	// A listing that fails keeps what was known, and waits listBackoff.
	p.qs.nextList = time.Now().Add(-time.Millisecond)
	fail.Store(true)
	before = time.Now()
	p.refreshQueues(ctx)
	if n := src.listCount(); n != 2 {
		t.Fatalf("%d listings once listEvery passed; want 2", n)
	}
	if next := p.qs.nextList.Sub(before); next < listBackoff || next > listBackoff+time.Second {
		t.Errorf("after a failed listing the next is %v later; want listBackoff, %v", next, listBackoff)
	}
	if p.qs.get(keyA) != qa || qa.pending.Load() != 3 {
		t.Error("a failed listing changed what was known")
	}
}

// bindQueues binds to what the listing returns, with what waits on each;
// a listing that fails leaves the start to go on.
func TestBindQueuesBindsWhatIsListed(t *testing.T) {
	srv := natstest.Run(t)
	nc := srv.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var fail atomic.Bool
	src := &fakeSource{listFn: func(context.Context) (map[queue.QueueKey]*jetstream.ConsumerInfo, error) {
		if fail.Load() {
			return nil, nats.ErrTimeout
		}
		return map[queue.QueueKey]*jetstream.ConsumerInfo{keyA: {NumPending: 2, NumAckPending: 5}}, nil
	}}
	p, _ := testProducer(t, Config{Slots: 2, Pool: "nostream"}, src)
	p.js = js // the pool has no stream: fromSingleConsumer's error is logged
	if err := p.bindQueues(context.Background()); err != nil {
		t.Fatal(err)
	}
	q := p.qs.get(keyA)
	if q == nil || q.pending.Load() != 2 || q.unacked.Load() != 5 {
		t.Fatalf("queue bound: %+v; want a with 2 pending, 5 unacked", q)
	}
	fail.Store(true)
	p2, _ := testProducer(t, Config{Slots: 2, Pool: "nostream"}, src)
	p2.nc, p2.js = nc, js // with no queue known, it listens
	if err := p2.bindQueues(context.Background()); err != nil {
		t.Errorf("bindQueues with a listing that failed: %v; want the start to go on", err)
	}
}

// unanswered asks whether the consumer exists once per checkEvery at
// most, and makes the queue again only when the server says it does not.
func TestUnansweredAsksOnceASecond(t *testing.T) {
	src := &fakeSource{}
	p, _ := testProducer(t, Config{Slots: 1}, src)
	c := newConsumer("a")
	var exists atomic.Bool
	exists.Store(true)
	c.setInfo(func() (*jetstream.ConsumerInfo, error) {
		if exists.Load() {
			return &jetstream.ConsumerInfo{}, nil
		}
		return nil, jetstream.ErrConsumerNotFound
	})
	q := addQueue(p, keyA, c, 0)
	for range 5 {
		p.unanswered(q)
	}
	eventually(t, "the consumer asked about", func() bool { return c.infoCalls() == 1 })
	p.unanswered(q)
	time.Sleep(20 * time.Millisecond)
	if n := c.infoCalls(); n != 1 {
		t.Errorf("asked %d times within a second; want once", n)
	}
	if src.bindCount(keyA) != 0 {
		t.Error("made again a queue whose consumer exists")
	}
	// A second later (as its clock says), gone: made again.
	exists.Store(false)
	q.checked.Store(time.Now().Add(-checkEvery).UnixNano())
	p.unanswered(q)
	eventually(t, "the queue made again", func() bool { return src.bindCount(keyA) == 1 })
	eventually(t, "the new consumer in place", func() bool { return p.qs.get(keyA) != q })
	if c.infoCalls() != 2 {
		t.Errorf("asked %d times in all; want 2", c.infoCalls())
	}
}

// rebind keeps what was known to wait, or what the new consumer found, if
// more; it does nothing for a queue already made again.
func TestRebindKeepsWhatWaits(t *testing.T) {
	src := &fakeSource{}
	made := newConsumer("new")
	made.pending = 7
	src.bindFn = func(context.Context, queue.QueueKey) (jetstream.Consumer, error) { return made, nil }
	p, _ := testProducer(t, Config{Slots: 1}, src)
	q := addQueue(p, keyA, newConsumer("old"), 3)
	p.rebind(q)
	fresh := p.qs.get(keyA)
	if fresh == q || fresh.cons != made || fresh.pending.Load() != 7 {
		t.Fatalf("after rebind: %+v; want the new consumer with its 7 waiting", fresh)
	}
	p.rebind(q) // the old one again: made already
	if n := src.bindCount(keyA); n != 1 {
		t.Errorf("rebind of a queue made again bound %d times; want once", n)
	}
	made.pending = 1
	fresh.pending.Store(4)
	p.rebind(fresh)
	if n := p.qs.get(keyA).pending.Load(); n != 4 {
		t.Errorf("after a rebind that found 1, the queue holds %d; want the 4 known", n)
	}
}

// fakeShares is a Capacity that says what it last learned of the pool.
type fakeShares struct{ s capacity.Shares }

func (s fakeShares) Reserve(context.Context, capacity.Lease) error { return nil }
func (s fakeShares) Release(context.Context, capacity.Lease) error { return nil }
func (s fakeShares) SetPolicy(*job.PoolPolicy)                     {}
func (s fakeShares) Shares() capacity.Shares                       { return s.s }

// tenantView's load is what a tenant holds here (and, with shares, on the
// other workers, in its dominant resource) plus its decayed usage; a
// tenant at its quota is blocked.
func TestTenantViewLoadAndQuota(t *testing.T) {
	p, run := testProducer(t, Config{Slots: 10}, &fakeSource{})
	run.held["a"] = capacity.Holding{Slots: 2}
	run.held["c"] = capacity.Holding{Slots: 3}
	now := time.Now()
	p.usage.add("a", 10*time.Minute, job.DefaultHalfLife, now) // ln 2 slots
	policy := &job.PoolPolicy{Quotas: map[string]job.Quota{"c": {Slots: 3}, "a": {Slots: 5}}}

	view := p.tenantView(policy, nil, now)
	near := func(got, want float64) bool { return math.Abs(got-want) < 1e-6 }
	if v := view("a"); !near(v.load, 2+math.Ln2) || v.blocked {
		t.Errorf("a holding 2 slots with ln 2 of usage, quota 5: %+v; want load %.3f, not blocked", v, 2+math.Ln2)
	}
	if v := view("c"); !near(v.load, 3) || !v.blocked {
		t.Errorf("c holding its quota of 3: %+v; want load 3, blocked", v)
	}
	if v := view("z"); v.load != 0 || v.blocked {
		t.Errorf("a tenant with nothing: %+v", v)
	}

	// With what Redis said: a holds 1 more slot and half the pool's CPU
	// elsewhere, 5 of 10 slots' worth; its usage there is 1.5 slots.
	sh := &capacity.Shares{At: now, Slots: 10, CPUMilli: 1000, Tenants: map[string]capacity.TenantUse{
		"a": {Others: capacity.Holding{Slots: 1, CPUMilli: 500}, Usage: 1.5 * float64(job.DefaultHalfLife.Milliseconds()) / math.Ln2},
		"c": {Others: capacity.Holding{Slots: 1}},
	}}
	view = p.tenantView(policy, sh, now)
	if v := view("a"); !near(v.load, 5+1.5) || v.blocked {
		t.Errorf("a with half the CPU and 1.5 slots of usage: %+v; want load 6.5", v)
	}
	if v := view("c"); !near(v.load, 4) || !v.blocked {
		t.Errorf("c holding 3 here and 1 elsewhere, quota 3: %+v; want load 4, blocked", v)
	}
}

// pullPlanned asks for nothing while the pool runs its max_running, all
// workers together.
func TestPullPlannedStopsAtMaxRunning(t *testing.T) {
	p, run := testProducer(t, Config{Slots: 4, Capacity: fakeShares{capacity.Shares{At: time.Now(), Slots: 8, Used: 3}}}, &fakeSource{})
	p.policy.Store(&job.PoolPolicy{MaxRunning: 4})
	a, b := newConsumer("a"), newConsumer("b")
	addQueue(p, keyA, a, 5)
	addQueue(p, keyB, b, 5)
	run.mu.Lock()
	run.running = 1
	run.mu.Unlock()
	acquire(t, p, 3)
	if p.pullPlanned(3, func() {}) {
		t.Error("asked with 3 running elsewhere and 1 here, max_running 4")
	}
	run.mu.Lock()
	run.running = 0
	run.mu.Unlock()
	if !p.pullPlanned(3, func() {}) {
		t.Error("asked for nothing with one to go before max_running")
	}
}

// listen subscribes to the live copies of queued jobs while the pool has
// several queues and one is shallow, and not for a single queue or while
// every queue is deep; a live copy heard rings its queue (onQueued), and a
// dispatcher's word of a new queue binds it (onNewQueue).
func TestListenHearsQueuedJobsWhileNeeded(t *testing.T) {
	srv := natstest.Run(t)
	nc := srv.Connect(t)
	src := &fakeSource{}
	p, _ := testProducer(t, Config{Slots: 2, Pool: "lp"}, src)
	p.nc = nc
	subs := func() int {
		p.qs.mu.Lock()
		defer p.qs.mu.Unlock()
		return len(p.qs.subs)
	}
	qa := addQueue(p, keyA, newConsumer("a"), 0)
	if err := p.listen(); err != nil || subs() != 0 {
		t.Fatalf("one queue: %v, %d subscriptions; want none", err, subs())
	}
	qb := addQueue(p, keyB, newConsumer("b"), 100)
	if err := p.listen(); err != nil {
		t.Fatal(err)
	}
	if n := subs(); n != job.LowestPriority-job.HighestPriority+1 {
		t.Fatalf("a shallow queue of two: %d subscriptions; want one a priority", n)
	}

	live := func(q *workQueue, pool string) {
		t.Helper()
		subject := p.names.JobLive(q.key.Tenant, pool, queue.KindQueued(q.key.Priority), "j1")
		if err := nc.Publish(subject, []byte("{}")); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	// Another pool's job, or not a queued version: not heard.
	p.onQueued(&nats.Msg{Subject: p.names.JobLive("a", "other", queue.KindQueued(qa.key.Priority), "j0")})
	p.onQueued(&nats.Msg{Subject: p.names.JobLive("a", "lp", "running", "j0")})
	live(qa, "lp")
	eventually(t, "a's job heard", func() bool { return qa.pending.Load() == 1 })
	if qb.pending.Load() != 100 {
		t.Error("a live copy of a's job rang b")
	}

	// A new queue, told by a dispatcher: bound, and expected.
	keyC := queue.QueueKey{Priority: 2, Tenant: "c"}
	p.onNewQueue(&nats.Msg{Subject: p.names.PoolQueues("lp"), Data: []byte(p.names.QueueConsumer(2, "c")), Header: nats.Header{}})
	eventually(t, "c bound", func() bool { q := p.qs.get(keyC); return q != nil && q.told.Load() != 0 })
	w := &nats.Msg{Subject: p.names.PoolQueues("lp"), Data: []byte(p.names.QueueConsumer(4, "d")), Header: nats.Header{}}
	w.Header.Set(queue.HeaderPoolRevision, "1")
	p.onNewQueue(w)
	time.Sleep(20 * time.Millisecond)
	if n := src.bindCount(queue.QueueKey{Priority: 4, Tenant: "d"}); n != 0 {
		t.Error("a word on the pool's state was taken for a new queue")
	}

	// Every queue deep: the subscriptions end.
	for _, q := range []*workQueue{qa, qb, p.qs.get(keyC)} {
		q.pending.Store(int64(5 * p.cfg.Slots))
	}
	if err := p.listen(); err != nil || subs() != 0 {
		t.Errorf("every queue deep: %v, %d subscriptions; want none", err, subs())
	}
	qa.pending.Store(0)
	if err := p.listen(); err != nil || subs() == 0 {
		t.Fatalf("a queue shallow again: %v, no subscription", err)
	}
	p.unlisten()
	p.qs.mu.Lock()
	for _, s := range p.qs.subs {
		if s.IsValid() {
			t.Error("a subscription outlived unlisten")
		}
	}
	p.qs.mu.Unlock()
}

// fromSingleConsumer makes a queue for each tenant and priority that an
// older fleet queued jobs of for its single consumer, and nothing when
// that consumer does not exist.
func TestFromSingleConsumerMakesTheQueuesOfItsJobs(t *testing.T) {
	srv := natstest.Run(t)
	nc := srv.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	src := &fakeSource{}
	p, _ := testProducer(t, Config{Slots: 1, Pool: "old"}, src)
	p.js = js
	if err := p.fromSingleConsumer(ctx); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("with no stream: %v; want stream not found", err)
	}
	n := p.names
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: n.PoolStreamV2("old"), Subjects: []string{n.PoolSubjects("old")}}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{
		n.PoolJob("old", queue.KindQueued(1), "x", "j1"),
		n.PoolJob("old", queue.KindQueued(1), "x", "j2"),
		n.PoolJob("old", queue.KindQueued(3), "y", "j3"),
		n.PoolJob("old", "running", "z", "j4"), // not a queued version
	} {
		if _, err := js.Publish(ctx, s, []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.fromSingleConsumer(ctx); err != nil || len(src.binds) != 0 {
		t.Fatalf("without the single consumer: %v, bound %v; want nothing", err, src.binds)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, n.PoolStreamV2("old"), jetstream.ConsumerConfig{Durable: n.PoolConsumer("old")}); err != nil {
		t.Fatal(err)
	}
	if err := p.fromSingleConsumer(ctx); err != nil {
		t.Fatal(err)
	}
	want := []queue.QueueKey{{Priority: 1, Tenant: "x"}, {Priority: 3, Tenant: "y"}}
	for _, k := range want {
		if src.bindCount(k) != 1 || p.qs.get(k) == nil {
			t.Errorf("queue %v: bound %d times; want once", k, src.bindCount(k))
		}
	}
	if len(src.binds) != len(want) {
		t.Errorf("bound %v; want %v", src.binds, want)
	}
}
