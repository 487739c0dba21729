package queue

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/natstest"
	"github.com/fleet-dev/fleet/job"
)

// BenchmarkFinalVersion measures what the stream's refusal of a second
// final version costs a job: each op queues a job and writes its final
// version (two compare-and-set writes on a real server with file
// storage), the final one with its message id, as Jobs.Write sends it
// (msgid), and without (cas), which is how it was written before.
//
// go test -run '^$' -bench BenchmarkFinalVersion -count 5 ./internal/queue/
func BenchmarkFinalVersion(b *testing.B) {
	for _, withID := range []bool{false, true} {
		name := "cas"
		if withID {
			name = "msgid"
		}
		b.Run(name, func(b *testing.B) {
			s := natstest.Run(b)
			nc := s.Connect(b)
			js, err := jetstream.New(nc)
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			cfg := Config{}.WithDefaults()
			if _, err := js.CreateStream(ctx, cfg.PoolStreamV2("bench")); err != nil {
				b.Fatal(err)
			}
			jobs := NewJobs(js, cfg.Names)
			now := time.Now()
			req := &job.Request{Command: []string{"true"}}
			req.Normalize()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				id := fmt.Sprintf("j%d", i)
				q := &job.Record{ID: id, Tenant: job.DefaultTenant, Pool: "bench", Priority: 3, State: job.StateQueued,
					Event: job.EventQueued, SubmittedAt: now, UpdatedAt: now, Request: req}
				rev, err := jobs.Queue(ctx, q, 0, nil)
				if err != nil {
					b.Fatal(err)
				}
				f := &job.Record{ID: id, Tenant: job.DefaultTenant, Pool: "bench", Priority: 3, State: job.StateSucceeded,
					Event: job.EventSucceeded, SubmittedAt: now, UpdatedAt: now, FinishedAt: &now,
					Result: &job.Result{JobID: id, Pool: "bench", Status: job.StatusSucceeded, Attempts: 1, FinishedAt: now}}
				m, err := jobs.Msg(f, rev)
				if err != nil {
					b.Fatal(err)
				}
				if !withID {
					m.Header.Del(jetstream.MsgIDHeader)
				}
				if _, err := js.PublishMsg(ctx, m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
