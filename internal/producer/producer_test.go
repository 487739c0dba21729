package producer

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/natstest"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// The pull loop with one queue (producer.go), against a fake consumer
// whose fetches the tests answer.

var keyA = queue.QueueKey{Priority: job.DefaultPriority, Tenant: "a"}

// With one queue the loop asks for as many messages as there are free
// slots, hands every message on, keeps at most two fetches open, and
// between them never asks for more than the slots not yet filled: a
// second fetch asks only for the slot freed meanwhile, and a third waits
// for one of the two to end, then asks for what it left unfilled and
// what was freed since.
func TestPullAsksForTheFreeSlotsAndHandsOnEveryMessage(t *testing.T) {
	src := &fakeSource{}
	p, run := testProducer(t, Config{Slots: 4}, src)
	c := newConsumer("a")
	addQueue(p, keyA, c, 0)
	startPull(p)

	b1 := c.next(t)
	if b1.n != 4 {
		t.Fatalf("first fetch asked for %d; want all 4 free slots", b1.n)
	}
	o := &ops{}
	m1, m2 := msgOf(o, "j1", 0), msgOf(o, "j2", 0)
	b1.send(m1, m2)
	got := run.delivered(t, 2)
	if got[0] != m1 || got[1] != m2 {
		t.Fatalf("handed on %v; want j1 then j2", got)
	}
	// Two slots run, two wait in the first fetch: nothing is free.
	c.none(t, 50*time.Millisecond, "with no slot free")

	p.Free() // j1 ends
	if b2 := c.next(t); b2.n != 1 {
		t.Fatalf("second fetch asked for %d; want the one slot freed", b2.n)
	}
	p.Free() // j2 ends: a slot is free, but two fetches are open
	c.none(t, 50*time.Millisecond, "while two fetches were open")
	if n := freeSlots(p); n != 1 {
		t.Errorf("%d slots free with two fetches open; want the 1 freed", n)
	}

	b1.end(nats.ErrTimeout) // expires with two slots unfilled
	if b3 := c.next(t); b3.n != 3 {
		t.Fatalf("third fetch asked for %d; want 3 (the first's 2 unfilled and the one free)", b3.n)
	}
	run.nothingDelivered(t)
}

// One fetch asks for 256 messages at most, however many slots are free;
// the next asks for the rest.
func TestPullAsksFor256AtMost(t *testing.T) {
	p, _ := testProducer(t, Config{Slots: 300}, &fakeSource{})
	c := newConsumer("a")
	addQueue(p, keyA, c, 0)
	startPull(p)
	if b := c.next(t); b.n != 256 {
		t.Fatalf("first fetch of 300 free slots asked for %d; want 256", b.n)
	}
	if b := c.next(t); b.n != 44 {
		t.Fatalf("second fetch asked for %d; want the 44 slots left", b.n)
	}
}

// A fetch that fails at once because the queue's consumer is gone makes
// the queue again through the source, and the loop, after a pause (not at
// once), fetches from the new consumer with every slot.
func TestPullMakesAGoneQueueAgain(t *testing.T) {
	src := &fakeSource{}
	p, _ := testProducer(t, Config{Slots: 4}, src)
	c := newConsumer("a")
	var once sync.Once
	c.setFetch(func(n int) (*fakeBatch, error) {
		err := error(nil)
		once.Do(func() { err = fmt.Errorf("fetch: %w", jetstream.ErrConsumerDeleted) })
		return newBatch(n), err
	})
	addQueue(p, keyA, c, 0)
	failed := time.Now()
	startPull(p)

	eventually(t, "the queue made again", func() bool { return src.bindCount(keyA) == 1 })
	q := p.qs.get(keyA)
	if q == nil || q.cons == c {
		t.Fatalf("queue after the rebind: %+v; want a new consumer", q)
	}
	b := q.cons.(*fakeConsumer).next(t)
	if b.n != 4 {
		t.Errorf("the fetch from the new consumer asked for %d; want 4", b.n)
	}
	// The loop's backoff starts at 100ms, with a jitter of a fifth.
	if d := time.Since(failed); d < 70*time.Millisecond {
		t.Errorf("fetched again %v after the failure; want a backoff of about 100ms", d)
	}
	c.none(t, 20*time.Millisecond, "from the consumer that was gone")
	if n := src.bindCount(keyA); n != 1 {
		t.Errorf("made the queue %d times; want once", n)
	}
}

// Two fetches open when the consumer is deleted both hear of it: the
// queue is made again once, not once each (two creates of one consumer at
// once may both fail).
func TestPullMakesAGoneQueueAgainOnceForSeveralFetches(t *testing.T) {
	src := &fakeSource{}
	p, run := testProducer(t, Config{Slots: 2}, src)
	c := newConsumer("a")
	addQueue(p, keyA, c, 0)
	startPull(p)
	b1 := c.next(t)
	b1.send(msgOf(&ops{}, "j1", 0))
	run.delivered(t, 1)
	p.Free()
	b2 := c.next(t)

	b1.end(jetstream.ErrConsumerDeleted)
	b2.end(jetstream.ErrConsumerDeleted)
	eventually(t, "the queue made again", func() bool { return src.bindCount(keyA) >= 1 })
	eventually(t, "a fetch from the new consumer", func() bool {
		q := p.qs.get(keyA)
		return q != nil && q.cons != c && len(q.cons.(*fakeConsumer).calls) > 0
	})
	stopPull(t, p) // both fetches' goroutines have ended
	if n := src.bindCount(keyA); n != 1 {
		t.Errorf("two fetches that found the consumer gone made it again %d times; want once", n)
	}
}

// Fetches that find no responders (the consumer has no leader, or is
// gone) make the loop ask whether the consumer exists, once a second at
// most however many fetches fail, and make the queue again when the
// answer is that it does not.
func TestPullAsksWhetherAnUnansweredQueueExists(t *testing.T) {
	src := &fakeSource{}
	p, _ := testProducer(t, Config{Slots: 2}, src)
	c := newConsumer("a")
	c.setFetch(func(n int) (*fakeBatch, error) { return endedBatch(nats.ErrNoResponders), nil })
	var mu sync.Mutex
	var asked []time.Time
	c.setInfo(func() (*jetstream.ConsumerInfo, error) {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, time.Now())
		if len(asked) == 1 {
			return &jetstream.ConsumerInfo{}, nil // an election: it exists
		}
		return nil, jetstream.ErrConsumerNotFound
	})
	addQueue(p, keyA, c, 0)
	startPull(p)

	// The failed fetches pause 20, 40, 80ms...: four come well within a
	// second, and are asked about once.
	for range 4 {
		c.next(t)
	}
	eventually(t, "the consumer asked about", func() bool { return c.infoCalls() >= 1 })
	if n := c.infoCalls(); n != 1 {
		t.Fatalf("asked %d times within the first four failed fetches; want once", n)
	}
	eventually(t, "the queue made again once its consumer was said gone", func() bool { return src.bindCount(keyA) == 1 })
	mu.Lock()
	gap := asked[1].Sub(asked[0])
	mu.Unlock()
	if gap < checkEvery-50*time.Millisecond {
		t.Errorf("asked again %v after the first time; want a second at least", gap)
	}
	if q := p.qs.get(keyA); q == nil || q.cons == c {
		t.Errorf("the queue was not replaced by the consumer made again")
	}
}

// While the pool is paused the loop asks for nothing, even with every
// slot free; resumed, it asks at once.
func TestPullAsksForNothingWhilePaused(t *testing.T) {
	p, _ := testProducer(t, Config{Slots: 3}, &fakeSource{})
	c := newConsumer("a")
	addQueue(p, keyA, c, 0)
	p.setPool(&job.PoolState{Paused: true}, 1)
	startPull(p)
	c.none(t, 100*time.Millisecond, "while paused")
	if n := freeSlots(p); n != 3 {
		t.Errorf("%d of 3 slots free while paused; want every one", n)
	}
	if !p.Paused() {
		t.Error("paused() is false after a pause")
	}
	p.setPool(&job.PoolState{}, 2)
	if b := c.next(t); b.n != 3 {
		t.Errorf("once resumed, asked for %d; want 3", b.n)
	}
	if p.Paused() {
		t.Error("paused() is true once resumed")
	}
}

// A pause that comes while the loop waits for a slot holds too: when the
// open fetch ends and gives its slots back, the loop asks for nothing.
// (It fails: the loop looks at the pause only before it waits for slots,
// and fetches once more with the slots it then gets; the attempt stage
// gives what that fetch brings back, after pausedRecheck.)
func TestPullAsksForNothingOncePausedWhileWaitingForSlots(t *testing.T) {
	p, _ := testProducer(t, Config{Slots: 3}, &fakeSource{})
	c := newConsumer("a")
	addQueue(p, keyA, c, 0)
	startPull(p)
	b := c.next(t)
	// The loop waits for a slot (the slots' wake is made by a waiter).
	eventually(t, "the loop waiting for a slot", func() bool {
		p.slots.mu.Lock()
		defer p.slots.mu.Unlock()
		return p.slots.wake != nil
	})
	p.setPool(&job.PoolState{Paused: true}, 1)
	b.end(nats.ErrTimeout)
	c.none(t, 100*time.Millisecond, "after a pause, once the open fetch ended")
}

// fetchOpts asks the server to wait FetchWait and to say every quarter of
// it that it still holds the request, except when a quarter is below
// 50ms: the request is read as the server gets it.
func TestFetchOptsHeartbeatAQuarterOfTheWait(t *testing.T) {
	srv := natstest.Run(t)
	nc := srv.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "S", jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	requests, err := nc.SubscribeSync("$JS.API.CONSUMER.MSG.NEXT.S.C")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		wait, heartbeat time.Duration
	}{
		{time.Second, 250 * time.Millisecond},
		{200 * time.Millisecond, 50 * time.Millisecond},
		{199 * time.Millisecond, 0},
	} {
		p := &Producer{cfg: &Config{FetchWait: tc.wait}}
		b, err := cons.Fetch(1, p.fetchOpts()...)
		if err != nil {
			t.Fatal(err)
		}
		m, err := requests.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var req struct {
			Expires   time.Duration `json:"expires"`
			Heartbeat time.Duration `json:"idle_heartbeat"`
		}
		if err := json.Unmarshal(m.Data, &req); err != nil {
			t.Fatal(err)
		}
		if req.Expires != tc.wait || req.Heartbeat != tc.heartbeat {
			t.Errorf("FetchWait %v: the request waits %v with heartbeats every %v; want %v and %v",
				tc.wait, req.Expires, req.Heartbeat, tc.wait, tc.heartbeat)
		}
		_ = b // it ends with the connection
	}
}

// gone is true of the errors that say the consumer or its stream no
// longer exists, wrapped or not, and of nothing else.
func TestGoneIsTheConsumerOrStreamDeleted(t *testing.T) {
	for err, want := range map[error]bool{
		jetstream.ErrConsumerDeleted:                      true,
		jetstream.ErrConsumerNotFound:                     true,
		jetstream.ErrStreamNotFound:                       true,
		fmt.Errorf("x: %w", jetstream.ErrConsumerDeleted): true,
		nats.ErrNoResponders:                              false,
		nats.ErrTimeout:                                   false,
		jetstream.ErrNoMessages:                           false,
		errFake:                                           false,
	} {
		if got := gone(err); got != want {
			t.Errorf("gone(%v) = %v; want %v", err, got, want)
		}
	}
	if gone(nil) {
		t.Error("gone(nil) is true")
	}
}

// free gives a slot back and wakes what waits for one; ran counts a
// tenant's slot time in its usage.
func TestFreeAndRan(t *testing.T) {
	p, _ := testProducer(t, Config{Slots: 1}, &fakeSource{})
	if n, _ := p.slots.tryAcquire(1); n != 1 {
		t.Fatal("no slot to take")
	}
	ended := p.ended.wait()
	p.Free()
	select {
	case <-ended:
	default:
		t.Error("free did not fire ended")
	}
	if n := freeSlots(p); n != 1 {
		t.Errorf("%d slots free after free; want 1", n)
	}
	p.Ran("a", 10*time.Minute) // the default half-life: 10 min of one slot
	if u := p.usage.slots("a", job.DefaultHalfLife, time.Now()); u < 0.69 || u > 0.70 {
		t.Errorf("usage after one slot for a half-life: %.3f slots; want ln 2 = 0.693", u)
	}
	if u := p.usage.slots("b", job.DefaultHalfLife, time.Now()); u != 0 {
		t.Errorf("usage of a tenant that ran nothing: %.3f", u)
	}
}

// start binds to the listed queues and pulls; halt stops the pull (a
// fetch that ends is not followed by another, and every goroutine ends);
// close ends the subscriptions start made.
func TestStartHaltClose(t *testing.T) {
	srv := natstest.Run(t)
	nc := srv.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	src := &fakeSource{listFn: func(context.Context) (map[queue.QueueKey]*jetstream.ConsumerInfo, error) {
		return map[queue.QueueKey]*jetstream.ConsumerInfo{keyA: {NumPending: 7, NumAckPending: 2}}, nil
	}}
	p, _ := testProducer(t, Config{Slots: 2, Pool: "p1"}, src)
	p.nc, p.js = nc, js
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Start(ctx, context.Background()); err != nil {
		t.Fatal(err)
	}
	q := p.qs.get(keyA)
	if q == nil {
		t.Fatal("start did not bind to the listed queue")
	}
	if q.pending.Load() != 7 || q.unacked.Load() != 2 {
		t.Errorf("the queue bound holds %d pending, %d unacked; want the listing's 7 and 2", q.pending.Load(), q.unacked.Load())
	}
	c := q.cons.(*fakeConsumer)
	b := c.next(t)
	if b.n != 2 {
		t.Errorf("the first fetch asked for %d; want 2", b.n)
	}
	p.Halt()
	b.end(nats.ErrTimeout)
	c.none(t, 50*time.Millisecond, "after halt")
	done := make(chan struct{})
	go func() { p.pulling.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the pull did not end after halt")
	}
	if err := p.Close(ctx); err != nil {
		t.Errorf("close: %v", err)
	}
	if p.qsub.IsValid() || p.wsub.IsValid() {
		t.Error("a subscription of start outlived close")
	}
}
