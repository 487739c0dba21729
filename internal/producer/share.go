package producer

import (
	"cmp"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/capacity"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// How a worker shares its slots between the queues of its pool.
//
// A pool has one queue per tenant and priority (a durable consumer of the
// pool's stream, queue.QueueConsumer). When its slots free, the worker
// plans which queues to pull from:
//
//   - by priority first: no slot goes to a queue of priority p while a
//     queue of a higher priority (a smaller number) has jobs waiting;
//   - within a priority, one slot at a time to the tenant whose share
//     would be the smallest after taking it: (running + usage + 1) /
//     weight, where running is what the tenant runs in the whole pool (its
//     attempts here, and on the other workers as Redis last told), in
//     slots or, when it holds more of the pool's CPU, memory or GPUs than
//     of its slots, in that dominant resource expressed as slots; usage is
//     what it ran before, decayed over the pool's half-life, as the average
//     slots it held over the last half-life; weight is the policy's;
//   - a tenant at its quota, and every tenant when the pool runs its
//     max_running, gets no slot (Redis enforces both, atomically, when the
//     lease is taken; the plan only avoids asking for what would be
//     refused).
//
// Every worker plans its own slots the same way from the same queues, so
// the pool's slots follow the weights without a scheduler of their own.
// Its bounds: a tenant's running count from the other workers is as old as
// the last lease batch that touched the tenant (milliseconds under load, a
// heartbeat at most), and a queue's waiting count is what its consumer
// said when the worker last pulled from it, plus what the worker heard
// queued since.

// workQueue is what a worker knows of one queue of its pool.
type workQueue struct {
	key  queue.QueueKey
	cons jetstream.Consumer
	// pending is how many of its jobs wait, as last learned: from the
	// metadata of the last message pulled, a live copy heard, or the
	// consumer's info.
	pending atomic.Int64
	// unacked is what its consumer had delivered and not yet acknowledged
	// at the last refresh: some may be waiting to be delivered again (a
	// retry's backoff, a not_before), which pending does not count.
	unacked atomic.Int64
	// rung is when a live copy last said a job was queued (unix ns).
	rung atomic.Int64
	// told is when a dispatcher last said a job of the queue was on its
	// way (unix ns), until a pull brings one; 0 once one did.
	told atomic.Int64
	// probed is when it was last pulled from with nothing known waiting.
	probed time.Time
	// checked is when the worker last asked whether its consumer exists
	// (unix ns; see unanswered).
	checked atomic.Int64
	// rebinding is set while the worker makes its consumer again.
	rebinding atomic.Bool
}

// queues are the queues of a worker's pool.
type queues struct {
	mu   sync.Mutex
	list []*workQueue // by priority, then tenant
	// wake has a value when a queue was heard to get a job.
	wake chan struct{}
}

func newQueues() *queues { return &queues{wake: make(chan struct{}, 1)} }

func (qs *queues) get(k queue.QueueKey) *workQueue {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	for _, q := range qs.list {
		if q.key == k {
			return q
		}
	}
	return nil
}

// add notes a queue; false when it was known.
func (qs *queues) add(q *workQueue) bool {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	for _, o := range qs.list {
		if o.key == q.key {
			return false
		}
	}
	qs.list = append(qs.list, q)
	slices.SortFunc(qs.list, func(a, b *workQueue) int {
		return cmp.Or(cmp.Compare(a.key.Priority, b.key.Priority), cmp.Compare(a.key.Tenant, b.key.Tenant))
	})
	return true
}

// forget drops a queue whose consumer is gone.
func (qs *queues) forget(q *workQueue) {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	qs.list = slices.DeleteFunc(qs.list, func(o *workQueue) bool { return o == q })
}

// only returns the pool's one queue, or nil when it has none or several.
func (qs *queues) only() *workQueue {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	if len(qs.list) == 1 {
		return qs.list[0]
	}
	return nil
}

// lowest returns the smallest backlog of the queues, as known (0 with
// none).
func (qs *queues) lowest() int64 {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	if len(qs.list) == 0 {
		return 0
	}
	low := qs.list[0].pending.Load()
	for _, q := range qs.list[1:] {
		low = min(low, q.pending.Load())
	}
	return low
}

// expectFor is how long after a dispatcher's word that a job is on its
// way to a queue an empty pull from the queue is tried again.
const expectFor = 500 * time.Millisecond

// expect notes a dispatcher's word that a job is on its way to q: it
// tells of the queue it made for the job before it queues the job.
func (q *workQueue) expect() { q.told.Store(time.Now().UnixNano()) }

// expected says, for a pull from q started at start (unix ns) that brought
// nothing, whether a job is on its way to q all the same, and when to pull
// again. The word comes before the job is stored, and the pull that
// follows it may come before too; so may one that follows the job's live
// copy, which the server sends once the job is stored but may send before
// the queue's consumer counts the job (the stream tells its consumers
// beside its writes), or before the worker listened for it. Pulls are
// tried again after as long as has passed since the word, doubling, for
// up to expectFor; after that a job the word announced and no pull found
// (another worker's, or never queued) is left to the live copies and the
// listings.
func (q *workQueue) expected(start int64) (again time.Duration, ok bool) {
	told := q.told.Load()
	if told == 0 || start-told > int64(expectFor) {
		return 0, false
	}
	return max(time.Duration(time.Now().UnixNano()-told), time.Millisecond), true
}

// ring notes a job heard queued on q, and wakes the pull loop.
func (qs *queues) ring(q *workQueue) {
	q.pending.Add(1)
	q.rung.Store(time.Now().UnixNano())
	select {
	case qs.wake <- struct{}{}:
	default:
	}
}

// take is a part of a plan: pull n jobs from q (probe: with nothing
// known waiting).
type take struct {
	q     *workQueue
	n     int
	probe bool
}

// tenantView is what a plan knows of a tenant.
type tenantView struct {
	// load is its running work and decayed usage, in slots.
	load float64
	// blocked is true when it may start nothing now (its quota is full).
	blocked bool
}

// plan divides n free slots between the queues (see the top of the file),
// and counts what it takes as no longer waiting.
// view tells of a tenant; probeAfter is how long a queue with nothing
// known waiting but deliveries not acknowledged is left before a plan
// pulls one job from it, to find a retry whose time has come; held, when
// not 0, is the priority of a queue with jobs that cannot be pulled from
// yet (see queueSet.held): no queue of a lower priority gets a slot.
func (qs *queues) plan(n int, policy *job.PoolPolicy, view func(tenant string) tenantView, probeAfter time.Duration, held int, now time.Time) []take {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	var plan []take
	views := map[string]*tenantView{}
	viewOf := func(t string) *tenantView {
		v, ok := views[t]
		if !ok {
			tv := view(t)
			v = &tv
			views[t] = v
		}
		return v
	}
	below := func(q *workQueue) bool { return held != 0 && q.key.Priority > held }
	for i := 0; i < len(qs.list) && n > 0 && !below(qs.list[i]); {
		// The queues of one priority: qs.list[i:j].
		j := i
		for j < len(qs.list) && qs.list[j].key.Priority == qs.list[i].key.Priority {
			j++
		}
		avail := make([]int64, j-i)
		for k := i; k < j; k++ {
			if v := viewOf(qs.list[k].key.Tenant); !v.blocked {
				avail[k-i] = max(qs.list[k].pending.Load(), 0)
			}
		}
		asked := make([]int, j-i)
		for n > 0 {
			best, bestScore := -1, math.Inf(1)
			for k := range avail {
				if avail[k] == 0 {
					continue
				}
				t := qs.list[i+k].key.Tenant
				s := (viewOf(t).load + 1) / policy.Weight(t)
				if s < bestScore {
					best, bestScore = k, s
				}
			}
			if best < 0 {
				break
			}
			avail[best]--
			asked[best]++
			viewOf(qs.list[i+best].key.Tenant).load++
			n--
		}
		for k, a := range asked {
			if a > 0 {
				// Counted as taken until the fetch says what is left, so
				// that a plan made meanwhile does not ask for them again.
				qs.list[i+k].pending.Add(-int64(a))
				plan = append(plan, take{q: qs.list[i+k], n: a})
			}
		}
		i = j
	}
	// What is left looks for jobs delivered before and due again.
	for _, q := range qs.list {
		if n == 0 {
			break
		}
		if q.pending.Load() <= 0 && q.unacked.Load() > 0 && now.Sub(q.probed) >= probeAfter && !below(q) && !viewOf(q.key.Tenant).blocked {
			q.probed = now
			plan = append(plan, take{q: q, n: 1, probe: true})
			n--
		}
	}
	return plan
}

// usage is what the tenants ran on this worker, decayed: the worker's
// own account, for a pool without Redis (with Redis, the ledger keeps the
// pool's, and this one is not kept).
type usage struct {
	mu  sync.Mutex
	use map[string]decayed
}

type decayed struct {
	slotSeconds float64
	at          time.Time
}

// add counts a slot held for d by tenant, ended at now.
func (u *usage) add(tenant string, d time.Duration, halfLife time.Duration, now time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.use == nil {
		u.use = map[string]decayed{}
	}
	v := u.use[tenant]
	v.slotSeconds = capacity.Decay(v.slotSeconds, now.Sub(v.at), halfLife) + d.Seconds()
	v.at = now
	u.use[tenant] = v
}

// slots returns a tenant's usage as the average slots it held over the
// last half-life.
func (u *usage) slots(tenant string, halfLife time.Duration, now time.Time) float64 {
	u.mu.Lock()
	v, ok := u.use[tenant]
	u.mu.Unlock()
	if !ok {
		return 0
	}
	return capacity.UsageSlots(capacity.Decay(v.slotSeconds, now.Sub(v.at), halfLife)*1000, halfLife)
}
