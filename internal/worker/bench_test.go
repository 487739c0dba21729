package worker_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
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

// BenchmarkFirstJobOfNewTenant measures, side by side, how long a job
// takes from its submission to its start on a worker that knows its queue
// (an established tenant's, default) and on one that does not (a new
// tenant's first job: the dispatcher makes its queue and says so). Each
// round has a pool of its own and a worker just started, whose pool has
// had one queue (default's, a job run on it first): its pull requests wait
// on that queue. It reports each latency's median and range over the
// rounds, in milliseconds.
func BenchmarkFirstJobOfNewTenant(b *testing.B) {
	f := fleettest.Start(b)
	// Each round's worker stops beside the next rounds (a stop waits for
	// its pull requests to expire), before their connections close.
	var stopping sync.WaitGroup
	defer stopping.Wait()
	var known, fresh []float64
	run := job.NewID()[16:]
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		pool := fmt.Sprintf("nt-%s-%d", run, i)
		w, err := worker.New(f.NATS.Connect(b), noop.Executor{}, worker.Config{ID: pool, Pool: pool, Slots: 2, Backend: "noop",
			Queue: f.Queue, Logger: fleettest.Logger(b)})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err = w.Start(ctx)
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		k, n := newQueueLatency(b, f, pool, "new-"+pool, job.DefaultPriority)
		known, fresh = append(known, ms(k)), append(fresh, ms(n))
		stopping.Add(1)
		go func() {
			defer stopping.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = w.Stop(ctx)
		}()
	}
	b.StopTimer()
	for _, m := range []struct {
		name string
		v    []float64
	}{{"established", known}, {"new_tenant", fresh}} {
		slices.Sort(m.v)
		b.ReportMetric((m.v[(len(m.v)-1)/2]+m.v[len(m.v)/2])/2, m.name+"_p50_ms")
		b.ReportMetric(m.v[0], m.name+"_min_ms")
		b.ReportMetric(m.v[len(m.v)-1], m.name+"_max_ms")
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
