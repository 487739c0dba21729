package dispatcher

import (
	"context"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/internal/telemetry"
	"github.com/fleet-dev/fleet/job"
)

// lag keeps, per pool, the jobs waiting in the pool's queues and those
// delivered but not finished, for the fleet.queue.* gauges: what an
// autoscaler or an operator watches.
// lagEvery is how often the pools' lag is read.
const lagEvery = 5 * time.Second

type lag struct {
	mu       sync.Mutex
	pending  map[string]uint64
	inFlight map[string]int
	// tenants is how each pool's tenants fare (see shares.go).
	tenants map[string][]job.TenantShare
}

// lagGauges registers the gauges that report the pools' lag, as
// refreshLag last read it; the returned function unregisters them.
func (d *Dispatcher) lagGauges() func() {
	l := d.lag
	m := telemetry.Meter()
	pending, _ := m.Int64ObservableGauge("fleet.queue.pending", metric.WithDescription("Jobs waiting in a pool's queue, not yet delivered to a worker"))
	inFlight, _ := m.Int64ObservableGauge("fleet.queue.in_flight", metric.WithDescription("Jobs delivered to a pool's workers and not finished"))
	reg, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		l.mu.Lock()
		defer l.mu.Unlock()
		for pool, n := range l.pending {
			attrs := metric.WithAttributeSet(attribute.NewSet(attribute.String("pool", pool)))
			o.ObserveInt64(pending, int64(n), attrs)
			o.ObserveInt64(inFlight, int64(l.inFlight[pool]), attrs)
		}
		return nil
	}, pending, inFlight)
	if err != nil {
		return func() {}
	}
	return func() { _ = reg.Unregister() }
}

// Lag returns each pool's consumer lag, as last read (every lagEvery).
func (d *Dispatcher) Lag() map[string]queue.Lag {
	d.lag.mu.Lock()
	defer d.lag.mu.Unlock()
	out := make(map[string]queue.Lag, len(d.lag.pending))
	for pool, n := range d.lag.pending {
		out[pool] = queue.Lag{Pending: n, InFlight: d.lag.inFlight[pool]}
	}
	return out
}

// refreshLag reads each pool's consumer lag; the dispatcher calls it every
// lagEvery.
func (d *Dispatcher) refreshLag(ctx context.Context) {
	l := d.lag
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// Every stream that holds jobs: the pools' own (v2), and with v1 the
	// v1 pools' streams or the shared one.
	var streams []string
	subjects := []string{d.names.AllPoolSubjects()}
	if d.cfg.Queue.V1 {
		subjects = append(subjects, d.names.AllJobs())
	}
	for _, subj := range subjects {
		names := d.js.StreamNames(cctx, jetstream.WithStreamListSubject(subj))
		for name := range names.Name() {
			streams = append(streams, name)
		}
		if names.Err() != nil {
			return
		}
	}
	pending, inFlight := map[string]uint64{}, map[string]int{}
	var v2 []string
	for _, name := range streams {
		pool, isV2 := strings.CutPrefix(name, d.names.PoolStreamV2(""))
		if isV2 {
			v2 = append(v2, pool)
		}
		s, err := d.js.Stream(cctx, name)
		if err != nil {
			return
		}
		list := s.ListConsumers(cctx)
		for info := range list.Info() {
			if _, _, queue := d.names.ParseQueueConsumer(info.Name); !isV2 || !queue {
				var ok bool
				if pool, ok = strings.CutPrefix(info.Name, "jobs-"); !ok {
					continue
				}
			}
			pending[pool] += info.NumPending // a v1 stream left from before, and the v2 one
			inFlight[pool] += info.NumAckPending
		}
		if list.Err() != nil {
			return
		}
	}
	l.mu.Lock()
	l.pending, l.inFlight = pending, inFlight
	l.mu.Unlock()
	d.refreshTenants(cctx, v2)
}
