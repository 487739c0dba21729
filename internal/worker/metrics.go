package worker

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/fleet-dev/fleet/internal/telemetry"
	"github.com/fleet-dev/fleet/job"
)

// metrics are the worker's instruments, with their attribute sets built
// once: building a set per measurement costs more than the measurement.
type metrics struct {
	started   metric.Int64Counter
	adopted   metric.Int64Counter
	handedOff metric.Int64Counter
	finished  metric.Int64Counter
	retries   metric.Int64Counter
	// batch is the number of final versions the completer sent together;
	// alone those it handed back to their deliveries (see completer).
	batch    metric.Int64Histogram
	alone    metric.Int64Counter
	duration metric.Float64Histogram
	wait     metric.Float64Histogram
	// tenantWait is wait by tenant and priority, with their sets kept.
	tenantWait  metric.Float64Histogram
	tenantAttrs *telemetry.Options[tenantPriority]
	pool        attribute.KeyValue
	poolAttrs   metric.MeasurementOption
	status      map[job.Status]metric.MeasurementOption
	class       map[job.FailureClass]metric.MeasurementOption
	// slots observes the slots gauge until the worker stops.
	slots metric.Registration
}

func (x *metrics) byStatus(s job.Status) metric.MeasurementOption {
	if o, ok := x.status[s]; ok {
		return o
	}
	return x.poolAttrs
}

func (x *metrics) byClass(c job.FailureClass) metric.MeasurementOption {
	if o, ok := x.class[c]; ok {
		return o
	}
	return x.poolAttrs
}

type tenantPriority struct {
	tenant   string
	priority int
}

// byTenant is the attribute set of a tenant's jobs at a priority.
// Tenants are as many as a fleet's users make: past telemetry.OptionsLimit
// of them, a set is built per measurement.
func (x *metrics) byTenant(tenant string, p int) metric.MeasurementOption {
	return x.tenantAttrs.Get(tenantPriority{tenant, p})
}

func newMetrics(m metric.Meter, w *Worker) *metrics {
	pool := attribute.String("pool", w.cfg.Pool)
	x := &metrics{
		pool:      pool,
		poolAttrs: metric.WithAttributeSet(attribute.NewSet(pool)),
		status:    map[job.Status]metric.MeasurementOption{},
		class:     map[job.FailureClass]metric.MeasurementOption{},
	}
	x.tenantAttrs = telemetry.NewOptions(telemetry.OptionsLimit, func(k tenantPriority) metric.MeasurementOption {
		return metric.WithAttributeSet(attribute.NewSet(pool, attribute.String("tenant", k.tenant), attribute.Int("priority", k.priority)))
	})
	for _, s := range []job.Status{job.StatusSucceeded, job.StatusFailed, job.StatusTimedOut, job.StatusCancelled} {
		x.status[s] = metric.WithAttributeSet(attribute.NewSet(pool, attribute.String("status", string(s))))
	}
	for _, c := range []job.FailureClass{job.ClassExecution, job.ClassTimeout, job.ClassOOM, job.ClassImage,
		job.ClassInfrastructure, job.ClassCancelled, job.ClassRejected} {
		x.class[c] = metric.WithAttributeSet(attribute.NewSet(pool, attribute.String("class", string(c))))
	}
	x.started, _ = m.Int64Counter("fleet.worker.attempts.started", metric.WithDescription("Attempts started"))
	x.adopted, _ = m.Int64Counter("fleet.worker.attempts.adopted", metric.WithDescription("Attempts that outlived their worker and were adopted"))
	x.handedOff, _ = m.Int64Counter("fleet.worker.attempts.handed_off", metric.WithDescription("Attempts left running for another worker to adopt, by a worker stopping with --handoff"))
	x.finished, _ = m.Int64Counter("fleet.worker.jobs.finished", metric.WithDescription("Jobs finished, by final status"))
	x.retries, _ = m.Int64Counter("fleet.worker.retries", metric.WithDescription("Attempts that failed and were scheduled again, by failure class"))
	x.batch, _ = m.Int64Histogram("fleet.worker.completer.batch", metric.WithDescription("Final versions of jobs the completer sent and acknowledged together"),
		metric.WithExplicitBucketBoundaries(1, 2, 4, 8, 16, 32, 64, 128, 256))
	x.alone, _ = m.Int64Counter("fleet.worker.completer.alone", metric.WithDescription("Final versions the completer did not know stored (refused, a duplicate, or not answered in time), handed back to their delivery to write alone"))
	x.duration, _ = m.Float64Histogram("fleet.worker.attempt.duration", metric.WithUnit("s"),
		metric.WithDescription("Run time of attempts"),
		metric.WithExplicitBucketBoundaries(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800))
	x.wait, _ = m.Float64Histogram("fleet.worker.queue.wait", metric.WithUnit("s"),
		metric.WithDescription("Time from submission to the start of the first attempt"),
		metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 60, 300))
	x.tenantWait, _ = m.Float64Histogram("fleet.tenant.wait", metric.WithUnit("s"),
		metric.WithDescription("Time from submission to the start of the first attempt, by tenant and priority: how the pool's sharing treats each"),
		metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 60, 300, 1800))
	slotsGauge, _ := m.Int64ObservableGauge("fleet.worker.slots", metric.WithDescription("Slots of this worker, by state (total, used)"))
	total := metric.WithAttributeSet(attribute.NewSet(pool, attribute.String("state", "total")))
	used := metric.WithAttributeSet(attribute.NewSet(pool, attribute.String("state", "used")))
	x.slots, _ = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveInt64(slotsGauge, int64(w.cfg.Slots), total)
		o.ObserveInt64(slotsGauge, int64(w.Running()), used)
		return nil
	}, slotsGauge)
	return x
}

// close stops observing the worker's gauge, so that a stopped worker is not
// kept by the meter (a process, a test's, may run many one after another).
func (x *metrics) close() {
	if x.slots != nil {
		_ = x.slots.Unregister()
	}
}
