package console_test

import (
	"context"
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

// BenchmarkConsoleFeed measures what following the jobs bucket costs: a
// NATS server with JetStream in this process (as the embedded dispatcher
// runs it) takes job records written as a fleet writes them (queued,
// running, succeeded: three per job, 32 writers at once), with and
// without a console following them. It reports the process's CPU per
// job (the server's, the writers' and the console's), so that the
// difference is the console's cost per job.
func BenchmarkConsoleFeed(b *testing.B) {
	for _, mode := range []string{"off", "consumer"} {
		withConsole := mode != "off"
		b.Run("console="+mode, func(b *testing.B) {
			srv := natstest.Run(b)
			nc := srv.Connect(b)
			js, _ := jetstream.New(nc)
			ctx := context.Background()
			cfg := queue.Config{}
			if err := queue.Setup(ctx, js, cfg, nil); err != nil {
				b.Fatal(err)
			}
			store, err := queue.NewStore(ctx, js, cfg.Names, nil)
			if err != nil {
				b.Fatal(err)
			}
			var c *console.Console
			if withConsole {
				c, err = console.New(console.Config{JS: js, Queue: cfg, Logger: fleettest.Logger(b)})
				if err != nil {
					b.Fatal(err)
				}
				if err := c.Start(ctx); err != nil {
					b.Fatal(err)
				}
				defer func() { _ = c.Stop(ctx) }()
			}
			b.ResetTimer()
			start := cpuTime()
			jobs := make(chan int)
			var wg sync.WaitGroup
			for range 32 {
				wg.Go(func() {
					for n := range jobs {
						now := time.Now()
						rec := &job.Record{ID: fmt.Sprintf("feed-%d-%d", b.N, n), Pool: "default", State: job.StateQueued,
							MaxAttempts: 1, SubmittedAt: now, UpdatedAt: now, Labels: map[string]string{"team": "build"}}
						rev, err := store.Create(ctx, rec)
						if err != nil {
							b.Error(err)
							return
						}
						rec.State, rec.Attempt, rec.WorkerID, rec.Backend, rec.StartedAt = job.StateRunning, 1, "w1", "noop", &now
						if rev, err = store.Update(ctx, rec, rev); err != nil {
							b.Error(err)
							return
						}
						code := 0
						rec.State, rec.FinishedAt, rec.ExitCode = job.StateSucceeded, &now, &code
						if _, err = store.Update(ctx, rec, rev); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			for n := range b.N {
				jobs <- n
			}
			close(jobs)
			wg.Wait()
			if withConsole {
				// Until the console has seen every job.
				want := fmt.Sprintf("feed-%d-%d", b.N, b.N-1)
				for deadline := time.Now().Add(30 * time.Second); !c.Index().Has(want) && time.Now().Before(deadline); {
					time.Sleep(time.Millisecond)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64((cpuTime()-start).Microseconds())/float64(b.N), "cpu-µs/job")
		})
	}
}
