package telemetry_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/fleet-dev/fleet/internal/telemetry"
)

// BenchmarkTracer measures getting the fleet's tracer, as each submission
// and each attempt does, many at once: from the global provider before
// any is set (the default), and after Setup set the SDK's.
func BenchmarkTracer(b *testing.B) {
	run := func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				_ = telemetry.Tracer()
			}
		})
	}
	b.Run("global", run)
	b.Run("sdk", func(b *testing.B) {
		tp := sdktrace.NewTracerProvider()
		defer tp.Shutdown(context.Background())
		otel.SetTracerProvider(tp)
		run(b)
	})
}
