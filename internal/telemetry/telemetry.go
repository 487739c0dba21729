// Package telemetry sets up OpenTelemetry for the fleet's processes and
// gives each component its tracer and meter.
//
// Without configuration the global providers are no-ops, so instrumented
// code costs next to nothing. Setup installs real providers: traces go to an
// OTLP endpoint when the standard OTEL_* variables name one, metrics are
// always collected and served in Prometheus format.
package telemetry

import (
	"context"
	"reflect"
	"sync/atomic"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of every span and instrument.
const ScopeName = "github.com/fleet-dev/fleet"

// Tracer returns the fleet's tracer from the global provider. It is
// asked for on every submission and attempt: the tracer is kept with the
// provider it came from, and asked for again only when the global provider
// is another (otel.Tracer takes the provider's lock each time).
func Tracer() trace.Tracer {
	tp := otel.GetTracerProvider()
	if c := tracer.Load(); c != nil && c.comparable && c.tp == tp {
		return c.t
	}
	t := tp.Tracer(ScopeName)
	tracer.Store(&providerTracer{tp: tp, t: t, comparable: reflect.TypeOf(tp).Comparable()})
	return t
}

// providerTracer is the fleet's tracer and the provider it came from.
// comparable is false for a provider whose type cannot be compared with
// ==: its tracer is then asked for each time.
type providerTracer struct {
	tp         trace.TracerProvider
	t          trace.Tracer
	comparable bool
}

var tracer atomic.Pointer[providerTracer]

// Meter returns the fleet's meter from the global provider. Components
// ask for it once, as they build their instruments, not per job.
func Meter() metric.Meter { return otel.Meter(ScopeName) }

// Propagator carries W3C trace context in message headers.
var Propagator propagation.TextMapPropagator = propagation.TraceContext{}

// TraceID returns the trace id of the span in ctx, or "" when there is none.
func TraceID(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.HasTraceID() {
		return ""
	}
	return sc.TraceID().String()
}

// Step starts a child span for one step of an attempt (an image pull, a
// container create, the run, the output collection). Call the returned
// function with the step's error, if any, when it ends.
func Step(ctx context.Context, name string) (context.Context, func(error)) {
	ctx, span := Tracer().Start(ctx, name)
	return ctx, func(err error) {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}
