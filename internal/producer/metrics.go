package producer

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// metrics are the producer's instruments.
type metrics struct {
	// cut counts the pull requests whose wait on the pool's only queue
	// was cut as it got another; handedBack what they brought after,
	// with no slot free (see waiting).
	cut        metric.Int64Counter
	handedBack metric.Int64Counter
	// pullsAgain counts the empty pulls from a queue whose job a
	// dispatcher said was on its way, tried again (see expected).
	pullsAgain metric.Int64Counter
	poolAttrs  metric.MeasurementOption
	// paused observes the paused gauge until Close unregisters it.
	paused metric.Registration
}

func newMetrics(m metric.Meter, pool string, paused func() bool) *metrics {
	x := &metrics{poolAttrs: metric.WithAttributeSet(attribute.NewSet(attribute.String("pool", pool)))}
	x.cut, _ = m.Int64Counter("fleet.worker.pulls.cut", metric.WithDescription("Pull requests waiting on a pool's only queue whose wait was cut as the pool got another queue, so that its slots are shared at once"))
	x.handedBack, _ = m.Int64Counter("fleet.worker.pulls.handed_back", metric.WithDescription("Jobs a pull request whose wait was cut brought with no slot free, handed back to their queue at once"))
	x.pullsAgain, _ = m.Int64Counter("fleet.worker.pulls.again", metric.WithDescription("Pulls that found nothing in a queue whose job a dispatcher had said was on its way, tried again a moment later"))
	gauge, _ := m.Int64ObservableGauge("fleet.worker.pool.paused", metric.WithDescription("1 while the worker's pool is paused, as the worker last read it"))
	x.paused, _ = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		v := int64(0)
		if paused() {
			v = 1
		}
		o.ObserveInt64(gauge, v, x.poolAttrs)
		return nil
	}, gauge)
	return x
}

// close stops observing the producer's gauge: a process may run several
// producers one after another (the tests do), and the meter would keep
// each one's callback, and the producer, for good.
func (x *metrics) close() {
	if x.paused != nil {
		_ = x.paused.Unregister()
	}
}
