package telemetry_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/fleet-dev/fleet/internal/telemetry"
)

// The fleet's tracer follows the global provider each time it is set:
// spans go to the provider set last.
func TestTracerFollowsTheGlobalProvider(t *testing.T) {
	_, s := telemetry.Tracer().Start(context.Background(), "before")
	s.End()
	var recs []*tracetest.SpanRecorder
	for i := range 3 {
		rec := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
		defer tp.Shutdown(context.Background())
		otel.SetTracerProvider(tp)
		recs = append(recs, rec)
		_, s := telemetry.Tracer().Start(context.Background(), "span")
		s.End()
		// Each provider has the one span started while it was the
		// global one, the earlier ones no more.
		for j, r := range recs {
			if got := len(r.Ended()); got != 1 {
				t.Errorf("after provider %d was set, provider %d has %d spans, want 1", i, j, got)
			}
		}
	}
}
