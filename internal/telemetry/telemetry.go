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

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of every span and instrument.
const ScopeName = "github.com/fleet-dev/fleet"

// Tracer returns the fleet's tracer from the global provider.
func Tracer() trace.Tracer { return otel.Tracer(ScopeName) }

// Meter returns the fleet's meter from the global provider.
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
