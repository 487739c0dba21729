package dispatcher

import (
	"context"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// BenchmarkCountSubmitted measures counting one submission by its pool,
// with the SDK's meter as Setup installs it, many submissions at once.
func BenchmarkCountSubmitted(b *testing.B) {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	defer mp.Shutdown(context.Background())
	x := newMetrics(mp.Meter("bench"))
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			x.countSubmitted(ctx, "default")
		}
	})
}
