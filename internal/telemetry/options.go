package telemetry

import (
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/metric"
)

// OptionsLimit is how many keys an Options keeps by default: pools and
// priorities are few, but tenants are as many as a fleet's users make.
const OptionsLimit = 1024

// Options keeps the measurement options (attribute sets) of a metric's
// measurements by key, each built once, so that a measurement per job
// does not build its set. It keeps at most its limit of keys (a few more
// when many are added at once); past it, it builds the options of a new
// key each time.
type Options[K comparable] struct {
	build func(K) metric.MeasurementOption
	limit int64
	n     atomic.Int64
	m     sync.Map // K → metric.MeasurementOption
}

// NewOptions returns an Options that builds a key's options with build
// and keeps those of at most limit keys.
func NewOptions[K comparable](limit int, build func(K) metric.MeasurementOption) *Options[K] {
	return &Options[K]{build: build, limit: int64(limit)}
}

// Get returns the options of key k.
func (o *Options[K]) Get(k K) metric.MeasurementOption {
	if v, ok := o.m.Load(k); ok {
		return v.(metric.MeasurementOption)
	}
	v := o.build(k)
	if o.n.Load() < o.limit {
		if _, loaded := o.m.LoadOrStore(k, v); !loaded {
			o.n.Add(1)
		}
	}
	return v
}

// Len is how many keys it keeps.
func (o *Options[K]) Len() int { return int(o.n.Load()) }
