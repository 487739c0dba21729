package producer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/capacity"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// The worker's side of a pool's queues: binding to them, learning what
// waits on them, and hearing of new work (see share.go for the order).
//
// A worker lists its pool's queues when it starts and every listEvery,
// and hears of a new one from the dispatcher that made it. With one queue
// it does what a FIFO worker does: its pull requests wait on the queue's
// consumer, until a second queue is bound, which cuts their wait (see
// waiting). With several, it pulls from them in the plan's order, and,
// while one runs shallow, hears the live copies of the versions that queue
// jobs (a message each, which the stream publishes once stored), so that
// it knows which queues have work without asking. A queue whose consumer
// was deleted (by hand) is made again at once: it finds again what was
// queued on it. The server says a consumer was deleted once, to the pull
// requests waiting on it; after that, and to a consumer deleted while none
// waited, pull requests get no answer but "no responders", which is also
// what they get while the consumer elects a leader: the worker then asks
// whether the consumer exists (see unanswered).

// source is where a pool's queues are: its consumers in JetStream
// (streamSource), or a test's.
type source interface {
	// bind makes or binds to queue k's consumer.
	bind(ctx context.Context, k queue.QueueKey) (jetstream.Consumer, error)
	// list returns the pool's queues, and what each has waiting.
	list(ctx context.Context) (map[queue.QueueKey]*jetstream.ConsumerInfo, error)
}

// streamSource is the pool's consumers in its stream.
type streamSource struct {
	js   jetstream.JetStream
	cfg  queue.Config
	pool string
}

func (s streamSource) bind(ctx context.Context, k queue.QueueKey) (jetstream.Consumer, error) {
	return queue.BindQueue(ctx, s.js, s.cfg, s.pool, k)
}

func (s streamSource) list(ctx context.Context) (map[queue.QueueKey]*jetstream.ConsumerInfo, error) {
	return queue.Queues(ctx, s.js, s.cfg, s.pool)
}

// queueSet is the worker's binding to its pool's queues.
type queueSet struct {
	*queues
	mu   sync.Mutex // binds one queue at a time
	subs []*nats.Subscription
	// binding are the queues heard of that a goroutine is binding to:
	// each was heard of for a job, and while one is bound the queues of
	// a lower priority get no slot (see held).
	bindingMu sync.Mutex
	binding   map[queue.QueueKey]bool
	// nextList is when refreshQueues lists the queues again (its loop
	// only reads and writes it).
	nextList time.Time
	// waits are the pull requests waiting on the pool's only queue.
	waitMu sync.Mutex
	waits  map[*waiting]struct{}
}

// waiting is a pull request of the pull loop waiting on the pool's only
// queue (for up to FetchWait), the slots it holds for what it brings, and
// its place among the loop's open fetches. When the pool gets another
// queue, its wait is cut (queueSet.cut): the slots it has not filled and
// its place go back at once, for the pull loop to plan between the
// queues, rather than when it expires. A pull request cannot
// be withdrawn (the server has no such request, and one whose inbox is
// dropped loses what the server sent it meanwhile until the ack wait), so
// it stays open until it expires: a job it still brings takes a slot that
// is free, or, with none, goes back to its queue once the request has
// expired (handBack).
type waiting struct {
	room  atomic.Int64 // slots it may still fill
	until time.Time    // when it expires
	free  func()       // gives its place among the open fetches back, once
}

// take reports whether the request may hand on one more message in a slot
// of its own.
func (r *waiting) take() bool {
	for {
		n := r.room.Load()
		if n <= 0 {
			return false
		}
		if r.room.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

// wait notes a pull request about to wait on the only queue with n slots
// for up to d; free gives its place among the open fetches back, and is
// called once, whether by its end or by a cut.
func (s *queueSet) wait(n int, d time.Duration, free func()) *waiting {
	r := &waiting{until: time.Now().Add(d), free: sync.OnceFunc(free)}
	r.room.Store(int64(n))
	s.waitMu.Lock()
	defer s.waitMu.Unlock()
	if s.waits == nil {
		s.waits = map[*waiting]struct{}{}
	}
	s.waits[r] = struct{}{}
	return r
}

// waited forgets a pull request that ended, and returns the slots it
// holds and did not fill.
func (s *queueSet) waited(r *waiting) int {
	s.waitMu.Lock()
	delete(s.waits, r)
	s.waitMu.Unlock()
	return int(r.room.Swap(0))
}

// cut ends the wait of the pull requests waiting on the only queue, and
// gives their places among the open fetches back: it returns how many
// requests it cut, and the slots they held and did not fill, which are
// the caller's to release.
func (s *queueSet) cut() (requests, slots int) {
	s.waitMu.Lock()
	defer s.waitMu.Unlock()
	for r := range s.waits {
		if n := r.room.Swap(0); n > 0 {
			requests++
			slots += int(n)
			r.free()
		}
	}
	return requests, slots
}

// How often a worker lists its pool's queues, and how long it waits after
// a listing that failed.
const (
	listEvery   = 5 * time.Second
	listBackoff = 30 * time.Second
)

// bindQueues binds to the queues the pool has, and first makes the
// queues of the jobs an older fleet left queued (see fromSingleConsumer).
// Neither is needed to start: while a server of the cluster is down a
// listing may not answer, and the queues are then found by the next one,
// or from the dispatchers' word.
func (p *Producer) bindQueues(ctx context.Context) error {
	if err := p.fromSingleConsumer(ctx); err != nil {
		p.log.Warn("cannot look for an older fleet's consumer; trying again at the next start", "err", err)
	}
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	found, err := p.src.list(lctx)
	cancel()
	if err != nil {
		p.log.Warn("cannot list the pool's queues yet; the next listing finds them", "err", err)
	}
	for k, info := range found {
		q, err := p.bindQueue(ctx, k)
		if err != nil {
			return err
		}
		q.pending.Store(int64(info.NumPending))
		q.unacked.Store(int64(info.NumAckPending))
	}
	return p.listen()
}

// fromSingleConsumer makes the queues of a pool whose jobs an older fleet
// queued for its single consumer jobs-<pool>: one per priority and tenant
// of the versions that queue jobs in the stream (each queue starts from the
// stream's beginning; a job that already ended is acknowledged as it is
// read). It leaves jobs-<pool> to whoever still pulls from it: a job
// taken by both starts once, its record's compare-and-set decides.
func (p *Producer) fromSingleConsumer(ctx context.Context) error {
	st, err := p.js.Stream(ctx, p.names.PoolStreamV2(p.cfg.Pool))
	if err != nil {
		return fmt.Errorf("pool %s: %w", p.cfg.Pool, err)
	}
	if _, err := st.Consumer(ctx, p.names.PoolConsumer(p.cfg.Pool)); errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil
	} else if err != nil {
		return fmt.Errorf("pool %s: %w", p.cfg.Pool, err)
	}
	keys := map[queue.QueueKey]bool{}
	for prio := job.HighestPriority; prio <= job.LowestPriority; prio++ {
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(p.names.PoolQueued(p.cfg.Pool, prio)))
		if err != nil {
			return fmt.Errorf("pool %s: the jobs queued at priority %d: %w", p.cfg.Pool, prio, err)
		}
		for subject := range info.State.Subjects {
			if _, k, ok := p.names.ParsePoolJob(subject); ok {
				keys[queue.QueueKey{Priority: prio, Tenant: k.Tenant}] = true
			}
		}
	}
	for k := range keys {
		if _, err := p.bindQueue(ctx, k); err != nil {
			return err
		}
	}
	p.log.Info("the pool had the single consumer of an older fleet: made the queues of its jobs",
		"consumer", p.names.PoolConsumer(p.cfg.Pool), "queues", len(keys))
	return nil
}

// rebind makes a queue whose consumer is gone again. The queue is kept
// until its consumer is made: an election may make a consumer look gone
// for a moment, and its fetches then work again. A create that reaches
// the server while it still removes the deleted consumer fails ("consumer
// does not exist", "error creating store for consumer"); the fetches that
// follow find no responders, and unanswered makes the queue again.
func (p *Producer) rebind(q *workQueue) {
	// Each fetch that was waiting hears of the deletion: one makes the
	// queue again (two creates of one consumer at once may fail both).
	if !q.rebinding.CompareAndSwap(false, true) {
		return
	}
	defer q.rebinding.Store(false)
	if p.qs.get(q.key) != q || p.ctx.Err() != nil {
		return // made again already, or the worker stops
	}
	ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	defer cancel()
	cons, err := p.src.bind(ctx, q.key)
	if err != nil {
		p.log.Warn("cannot make a queue again yet; its fetches go on, and it is made when they find it gone", "tenant", q.key.Tenant, "priority", q.key.Priority, "err", err)
		return
	}
	// What waits on it is what its new consumer found in the stream (it
	// starts from the beginning), or what was known, if more.
	fresh := &workQueue{key: q.key, cons: cons}
	fresh.pending.Store(max(q.pending.Load(), int64(cons.CachedInfo().NumPending)))
	p.qs.mu.Lock()
	p.qs.forget(q)
	p.qs.add(fresh)
	p.qs.mu.Unlock()
	select {
	case p.qs.wake <- struct{}{}:
	default:
	}
	p.log.Info("made a queue whose consumer was gone again", "tenant", q.key.Tenant, "priority", q.key.Priority)
}

// checkEvery bounds how often a worker asks whether a queue's consumer
// exists, while its fetches find no responders.
const checkEvery = time.Second

// unanswered follows a fetch from q that found no responders: nothing
// serves the pull requests of q's consumer. Either the consumer has no
// leader for the moment (an election: the fetches work again once one is
// elected) or it is gone (deleted while no pull request waited on it, or
// made again by a create that came too early). Only the server can tell:
// the queue is made again when it says the consumer does not exist; it is
// asked once every checkEvery at most, a request to one consumer's leader,
// beside the pulls (with no meta leader, nobody answers it for a while).
func (p *Producer) unanswered(q *workQueue) {
	now := time.Now().UnixNano()
	last := q.checked.Load()
	if now-last < int64(checkEvery) || !q.checked.CompareAndSwap(last, now) {
		return
	}
	p.pulling.Add(1)
	go func() {
		defer p.pulling.Done()
		ctx, cancel := context.WithTimeout(p.ctx, 2*time.Second)
		defer cancel()
		if _, err := q.cons.Info(ctx); gone(err) {
			p.rebind(q)
		}
	}()
}

// bindQueue binds to one queue, known or not.
func (p *Producer) bindQueue(ctx context.Context, k queue.QueueKey) (*workQueue, error) {
	p.qs.mu.Lock()
	defer p.qs.mu.Unlock()
	if q := p.qs.get(k); q != nil {
		return q, nil
	}
	cons, err := p.src.bind(ctx, k)
	if err != nil {
		return nil, err
	}
	q := &workQueue{key: k, cons: cons}
	if p.qs.add(q) {
		p.cutWaits()
	}
	p.log.Debug("bound to queue", "tenant", k.Tenant, "priority", k.Priority)
	return q, nil
}

// cutWaits follows a queue new to the worker: the pull requests waiting on
// what was the pool's only queue hold every free slot until they expire
// (FetchWait), and the pull loop looks at the queues only then; their waits
// are cut, so that the pull loop plans those slots between the queues now
// (a new tenant's first job, or a priority's, starts as soon as it is
// queued).
func (p *Producer) cutWaits() {
	requests, n := p.qs.cut()
	if requests == 0 {
		return
	}
	p.m.cut.Add(context.Background(), int64(requests), p.m.poolAttrs)
	p.slots.release(n)
	p.log.Debug("the pool has another queue: cut the wait of the pull requests on its first", "requests", requests, "slots", n)
}

// handBack gives back a message that a pull request whose wait was cut
// brought when no slot was free (see waiting), to be delivered again once
// that request has expired: delivered again at once, it would go to the
// same request, which is first in the server's line, and back, again and
// again, each time a delivery more of the job's. The queue is noted as
// having it then, for the plan.
func (p *Producer) handBack(q *workQueue, req *waiting, msg jetstream.Msg) {
	p.m.handedBack.Add(context.Background(), 1, p.m.poolAttrs)
	delay := max(time.Until(req.until), 0) + handBackAfter
	if err := msg.NakWithDelay(delay); err != nil {
		p.log.Warn("cannot hand back a job brought by a pull request whose wait was cut; it comes back after the ack wait",
			"subject", msg.Subject(), "err", err)
		return
	}
	p.log.Debug("handed back a job brought by a pull request whose wait was cut, no slot free", "subject", msg.Subject(), "delay", delay)
	time.AfterFunc(delay, func() { p.qs.ring(q) })
}

// handBackAfter is how long after a cut pull request expired (by the
// worker's clock) what it handed back is delivered again: the server
// expires it a little later, from when it received it.
const handBackAfter = 100 * time.Millisecond

// listen subscribes to the live copies of queued versions while the
// worker needs them to know where work waits, and ends the subscriptions
// when it does not: with one queue (a FIFO pool costs no copy), and while
// every queue has a backlog of more than 4 fetches (a saturated worker
// learns of new queues by its listing every PausePoll). It listens again
// once a queue has fewer than 2 fetches waiting: as one fetch takes at
// most Slots jobs, it listens before the queue runs dry.
func (p *Producer) listen() error {
	p.qs.mu.Lock()
	defer p.qs.mu.Unlock()
	need := p.qs.only() == nil
	if need && p.qs.subs != nil {
		// Stop while every queue is deep; go on while any is shallow.
		need = p.qs.lowest() <= int64(4*p.cfg.Slots)
	} else if need {
		need = p.qs.lowest() < int64(2*p.cfg.Slots)
	}
	if !need {
		for _, s := range p.qs.subs {
			_ = s.Unsubscribe()
		}
		p.qs.subs = nil
		return nil
	}
	if p.qs.subs != nil {
		return nil
	}
	for prio := job.HighestPriority; prio <= job.LowestPriority; prio++ {
		sub, err := p.nc.Subscribe(p.names.PoolQueuedLive(p.cfg.Pool, prio), p.onQueued)
		if err != nil {
			return err
		}
		_ = sub.SetPendingLimits(-1, -1)
		p.qs.subs = append(p.qs.subs, sub)
	}
	// Jobs queued from now on are heard.
	return p.nc.Flush()
}

// onNewQueue hears from a dispatcher that it made a queue of the pool,
// for the job it is about to queue there; a word on the pool's state is
// applied at once (catchUp takes it from p.words).
func (p *Producer) onNewQueue(m *nats.Msg) {
	p.catchUp()
	if m.Header.Get(queue.HeaderPoolRevision) != "" {
		return
	}
	prio, tenant, ok := p.names.ParseQueueConsumer(string(m.Data))
	if !ok {
		return
	}
	p.heard(queue.QueueKey{Priority: prio, Tenant: tenant}, true)
}

// onQueued hears that a job was queued.
func (p *Producer) onQueued(m *nats.Msg) {
	kind, k, ok := p.names.ParseJobLive(m.Subject)
	if !ok || k.Pool != p.cfg.Pool || len(kind) != 2 {
		return
	}
	prio, err := strconv.Atoi(kind[1:])
	if err != nil || !job.ValidTenant(k.Tenant) {
		return
	}
	p.heard(queue.QueueKey{Priority: prio, Tenant: k.Tenant}, false)
}

// heard notes a job queued on a queue, binding to the queue if it is new;
// told, the job is on its way: a dispatcher said it made the queue for
// its job, before it queues it (see expected).
func (p *Producer) heard(key queue.QueueKey, told bool) {
	if q := p.qs.get(key); q != nil {
		if told {
			q.expect()
		}
		p.qs.ring(q)
		return
	}
	// A queue new to this worker: bind to it beside the callbacks, one
	// goroutine a queue. Meanwhile it holds the slots of lower
	// priorities (see held): a pull request waiting on the pool's only
	// queue, of a lower priority, has its wait cut.
	if !p.qs.startBinding(key) {
		return
	}
	if o := p.qs.only(); o != nil && o.key.Priority > key.Priority {
		p.cutWaits()
	}
	go func() {
		defer p.qs.endBinding(key)
		q, err := p.bindHeard(key)
		if err != nil {
			p.log.Warn("cannot bind to a new queue; the next listing tries again", "tenant", key.Tenant, "priority", key.Priority, "err", err)
			return
		}
		if err := p.listen(); err != nil {
			p.log.Warn("cannot listen for queued jobs", "err", err)
		}
		if told {
			q.expect()
		}
		p.qs.ring(q)
	}()
}

// bindTry bounds one try to bind to a queue heard of, bindFor all of
// them, bindPause the wait between two: a JetStream API request lost in an
// election (sent to a server that died, or while the cluster chose the
// next leader) is never answered, and a try that waits for it longer
// holds the queue's jobs that long after the election has ended (and,
// while it holds qs.mu, every other bind).
const (
	bindTry   = 2 * time.Second
	bindFor   = 30 * time.Second
	bindPause = 250 * time.Millisecond
)

// bindHeard binds to a queue heard of, trying again as bindTry says until
// bound, for bindFor at most, or until the pull stops.
func (p *Producer) bindHeard(key queue.QueueKey) (*workQueue, error) {
	give := time.Now().Add(bindFor)
	for {
		ctx, cancel := context.WithTimeout(p.ctx, bindTry)
		q, err := p.bindQueue(ctx, key)
		cancel()
		if err == nil || p.ctx.Err() != nil || time.Now().After(give) {
			return q, err
		}
		p.log.Debug("binding to a new queue; trying again", "tenant", key.Tenant, "priority", key.Priority, "err", err)
		select {
		case <-time.After(bindPause):
		case <-p.ctx.Done():
			return nil, err
		}
	}
}

// startBinding reports whether a goroutine may bind to queue k: none is
// binding to it yet; endBinding says it is done.
func (qs *queueSet) startBinding(k queue.QueueKey) bool {
	qs.bindingMu.Lock()
	defer qs.bindingMu.Unlock()
	if qs.binding[k] {
		return false
	}
	if qs.binding == nil {
		qs.binding = map[queue.QueueKey]bool{}
	}
	qs.binding[k] = true
	return true
}

// endBinding ends the binding of k, bound or given up, and wakes the
// pull loop: what k held back is planned again.
func (qs *queueSet) endBinding(k queue.QueueKey) {
	qs.bindingMu.Lock()
	delete(qs.binding, k)
	qs.bindingMu.Unlock()
	select {
	case qs.wake <- struct{}{}:
	default:
	}
}

// held returns the highest priority (the smallest number) of the queues
// being bound, 0 when none is. A queue is bound when a job was heard
// queued there, or a dispatcher said one was on its way: its jobs wait,
// and no queue of a lower priority gets a slot until it is bound (its
// pulls decide then) or given up. Binding takes a request to the
// consumer's leader; a queue made while its stream elected a leader may
// have none for seconds after the stream has one, and meanwhile the
// queues already bound would take every slot (a pool's priorities hold
// through a failover).
func (qs *queueSet) held() int {
	qs.bindingMu.Lock()
	defer qs.bindingMu.Unlock()
	h := 0
	for k := range qs.binding {
		if h == 0 || k.Priority < h {
			h = k.Priority
		}
	}
	return h
}

// refreshQueues lists the pool's queues again: new ones, and what waits
// on each by their consumers' count.
func (p *Producer) refreshQueues(ctx context.Context) {
	// A listing is a request to the cluster's JetStream API, which answers
	// it by asking each consumer's leader: not more often than listEvery,
	// and, after a listing that failed (a server down), not before
	// listBackoff, so that the workers add no load to an election.
	now := time.Now()
	if now.Before(p.qs.nextList) {
		return
	}
	p.qs.nextList = now.Add(listEvery)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	found, err := p.src.list(ctx)
	if err != nil {
		p.qs.nextList = now.Add(listBackoff)
		p.log.Debug("cannot list the pool's queues; keeping what was known", "err", err)
		return
	}
	woke := false
	for k, info := range found {
		q, err := p.bindQueue(ctx, k)
		if err != nil {
			p.log.Warn("cannot bind to a queue", "tenant", k.Tenant, "priority", k.Priority, "err", err)
			continue
		}
		q.pending.Store(int64(info.NumPending))
		q.unacked.Store(int64(info.NumAckPending))
		woke = woke || info.NumPending > 0 || info.NumAckPending > 0
	}
	if err := p.listen(); err != nil {
		p.log.Warn("cannot listen for queued jobs", "err", err)
	}
	if woke {
		select {
		case p.qs.wake <- struct{}{}:
		default:
		}
	}
}

// unlisten ends the subscriptions of listen.
func (p *Producer) unlisten() {
	p.qs.mu.Lock()
	defer p.qs.mu.Unlock()
	for _, s := range p.qs.subs {
		_ = s.Unsubscribe()
	}
}

// tenantView tells the plan what a tenant runs in the pool, its decayed
// usage, and whether its quota is full.
func (p *Producer) tenantView(policy *job.PoolPolicy, shares *capacity.Shares, now time.Time) func(string) tenantView {
	hl := policy.HalfLifeOr()
	own := p.run.Holdings()
	return func(t string) tenantView {
		h := own[t]
		var u float64
		if shares != nil && !shares.At.IsZero() {
			o := shares.Tenants[t]
			h = h.Add(o.Others)
			u = capacity.UsageSlots(capacity.Decay(o.Usage, now.Sub(shares.At), hl), hl)
		} else {
			u = p.usage.slots(t, hl, now)
		}
		v := tenantView{load: dominant(h, shares, p.cfg.Slots) + u}
		if q := policy.Quota(t); !q.Unbounded() {
			// Full: no job fits. (A GPU quota full still lets the tenant's
			// jobs without GPUs run: Redis refuses the others.)
			v.blocked = (q.Slots >= 0 && h.Slots >= q.Slots) ||
				(q.CPUMilli >= 0 && h.CPUMilli >= q.CPUMilli) || (q.MemoryBytes >= 0 && h.MemoryBytes >= q.MemoryBytes)
		}
		return v
	}
}

// dominant is what h holds in slots, or in the resource of which it holds
// the largest share of the pool, expressed as slots.
func dominant(h capacity.Holding, s *capacity.Shares, ownSlots int) float64 {
	load := float64(h.Slots)
	if s == nil || s.Slots <= 0 {
		return load
	}
	slots := float64(s.Slots)
	if s.CPUMilli > 0 {
		load = max(load, float64(h.CPUMilli)/float64(s.CPUMilli)*slots)
	}
	if s.MemoryBytes > 0 {
		load = max(load, float64(h.MemoryBytes)/float64(s.MemoryBytes)*slots)
	}
	if s.GPUs > 0 {
		load = max(load, float64(h.GPUs)/float64(s.GPUs)*slots)
	}
	return load
}

// pullPlanned pulls n jobs in the plan's order, from a pool with several
// queues, and reports whether it asked for any; when it did not, the
// slots are the caller's to give back. Its fetches go on beside the pull
// loop; done is called once they have all ended.
func (p *Producer) pullPlanned(n int, done func()) bool {
	if err := p.listen(); err != nil {
		p.log.Warn("cannot listen for queued jobs", "err", err)
	}
	policy := p.policy.Load()
	var shares *capacity.Shares
	if s, ok := p.cfg.Capacity.(capacity.Sharer); ok {
		sh := s.Shares()
		shares = &sh
	}
	now := time.Now()
	if policy != nil && shares != nil && policy.MaxRunning > 0 && shares.Used+int64(p.run.Running()) >= int64(policy.MaxRunning) {
		return false
	}
	plan := p.qs.plan(n, policy, p.tenantView(policy, shares, now), p.cfg.PausePoll, p.qs.held(), now)
	if len(plan) == 0 {
		return false
	}
	asked := 0
	for _, t := range plan {
		asked += t.n
	}
	p.slots.release(n - asked)
	var wg sync.WaitGroup
	for _, t := range plan {
		wg.Add(1)
		p.pulling.Add(1)
		go func() {
			defer p.pulling.Done()
			defer wg.Done()
			p.pullFrom(t)
		}()
	}
	p.pulling.Add(1)
	go func() {
		defer p.pulling.Done()
		wg.Wait()
		done()
	}()
	return true
}

// pullFrom pulls what is waiting on one queue, at most t.n jobs, without
// waiting for more.
func (p *Producer) pullFrom(t take) {
	start := time.Now().UnixNano()
	used := 0
	defer func() { p.slots.release(t.n - used) }()
	batch, err := t.q.cons.FetchNoWait(t.n)
	if err != nil {
		p.log.Debug("pull from queue failed", "tenant", t.q.key.Tenant, "priority", t.q.key.Priority, "err", err)
		if gone(err) {
			p.rebind(t.q)
		}
		return
	}
	last := int64(-1)
	for msg := range batch.Messages() {
		used++
		if md, err := msg.Metadata(); err == nil {
			last = int64(md.NumPending)
		}
		p.catchUp()
		p.run.Deliver(msg)
	}
	// The plan counted t.n as taken; what came says what is left. A pull
	// nobody answered (a queue just made, whose consumer has no leader
	// yet; its server down) says nothing of what waits: the queue keeps
	// what it was known to hold, and is pulled from again. Neither does an
	// empty pull from a queue whose job a dispatcher said was on its way
	// (see expected): it is pulled from again a moment later.
	unanswered := used == 0 && errors.Is(batch.Error(), nats.ErrNoResponders)
	if used > 0 {
		t.q.told.Store(0)
	} else if again, ok := t.q.expected(start); ok && !unanswered {
		p.m.pullsAgain.Add(context.Background(), 1, p.m.poolAttrs)
		time.AfterFunc(again, func() { p.qs.ring(t.q) })
	}
	switch rung := t.q.rung.Load() >= start; {
	case unanswered:
	case last >= 0 && !rung:
		t.q.pending.Store(last)
	case used < t.n && !rung:
		t.q.pending.Store(0)
	case !t.probe:
		t.q.pending.Add(int64(t.n - used))
	}
	if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, jetstream.ErrNoMessages) {
		p.log.Debug("pull from queue ended", "tenant", t.q.key.Tenant, "priority", t.q.key.Priority, "err", err)
		switch {
		case gone(err):
			p.rebind(t.q)
		case errors.Is(err, nats.ErrNoResponders):
			p.unanswered(t.q)
		}
	}
}
