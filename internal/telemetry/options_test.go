package telemetry_test

import (
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/fleet-dev/fleet/internal/telemetry"
)

func TestOptionsKeepsAtMostItsLimit(t *testing.T) {
	built := 0
	o := telemetry.NewOptions(2, func(pool string) metric.MeasurementOption {
		built++
		return metric.WithAttributeSet(attribute.NewSet(attribute.String("pool", pool)))
	})
	for range 3 {
		for _, p := range []string{"a", "b", "c"} {
			set := metric.NewAddConfig([]metric.AddOption{o.Get(p)}).Attributes()
			if v, _ := set.Value("pool"); v.AsString() != p {
				t.Fatalf("options of %s carry pool %q", p, v.AsString())
			}
		}
	}
	// a and b are kept, built once each; c, past the limit, each time.
	if o.Len() != 2 || built != 2+3 {
		t.Errorf("kept %d, built %d times; want 2 kept, 5 builds", o.Len(), built)
	}
}
