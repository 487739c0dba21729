package worker_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/executor/noop"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/internal/worker"
	"github.com/fleet-dev/fleet/job"
)

// BenchmarkPullRunPublish measures a worker's hot path with the noop
// executor: pull a job, record it running, record it finished with its
// result, acknowledge. Jobs are queued in the pool's stream directly, as a
// dispatcher queues them, so the dispatcher's work is not counted.
func BenchmarkPullRunPublish(b *testing.B) {
	f := fleettest.Start(b)
	nc := f.NATS.Connect(b)
	js, _ := jetstream.New(nc)
	results := make(chan struct{}, 1<<16)
	sub, err := nc.Subscribe("fleet.t.default.job.default.r.>", func(*nats.Msg) { results <- struct{}{} })
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Unsubscribe()
	f.Worker(b, noop.Executor{}, worker.Config{Slots: 256, Backend: "noop"})
	jobs := queue.NewJobs(js, queue.Names{})
	run := job.NewID()[12:]
	b.ReportAllocs()
	b.ResetTimer()
	go func() {
		for i := 0; i < b.N; i++ {
			r := &job.Request{ID: fmt.Sprintf("w-%s-%d", run, i), Pool: job.DefaultPool, Priority: job.DefaultPriority,
				Command: []string{"true"}}
			now := time.Now()
			m, _ := jobs.Msg(&job.Record{ID: r.ID, Tenant: job.DefaultTenant, Pool: r.Pool, Priority: r.Priority,
				State: job.StateQueued, Event: job.EventQueued, MaxAttempts: 1, SubmittedAt: now, UpdatedAt: now, Request: r}, 0)
			if _, err := js.PublishMsgAsync(m); err != nil {
				b.Error(err)
				return
			}
		}
	}()
	timeout := time.After(2 * time.Minute)
	for i := 0; i < b.N; i++ {
		select {
		case <-results:
		case <-timeout:
			b.Fatalf("only %d of %d results", i, b.N)
		}
	}
}

// BenchmarkNoticePublish measures publishing one heartbeat event (a
// notice, contract v2: a worker's heartbeats and log lines, captured by
// the events stream) and waiting for JetStream to store it, many at once.
// Workers publish notices without waiting; the wait here measures what
// storing one costs.
func BenchmarkNoticePublish(b *testing.B) {
	f := fleettest.Start(b)
	js, _ := jetstream.New(f.NATS.Connect(b), jetstream.WithPublishAsyncMaxPending(4096))
	names := queue.Names{}
	b.ReportAllocs()
	b.ResetTimer()
	futures := make([]jetstream.PubAckFuture, 0, 1024)
	for i := 0; i < b.N; i++ {
		e := &job.Event{JobID: "bench", Tenant: job.DefaultTenant, Attempt: 1, Type: job.EventHeartbeat, Time: time.Now(),
			Pool: "default", WorkerID: "w"}
		m, err := names.NoticeMsg(e)
		if err != nil {
			b.Fatal(err)
		}
		fut, err := js.PublishMsgAsync(m)
		if err != nil {
			b.Fatal(err)
		}
		futures = append(futures, fut)
		if len(futures) == cap(futures) || i == b.N-1 {
			for _, f := range futures {
				select {
				case <-f.Ok():
				case err := <-f.Err():
					b.Fatal(err)
				}
			}
			futures = futures[:0]
		}
	}
}
