package console_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/console"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/natstest"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkConsoleFeed measures what following the pools' streams costs:
// a NATS server with JetStream in this process (as the embedded
// dispatcher runs it) takes job record versions written as a fleet writes
// them (queued with the request, running, succeeded with the result: three
// per job, 32 writers at once), with and without a console following them.
// It reports the process's CPU per job (the server's, the writers' and the
// console's), so that the difference is the console's cost per job.
//
// console=consumer is for comparison: what an ordered consumer on the
// pool's stream, its versions applied to an index as the console does,
// costs instead of the console's feed (its subscription to the stream's
// republished copies).
func BenchmarkConsoleFeed(b *testing.B) {
	for _, mode := range []string{"off", "on", "consumer"} {
		b.Run("console="+mode, func(b *testing.B) {
			srv := natstest.Run(b)
			nc := srv.Connect(b)
			js, _ := jetstream.New(nc)
			ctx := context.Background()
			cfg := queue.Config{}
			if err := queue.Setup(ctx, js, cfg, nil); err != nil {
				b.Fatal(err)
			}
			if _, err := queue.EnsurePoolStream(ctx, js, cfg, job.DefaultPool, nil); err != nil {
				b.Fatal(err)
			}
			jobs := queue.NewJobs(js, cfg.Names)
			var index *console.Index
			switch mode {
			case "on":
				// The console has a connection of its own, as it would share
				// the dispatcher's.
				cjs, _ := jetstream.New(srv.Connect(b))
				c, err := console.New(console.Config{JS: cjs, Queue: cfg, Logger: fleettest.Logger(b),
					History: func(context.Context, string, string) (*job.HistoryReply, error) {
						return nil, errors.New("not in the benchmark")
					}})
				if err != nil {
					b.Fatal(err)
				}
				if err := c.Start(ctx); err != nil {
					b.Fatal(err)
				}
				defer func() { _ = c.Stop(ctx) }()
				index = c.Index()
				for deadline := time.Now().Add(10 * time.Second); !index.Ready() && time.Now().Before(deadline); {
					time.Sleep(time.Millisecond)
				}
			case "consumer":
				index = console.NewIndex(0, 0)
				stop := followWithConsumer(b, srv, cfg.Names, index)
				defer stop()
			}
			b.ResetTimer()
			start := cpuTime()
			work := make(chan int)
			var wg sync.WaitGroup
			for range 32 {
				wg.Go(func() {
					for n := range work {
						if err := writeJob(ctx, jobs, fmt.Sprintf("feed-%d-%d", b.N, n)); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			for n := range b.N {
				work <- n
			}
			close(work)
			wg.Wait()
			if index != nil {
				// Until the console has seen every job end.
				last := queue.JobKey{Tenant: job.DefaultTenant, Pool: job.DefaultPool, ID: fmt.Sprintf("feed-%d-%d", b.N, b.N-1)}
				for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
					if r, _, ok := index.Job(last); ok && r.State.Final() {
						break
					}
				}
			}
			b.StopTimer()
			b.ReportMetric(float64((cpuTime()-start).Microseconds())/float64(b.N), "cpu-µs/job")
		})
	}
}

// writeJob writes the three versions of a no-op job's record, as the
// dispatcher and a worker write them.
func writeJob(ctx context.Context, jobs *queue.Jobs, id string) error {
	now := time.Now()
	q := &job.Record{ID: id, Tenant: job.DefaultTenant, Pool: job.DefaultPool, Priority: job.DefaultPriority,
		State: job.StateQueued, Event: job.EventQueued, MaxAttempts: 1, SubmittedAt: now, UpdatedAt: now,
		Labels: map[string]string{"team": "build"}, Request: &job.Request{ID: id, Command: []string{"true"}}}
	rev, err := jobs.Queue(ctx, q, 0, nil)
	if err != nil {
		return err
	}
	s := q.Version()
	s.State, s.Event, s.Attempt, s.WorkerID, s.Backend, s.StartedAt = job.StateRunning, job.EventStarted, 1, "w1", "noop", &now
	if rev, err = jobs.Write(ctx, s, rev); err != nil {
		return err
	}
	code := 0
	r := s.Version()
	r.State, r.Event, r.FinishedAt, r.ExitCode = job.StateSucceeded, job.EventSucceeded, &now, &code
	r.Result = &job.Result{JobID: id, Pool: job.DefaultPool, Status: job.StatusSucceeded, Attempts: 1, ExitCode: &code,
		StartedAt: &now, FinishedAt: now, WorkerID: "w1"}
	_, err = jobs.Write(ctx, r, rev)
	return err
}

// followWithConsumer applies every version of the default pool's stream
// to index through an ordered consumer, in batches, until stop.
func followWithConsumer(b *testing.B, srv *natstest.Server, names queue.Names, index *console.Index) (stop func()) {
	js, _ := jetstream.New(srv.Connect(b))
	cons, err := js.OrderedConsumer(context.Background(), names.PoolStreamV2(job.DefaultPool), jetstream.OrderedConsumerConfig{})
	if err != nil {
		b.Fatal(err)
	}
	msgs, err := cons.Messages(jetstream.PullMaxMessages(1000))
	if err != nil {
		b.Fatal(err)
	}
	var mu sync.Mutex
	var pending []console.Update
	wake := make(chan struct{}, 1)
	go func() {
		defer close(wake)
		for {
			m, err := msgs.Next()
			if err != nil {
				return
			}
			meta, err := m.Metadata()
			if err != nil {
				continue
			}
			_, k, ok := names.ParsePoolJob(m.Subject())
			if !ok {
				continue
			}
			mu.Lock()
			pending = append(pending, console.Update{Key: k, Data: m.Data(), Seq: meta.Sequence.Stream})
			mu.Unlock()
			select {
			case wake <- struct{}{}:
			default:
			}
		}
	}()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range wake {
			mu.Lock()
			batch := pending
			pending = nil
			mu.Unlock()
			index.ApplyAll(batch)
		}
	}()
	return func() { msgs.Stop(); <-done }
}
