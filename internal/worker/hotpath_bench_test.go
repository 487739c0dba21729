package worker

import (
	"context"
	"io"
	"log/slog"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// BenchmarkDeliveryLog measures what one succeeded job costs in logging:
// the delivery's logger given the job's id, tenant, attempt and trace, and
// its "job finished" line, with the logger of a worker run with the
// default flags (text, or json, at Info, here to io.Discard).
func BenchmarkDeliveryLog(b *testing.B) {
	for _, c := range []struct {
		name string
		h    slog.Handler
	}{
		{"text", slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo})},
		{"json", slog.NewJSONHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo})},
	} {
		b.Run(c.name, func(b *testing.B) {
			w := &Worker{log: slog.New(c.h).With("component", "worker", "worker_id", "w-1", "pool", "default")}
			res := &job.Result{Status: job.StatusSucceeded, Attempts: 1}
			b.ReportAllocs()
			for b.Loop() {
				d := &delivery{w: w, id: "bench-job", key: queue.JobKey{Tenant: "acme", Pool: "default", ID: "bench-job"},
					n: 1, traceID: "4bf92f3577b34da6a3ce929d0e0e4736"}
				d.logJob()
				d.logAttempt()
				d.logFinished(res)
			}
		})
	}
}

// BenchmarkTenantWaitAttrs measures finding the attribute set of a
// tenant's jobs at a priority, as each job's first start does.
func BenchmarkTenantWaitAttrs(b *testing.B) {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	defer mp.Shutdown(context.Background())
	w := &Worker{cfg: Config{Pool: "default", Slots: 1}}
	x := newMetrics(mp.Meter("bench"), w)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_ = x.byTenant("acme", 4)
		}
	})
}

// BenchmarkReceiveQueued measures reading a first delivery's message, as
// receive does: the record version that queued the job decoded, its
// secrets opened (none here), its request validated against the worker's
// limits and normalized.
func BenchmarkReceiveQueued(b *testing.B) {
	r := &job.Request{ID: "job-1", Pool: "default", Command: []string{"true"}, Env: map[string]string{"MODE": "fast"}}
	msg := jobMessage(b, &ops{}, r, 7, 1)
	k := queue.JobKey{Tenant: job.DefaultTenant, Pool: "default", ID: "job-1"}
	sealer, _ := queue.NewSealer(make([]byte, 32))
	b.ReportAllocs()
	for b.Loop() {
		rec, err := decodeQueued(msg.Data(), k)
		if err == nil {
			err = sealer.Open(k, rec.Request, rec.Secrets)
		}
		if err == nil {
			err = rec.Request.Validate(job.Limits{})
		}
		if err != nil {
			b.Fatal(err)
		}
		rec.Request.Normalize()
	}
}
