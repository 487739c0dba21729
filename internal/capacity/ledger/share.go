package ledger

import (
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/fleet-dev/fleet/internal/capacity"
	"github.com/fleet-dev/fleet/job"
)

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
				u.Usage = Decay(u.Usage, now.Sub(s.shares.At), hl)
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

// Decay is usage u decayed over d with half-life hl.
func Decay(u float64, d, hl time.Duration) float64 {
	if d <= 0 || hl <= 0 {
		return u
	}
	return u * math.Pow(2, -float64(d)/float64(hl))
}
