package ledger

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fleet-dev/fleet/internal/capacity"
	"github.com/fleet-dev/fleet/job"
)

// What a ledger does for sharing a pool between tenants: it knows the
// pool's policy and what its tenants hold and ran, checks quotas (its own
// leases first, then every worker's in the lease script), sends the
// pool's other workers with each batch and counts each lease's run time
// in its tenant's usage.

// share is what a ledger knows of its pool's tenants: the pool's policy,
// given by the worker, and what the last round trips to Redis told of the
// other workers (who they are, what each tenant holds on them, the
// tenants' usage). Every lease batch refreshes the tenants it touched;
// every heartbeat refreshes them all.
type share struct {
	mu     sync.Mutex
	policy *job.PoolPolicy
	peers  []string
	shares capacity.Shares
}

// SetPolicy implements capacity.Sharer.
func (r *Ledger) SetPolicy(p *job.PoolPolicy) {
	r.share.mu.Lock()
	r.share.policy = p
	r.share.mu.Unlock()
}

// Shares implements capacity.Sharer: a copy of what the ledger last
// learned of the pool, with this worker's totals in the pool's.
func (r *Ledger) Shares() capacity.Shares {
	r.share.mu.Lock()
	defer r.share.mu.Unlock()
	s := r.share.shares
	s.Tenants = maps.Clone(s.Tenants)
	return s
}

// limitsOf returns the quota of a tenant (nil: none) and the pool's bound.
func (s *share) limitsOf(tenant string) (*job.QuotaLimits, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.policy == nil {
		return nil, 0
	}
	var q *job.QuotaLimits
	if l := s.policy.Quota(tenant); !l.Unbounded() {
		q = &l
	}
	return q, s.policy.MaxRunning
}

func (s *share) peersAndHalfLife() ([]string, time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.peers), s.policy.HalfLifeOr()
}

func (s *share) setPeers(peers []string) {
	s.mu.Lock()
	s.peers = slices.Clone(peers)
	s.mu.Unlock()
}

// learn notes what a lease batch told of its tenants. The usage of the
// others is brought to the same time by decaying it.
func (s *share) learn(tenants map[string]capacity.TenantUse) {
	if len(tenants) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if s.shares.Tenants == nil {
		s.shares.Tenants = map[string]capacity.TenantUse{}
	} else if !s.shares.At.IsZero() {
		hl := s.policy.HalfLifeOr()
		for t, u := range s.shares.Tenants {
			if _, ok := tenants[t]; !ok {
				u.Usage = capacity.Decay(u.Usage, now.Sub(s.shares.At), hl)
				s.shares.Tenants[t] = u
			}
		}
	}
	maps.Copy(s.shares.Tenants, tenants)
	s.shares.At = now
}

// view notes what a heartbeat told of the pool; own are the worker's
// totals.
func (s *share) view(v *capacity.PoolView, own capacity.Totals) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.peers = slices.Clone(v.Peers)
	sh := capacity.Shares{At: time.Now(), Tenants: v.Tenants, Slots: v.Slots + int64(own.Slots), GPUs: v.GPUs + int64(own.GPUs),
		CPUMilli: -1, MemoryBytes: -1, Used: v.Used}
	if own.CPUMilli != nil && v.CPUMilli >= 0 {
		sh.CPUMilli = v.CPUMilli + *own.CPUMilli
	}
	if own.MemoryBytes != nil && v.MemoryBytes >= 0 {
		sh.MemoryBytes = v.MemoryBytes + *own.MemoryBytes
	}
	if sh.Tenants == nil {
		sh.Tenants = map[string]capacity.TenantUse{}
	}
	s.shares = sh
}

// quotaLocked says why the worker's own leases of the lease's tenant
// leave no room for it in the tenant's quota, or "": the first check, and
// the only one while Redis is away.
func (r *Ledger) quotaLocked(l capacity.Lease, q *job.QuotaLimits) string {
	if q == nil || q.Unbounded() {
		return ""
	}
	var h capacity.Holding
	t := l.TenantOf()
	for _, o := range r.leases {
		if o.TenantOf() == t {
			h = h.Add(capacity.Holding{Slots: 1, CPUMilli: o.CPUMilli, MemoryBytes: o.MemoryBytes, GPUs: int64(o.GPUs)})
		}
	}
	switch {
	case q.Slots >= 0 && h.Slots+1 > q.Slots:
		return fmt.Sprintf("tenant %s runs its quota of %d slots on this worker", t, q.Slots)
	case q.CPUMilli >= 0 && h.CPUMilli+l.CPUMilli > q.CPUMilli:
		return fmt.Sprintf("tenant %s runs its quota of %s CPU on this worker", t, job.FormatCPU(q.CPUMilli))
	case q.MemoryBytes >= 0 && h.MemoryBytes+l.MemoryBytes > q.MemoryBytes:
		return fmt.Sprintf("tenant %s runs its quota of %s memory on this worker", t, job.FormatMemory(q.MemoryBytes))
	case q.GPUs >= 0 && h.GPUs+int64(l.GPUs) > q.GPUs:
		return fmt.Sprintf("tenant %s runs its quota of %d GPUs on this worker", t, q.GPUs)
	}
	return ""
}

// accrue returns how long a lease was held since it was last counted in
// its tenant's usage, and counts it until now.
func (r *Ledger) accrue(l capacity.Lease, now time.Time) time.Duration {
	k := keyOf(l)
	from := r.accrued[k]
	if from.IsZero() || l.StartedAt.After(from) {
		from = l.StartedAt
	}
	r.accrued[k] = now
	return max(now.Sub(from), 0)
}

// refusal says why Redis refused a reservation.
func refusal(reply, tenant string) string {
	switch {
	case strings.HasPrefix(reply, capacity.LeaseQuotaPrefix):
		return fmt.Sprintf("tenant %s runs its quota of %s in the pool", tenant, strings.TrimPrefix(reply, capacity.LeaseQuotaPrefix))
	case reply == capacity.LeaseMaxRunning:
		return "the pool runs its bound of attempts (max_running)"
	}
	return fmt.Sprintf("Redis counts %s full for this worker", strings.TrimPrefix(reply, capacity.LeaseRefusedPrefix))
}

// maxStale is how many times a batch is sent again because the pool's
// workers changed under it; then its reservations that check a quota are
// refused, to come back a moment later.
const maxStale = 3

// apply sends a batch with the pool's other workers as the ledger knows
// them, learning them again when they changed, and notes what the answer
// says of the batch's tenants.
func (r *Ledger) apply(ctx context.Context, batch []capacity.LeaseOp) ([]string, error) {
	for try := 0; ; try++ {
		a, err := r.send(ctx, batch)
		if err != nil {
			return nil, err
		}
		r.share.setPeers(a.Peers)
		if !a.Stale() {
			r.share.learn(a.Tenants)
			return a.Replies, nil
		}
		if try+1 < maxStale {
			continue
		}
		return r.applyUnchecked(ctx, batch)
	}
}

// send sends a batch once, with the pool's other workers and the
// half-life as the ledger knows them.
func (r *Ledger) send(ctx context.Context, ops []capacity.LeaseOp) (*capacity.LeaseAnswer, error) {
	peers, halfLife := r.share.peersAndHalfLife()
	cctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	r.calls.Add(ctx, 1)
	return r.s.Apply(cctx, capacity.LeaseBatch{Pool: r.cfg.Pool, Worker: r.cfg.WorkerID, TTL: r.leaseTTL(),
		Ops: ops, Peers: peers, HalfLife: halfLife})
}

// applyUnchecked sends a batch without its reservations that check a
// quota, which are refused: the pool's workers kept changing under it.
func (r *Ledger) applyUnchecked(ctx context.Context, batch []capacity.LeaseOp) ([]string, error) {
	var kept []capacity.LeaseOp
	var dropped []bool // per reservation of batch
	for _, o := range batch {
		if o.Release {
			kept = append(kept, o)
			continue
		}
		drop := o.MaxRunning > 0 || (o.Quota != nil && !o.Quota.Unbounded())
		dropped = append(dropped, drop)
		if !drop {
			kept = append(kept, o)
		}
	}
	a, err := r.send(ctx, kept)
	if err != nil {
		return nil, err
	}
	r.share.learn(a.Tenants)
	replies := make([]string, 0, len(dropped))
	j := 0
	for _, d := range dropped {
		if d {
			replies = append(replies, capacity.LeaseRefusedPrefix+"the pool's workers are changing")
			continue
		}
		if j < len(a.Replies) {
			replies = append(replies, a.Replies[j])
		}
		j++
	}
	return replies, nil
}
