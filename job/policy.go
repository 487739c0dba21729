package job

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// PoolPolicy is how a pool is shared between tenants, set by operators
// (fleetctl pool set) and kept in the pool's entry of the pools bucket
// with its pause state. A pool without one shares its slots equally.
//
// Jobs start by priority first (1 before 2 ...). Within a priority, free
// slots go to the tenant with the lowest fair-share score: its dominant
// share of the pool (the largest of its running slots, CPU, memory and
// GPUs, each over the pool's total) plus its usage decayed over HalfLife
// (as a share of the pool), over its weight. A tenant at its quota, or a
// pool at MaxRunning, gets none. See docs/sharing.md.
type PoolPolicy struct {
	// Weights are the tenants' weights; a tenant not named weighs
	// DefaultWeight.
	Weights map[string]float64 `json:"weights,omitempty"`
	// Quotas bound what a tenant runs at once in the pool.
	Quotas map[string]Quota `json:"quotas,omitempty"`
	// MaxRunning bounds the attempts running at once in the pool, all
	// tenants together; 0 is no bound.
	MaxRunning int `json:"max_running,omitempty"`
	// HalfLife is how fast past usage is forgotten. Defaults to
	// DefaultHalfLife.
	HalfLife *Duration `json:"half_life,omitempty"`
}

// Defaults of a PoolPolicy.
const (
	DefaultWeight   = 1.0
	DefaultHalfLife = 10 * time.Minute
	// MaxTenantsInPolicy bounds the tenants a policy names.
	MaxTenantsInPolicy = 1000
)

// Quota bounds what one tenant runs at once in a pool: slots, CPU,
// memory, GPUs. A zero or empty field is no bound.
type Quota struct {
	Slots  int    `json:"slots,omitempty"`
	CPU    string `json:"cpu,omitempty"`
	Memory string `json:"memory,omitempty"`
	GPU    int    `json:"gpu,omitempty"`
}

// QuotaLimits is a quota in numbers; -1 is no bound.
type QuotaLimits struct {
	Slots, CPUMilli, MemoryBytes, GPUs int64
}

// NoLimits bounds nothing.
var NoLimits = QuotaLimits{-1, -1, -1, -1}

// Unbounded reports whether l bounds nothing.
func (l QuotaLimits) Unbounded() bool { return l == NoLimits }

// Limits returns the quota in numbers (it must be valid).
func (q Quota) Limits() QuotaLimits {
	l := NoLimits
	if q.Slots > 0 {
		l.Slots = int64(q.Slots)
	}
	if v, err := ParseCPU(q.CPU); err == nil && q.CPU != "" {
		l.CPUMilli = v
	}
	if v, err := ParseMemory(q.Memory); err == nil && q.Memory != "" {
		l.MemoryBytes = v
	}
	if q.GPU > 0 {
		l.GPUs = int64(q.GPU)
	}
	return l
}

// IsZero reports whether the quota bounds nothing.
func (q Quota) IsZero() bool { return q == Quota{} }

// String writes the quota as fleetctl pool set takes it.
func (q Quota) String() string {
	var parts []string
	if q.Slots > 0 {
		parts = append(parts, "slots="+strconv.Itoa(q.Slots))
	}
	if q.CPU != "" {
		parts = append(parts, "cpu="+q.CPU)
	}
	if q.Memory != "" {
		parts = append(parts, "memory="+q.Memory)
	}
	if q.GPU > 0 {
		parts = append(parts, "gpu="+strconv.Itoa(q.GPU))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ",")
}

// ParseQuota reads a quota as fleetctl pool set takes it: a number of
// slots ("2"), or slots=, cpu=, memory=, gpu= separated by commas
// ("cpu=4,memory=8Gi,gpu=2"); "none" is no quota.
func ParseQuota(s string) (Quota, error) {
	var q Quota
	if s == "none" {
		return q, nil
	}
	if n, err := strconv.Atoi(s); err == nil {
		q.Slots = n
		return q, q.Validate()
	}
	for _, part := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return q, fmt.Errorf("quota %q: use SLOTS or slots=N,cpu=Q,memory=Q,gpu=N", s)
		}
		var err error
		switch k {
		case "slots":
			q.Slots, err = strconv.Atoi(v)
		case "cpu":
			q.CPU = v
		case "memory":
			q.Memory = v
		case "gpu", "gpus":
			q.GPU, err = strconv.Atoi(v)
		default:
			return q, fmt.Errorf("quota %q: %q is not slots, cpu, memory or gpu", s, k)
		}
		if err != nil {
			return q, fmt.Errorf("quota %q: %s: %w", s, k, err)
		}
	}
	return q, q.Validate()
}

// Validate checks a quota.
func (q Quota) Validate() error {
	switch {
	case q.Slots < 0:
		return fmt.Errorf("slots %d: must not be negative", q.Slots)
	case q.GPU < 0:
		return fmt.Errorf("gpu %d: must not be negative", q.GPU)
	}
	if q.CPU != "" {
		if v, err := ParseCPU(q.CPU); err != nil || v <= 0 {
			return fmt.Errorf("cpu %q: not a positive CPU quantity", q.CPU)
		}
	}
	if q.Memory != "" {
		if v, err := ParseMemory(q.Memory); err != nil || v <= 0 {
			return fmt.Errorf("memory %q: not a positive memory quantity", q.Memory)
		}
	}
	return nil
}

// Weight returns a tenant's weight.
func (p *PoolPolicy) Weight(tenant string) float64 {
	if p != nil {
		if w, ok := p.Weights[tenant]; ok && w > 0 {
			return w
		}
	}
	return DefaultWeight
}

// Quota returns a tenant's quota in numbers.
func (p *PoolPolicy) Quota(tenant string) QuotaLimits {
	if p == nil {
		return NoLimits
	}
	q, ok := p.Quotas[tenant]
	if !ok {
		return NoLimits
	}
	return q.Limits()
}

// HalfLifeOr returns the policy's half-life, or the default.
func (p *PoolPolicy) HalfLifeOr() time.Duration {
	if p == nil || p.HalfLife == nil || *p.HalfLife <= 0 {
		return DefaultHalfLife
	}
	return p.HalfLife.Std()
}

// Validate checks a policy.
func (p *PoolPolicy) Validate() error {
	if p == nil {
		return nil
	}
	if n := len(p.Weights) + len(p.Quotas); n > MaxTenantsInPolicy {
		return fmt.Errorf("policy: %d weights and quotas, over the limit of %d", n, MaxTenantsInPolicy)
	}
	for _, t := range slices.Sorted(maps.Keys(p.Weights)) {
		if !ValidTenant(t) {
			return fmt.Errorf("weights: %q is not a tenant name", t)
		}
		if w := p.Weights[t]; !(w > 0) || w > 1e6 {
			return fmt.Errorf("weights: %s=%g: a weight is above 0 and at most 1000000", t, w)
		}
	}
	for _, t := range slices.Sorted(maps.Keys(p.Quotas)) {
		if !ValidTenant(t) {
			return fmt.Errorf("quotas: %q is not a tenant name", t)
		}
		if err := p.Quotas[t].Validate(); err != nil {
			return fmt.Errorf("quotas: %s: %w", t, err)
		}
	}
	if p.MaxRunning < 0 {
		return fmt.Errorf("max_running %d: must not be negative", p.MaxRunning)
	}
	if h := p.HalfLife; h != nil && (h.Std() < time.Second || h.Std() > 30*24*time.Hour) {
		return fmt.Errorf("half_life %s: from 1s to 30 days", h)
	}
	return nil
}

// PolicyChange changes a pool's policy (fleetctl pool set, on the subject
// <prefix>.pools.<pool>.set; POST /v1/pools/{pool}/policy): the weights
// and quotas it names replace those tenants' (a weight of 0 or a quota of
// "none" removes the tenant's), and MaxRunning and HalfLife, when set,
// replace the pool's (MaxRunning 0 removes the bound). The answer is the
// PoolState.
type PolicyChange struct {
	Weights    map[string]float64 `json:"weights,omitempty"`
	Quotas     map[string]Quota   `json:"quotas,omitempty"`
	MaxRunning *int               `json:"max_running,omitempty"`
	HalfLife   *Duration          `json:"half_life,omitempty"`
}

// Apply returns p changed by c; p is not modified.
func (c *PolicyChange) Apply(p *PoolPolicy) *PoolPolicy {
	out := &PoolPolicy{}
	if p != nil {
		*out = *p
		out.Weights, out.Quotas = maps.Clone(p.Weights), maps.Clone(p.Quotas)
	}
	for t, w := range c.Weights {
		if w == 0 {
			delete(out.Weights, t)
			continue
		}
		if out.Weights == nil {
			out.Weights = map[string]float64{}
		}
		out.Weights[t] = w
	}
	for t, q := range c.Quotas {
		if q.IsZero() {
			delete(out.Quotas, t)
			continue
		}
		if out.Quotas == nil {
			out.Quotas = map[string]Quota{}
		}
		out.Quotas[t] = q
	}
	if c.MaxRunning != nil {
		out.MaxRunning = *c.MaxRunning
	}
	if c.HalfLife != nil {
		h := *c.HalfLife
		out.HalfLife = &h
	}
	if len(out.Weights) == 0 {
		out.Weights = nil
	}
	if len(out.Quotas) == 0 {
		out.Quotas = nil
	}
	return out
}

// Validate checks a change: what it would make of an empty policy.
func (c *PolicyChange) Validate() error {
	for t, w := range c.Weights {
		if w < 0 {
			return fmt.Errorf("weights: %s=%g: must not be negative", t, w)
		}
	}
	if c.MaxRunning != nil && *c.MaxRunning < 0 {
		return fmt.Errorf("max_running %d: must not be negative", *c.MaxRunning)
	}
	return c.Apply(nil).Validate()
}

// TenantShare is how one tenant of a pool fares, as pool show reports it
// and the fleet_tenant_* gauges measure it.
type TenantShare struct {
	Tenant string  `json:"tenant"`
	Weight float64 `json:"weight"`
	Quota  *Quota  `json:"quota,omitempty"`
	// Queued counts its jobs waiting in the pool, by priority ("1" ... "5"),
	// and in all.
	Queued      int64            `json:"queued"`
	QueuedByPri map[string]int64 `json:"queued_by_priority,omitempty"`
	// Delivered counts its jobs handed to workers and not finished (its
	// queues' acknowledgements pending): those that run or are about to,
	// and those a worker handed back to take again after a wait: for a
	// retry or their not_before, while the pool is paused, or while no
	// live worker fits them.
	Delivered int64 `json:"delivered"`
	// Running and the resources are what its attempts hold now, across the
	// pool's workers (from their capacity; 0 without Redis).
	Running     int64 `json:"running"`
	CPUMilli    int64 `json:"cpu_milli,omitempty"`
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	GPUs        int64 `json:"gpus,omitempty"`
	// SlotShare is Running over the pool's slots; FairShare is what its
	// weight gives it among the tenants with work (queued or running).
	SlotShare float64 `json:"slot_share"`
	FairShare float64 `json:"fair_share"`
	// Usage is its running slots integrated over time and decayed with
	// the pool's half-life, in slot-seconds.
	Usage float64 `json:"usage_slot_seconds,omitempty"`
}

// SortShares orders tenants by name.
func SortShares(s []TenantShare) {
	slices.SortFunc(s, func(a, b TenantShare) int { return cmp.Compare(a.Tenant, b.Tenant) })
}

// IsZero reports whether p sets nothing: the pool is shared equally.
func (p *PoolPolicy) IsZero() bool {
	return p == nil || (len(p.Weights) == 0 && len(p.Quotas) == 0 && p.MaxRunning == 0 && p.HalfLife == nil)
}

// String writes p for people, as the console shows it: "weights a=1 b=3;
// quotas c=slots=2; max_running 10; half_life 10m0s", "shared equally" when
// zero. (fleetctl pool show writes it as pool set's flags.)
func (p *PoolPolicy) String() string {
	if p.IsZero() {
		return "shared equally"
	}
	var parts []string
	if len(p.Weights) > 0 {
		var ws []string
		for _, t := range slices.Sorted(maps.Keys(p.Weights)) {
			ws = append(ws, t+"="+strconv.FormatFloat(p.Weights[t], 'g', -1, 64))
		}
		parts = append(parts, "weights "+strings.Join(ws, " "))
	}
	if len(p.Quotas) > 0 {
		var qs []string
		for _, t := range slices.Sorted(maps.Keys(p.Quotas)) {
			qs = append(qs, t+"="+p.Quotas[t].String())
		}
		parts = append(parts, "quotas "+strings.Join(qs, " "))
	}
	if p.MaxRunning > 0 {
		parts = append(parts, "max_running "+strconv.Itoa(p.MaxRunning))
	}
	if p.HalfLife != nil {
		parts = append(parts, "half_life "+p.HalfLife.Std().String())
	}
	return strings.Join(parts, "; ")
}
