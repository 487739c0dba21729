package dispatcher_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/job"
)

// BenchmarkSubmit measures the dispatcher's hot path: a request on the
// tenant's submit subject, validated, queued (one write: the job's first
// record version, with its request), answered to the producer. Many
// producers submit at once.
func BenchmarkSubmit(b *testing.B) {
	f := fleettest.Start(b)
	nc := f.NATS.Connect(b)
	var n atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(32)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			data, _ := json.Marshal(&job.Request{ID: fmt.Sprintf("b-%d", n.Add(1)), Command: []string{"true"}})
			m, err := nc.RequestWithContext(context.Background(), "fleet.t.default.submit", data)
			if err != nil {
				b.Error(err)
				return
			}
			var r struct{ Error string }
			if json.Unmarshal(m.Data, &r) != nil || r.Error != "" {
				b.Errorf("rejected: %s", m.Data)
				return
			}
		}
	})
}
