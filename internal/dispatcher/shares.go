package dispatcher

import (
	"context"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/internal/telemetry"
	"github.com/fleet-dev/fleet/job"
)

// How each tenant of a pool fares, for pool show, the console and the
// fleet_tenant_* gauges: what waits on its queues (their consumers'
// counts) and what it runs (the workers' leases in Redis, when the fleet
// has Redis).

// shares returns how the tenants of a pool fare, and the slots of its
// live workers (0 without Redis). What cannot be read is left out.
func (d *Dispatcher) shares(ctx context.Context, pool string, policy *job.PoolPolicy) ([]job.TenantShare, int) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	by := map[string]*job.TenantShare{}
	get := func(t string) *job.TenantShare {
		s, ok := by[t]
		if !ok {
			s = &job.TenantShare{Tenant: t, Weight: policy.Weight(t)}
			if policy != nil {
				if q, ok := policy.Quotas[t]; ok {
					s.Quota = &q
				}
			}
			by[t] = s
		}
		return s
	}
	if qs, err := queue.Queues(ctx, d.js, d.cfg.Queue, pool); err == nil {
		for k, info := range qs {
			s := get(k.Tenant)
			s.Queued += int64(info.NumPending)
			s.Delivered += int64(info.NumAckPending)
			if info.NumPending > 0 {
				if s.QueuedByPri == nil {
					s.QueuedByPri = map[string]int64{}
				}
				s.QueuedByPri[strconv.Itoa(k.Priority)] += int64(info.NumPending)
			}
		}
	}
	var slots int64
	if c := d.cfg.Capacity; c != nil {
		hl := policy.HalfLifeOr()
		if use, n, err := c.Tenants(ctx, pool, hl); err == nil {
			slots = n
			for t, u := range use {
				s := get(t)
				s.Running, s.CPUMilli, s.MemoryBytes, s.GPUs = u.Others.Slots, u.Others.CPUMilli, u.Others.MemoryBytes, u.Others.GPUs
				s.Usage = u.Usage / 1000
			}
		}
	}
	var weights float64
	for _, s := range by {
		if s.Queued+s.Delivered+s.Running > 0 {
			weights += s.Weight
		}
	}
	out := make([]job.TenantShare, 0, len(by))
	for _, s := range by {
		if s.Queued+s.Delivered+s.Running == 0 && s.Usage < 1 {
			continue // nothing to say
		}
		if slots > 0 {
			s.SlotShare = float64(s.Running) / float64(slots)
		}
		if weights > 0 && s.Queued+s.Delivered+s.Running > 0 {
			s.FairShare = s.Weight / weights
		}
		out = append(out, *s)
	}
	job.SortShares(out)
	return out, int(slots)
}

// tenantGauges registers the fleet.tenant.* gauges, read from what
// refreshLag last learned; the returned function unregisters them.
func (d *Dispatcher) tenantGauges() func() {
	m := telemetry.Meter()
	queued, _ := m.Int64ObservableGauge("fleet.tenant.queued", metric.WithDescription("Jobs of a tenant waiting in a pool, by priority"))
	delivered, _ := m.Int64ObservableGauge("fleet.tenant.delivered", metric.WithDescription("Jobs of a tenant delivered to a pool's workers and not finished"))
	running, _ := m.Int64ObservableGauge("fleet.tenant.running", metric.WithDescription("Attempts of a tenant running in a pool (from the workers' leases in Redis)"))
	share, _ := m.Float64ObservableGauge("fleet.tenant.slot_share", metric.WithDescription("A tenant's running attempts over the pool's slots"))
	fair, _ := m.Float64ObservableGauge("fleet.tenant.fair_share", metric.WithDescription("The share of a pool's slots a tenant's weight gives it among the tenants with work"))
	usage, _ := m.Float64ObservableGauge("fleet.tenant.usage", metric.WithUnit("s"), metric.WithDescription("A tenant's running slots integrated over time, decayed with the pool's half-life, in slot-seconds"))
	reg, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		d.lag.mu.Lock()
		defer d.lag.mu.Unlock()
		for pool, tenants := range d.lag.tenants {
			for _, s := range tenants {
				attrs := []attribute.KeyValue{attribute.String("pool", pool), attribute.String("tenant", s.Tenant)}
				set := metric.WithAttributeSet(attribute.NewSet(attrs...))
				for p := job.HighestPriority; p <= job.LowestPriority; p++ {
					pri := strconv.Itoa(p)
					o.ObserveInt64(queued, s.QueuedByPri[pri], metric.WithAttributeSet(attribute.NewSet(append(attrs, attribute.String("priority", pri))...)))
				}
				o.ObserveInt64(delivered, s.Delivered, set)
				o.ObserveInt64(running, s.Running, set)
				o.ObserveFloat64(share, s.SlotShare, set)
				o.ObserveFloat64(fair, s.FairShare, set)
				o.ObserveFloat64(usage, s.Usage, set)
			}
		}
		return nil
	}, queued, delivered, running, share, fair, usage)
	if err != nil {
		return func() {}
	}
	return func() { _ = reg.Unregister() }
}

// refreshTenants reads how the tenants of every v2 pool fare, for the
// gauges.
func (d *Dispatcher) refreshTenants(ctx context.Context, pools []string) {
	out := map[string][]job.TenantShare{}
	for _, pool := range pools {
		s, err := queue.ReadPool(ctx, d.poolStates, pool)
		if err != nil {
			return
		}
		out[pool], _ = d.shares(ctx, pool, s.Policy)
	}
	d.lag.mu.Lock()
	d.lag.tenants = out
	d.lag.mu.Unlock()
}
