package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/executor/noop"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/worker"
	"github.com/fleet-dev/fleet/job"
)

// submit submits one job of c's tenant, a no-op at priority p in pool,
// and returns the time just before.
func submit(t testing.TB, c *client.Client, pool, id string, p int, command ...string) time.Time {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if len(command) == 0 {
		command = []string{"true"}
	}
	before := time.Now()
	if _, err := c.Submit(ctx, &job.Request{ID: id, Pool: pool, Priority: p, Command: command}); err != nil {
		t.Fatalf("submit %s: %v", id, err)
	}
	return before
}

// startedAt waits for a job's result and returns when its attempt
// started; the job must have succeeded at its first attempt.
func startedAt(t testing.TB, c *client.Client, id string) time.Time {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := c.Result(ctx, id)
	if err != nil {
		t.Fatalf("result of %s: %v", id, err)
	}
	if r.Status != job.StatusSucceeded || r.StartedAt == nil || r.Attempts != 1 {
		t.Fatalf("%s: %s after %d attempts (%+v)", id, r.Status, r.Attempts, r.Failure)
	}
	return *r.StartedAt
}

// firstStart submits one no-op job and returns how long it took from just
// before its submission to its start.
func firstStart(t testing.TB, c *client.Client, pool, id string, p int) time.Duration {
	t.Helper()
	before := submit(t, c, pool, id, p)
	return startedAt(t, c, id).Sub(before)
}

// tenant returns a client of the fleet acting as tenant.
func tenant(t testing.TB, f *fleettest.Fleet, name string) *client.Client {
	t.Helper()
	c, err := client.New(f.NATS.Connect(t), client.WithTenant(name))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// newQueueLatency runs a job of tenant default in a pool whose worker just
// started (the pool then has one queue, which the worker's pull requests
// wait on), then another (an established queue's latency), then the first
// job of tenant newcomer at priority p, or of default at p when newcomer
// is "" (a queue the dispatcher makes for it): both latencies, from just
// before the submission to the start.
func newQueueLatency(t testing.TB, f *fleettest.Fleet, pool, newcomer string, p int) (known, fresh time.Duration) {
	t.Helper()
	firstStart(t, f.Client, pool, pool+"-warm", job.DefaultPriority)
	known = firstStart(t, f.Client, pool, pool+"-known", job.DefaultPriority)
	c := f.Client
	if newcomer != "" {
		c = tenant(t, f, newcomer)
	}
	fresh = firstStart(t, c, pool, pool+"-first", p)
	return known, fresh
}

// A new queue of a pool (a tenant's first job, or a priority's) starts its
// first job as fast as a queue the worker knew (docs/sharing.md: the
// dispatcher says it made the queue, and the worker pulls from it at once),
// rather than once the pull request already waiting on the pool's one
// queue expires (FetchWait, a second).
func TestNewQueueStartsAtOnce(t *testing.T) {
	f := fleettest.Start(t)
	for _, tc := range []struct {
		name, tenant string
		priority     int
	}{
		{"tenant", "newcomer", job.DefaultPriority},
		{"priority", "", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := "newq-" + tc.name
			f.Worker(t, noop.Executor{}, worker.Config{Pool: pool, Slots: 2, Backend: "noop"})
			known, fresh := newQueueLatency(t, f, pool, tc.tenant, tc.priority)
			t.Logf("submission to start: established queue %v, new queue %v", known.Round(time.Microsecond), fresh.Round(time.Microsecond))
			if fresh > 300*time.Millisecond {
				t.Errorf("the first job of a new queue started %v after its submission; want within 300ms (an established queue's: %v)",
					fresh.Round(time.Millisecond), known.Round(time.Millisecond))
			}
		})
	}
	// A third queue, on a worker that pulls from two already.
	t.Run("third", func(t *testing.T) {
		pool := "newq-third"
		f.Worker(t, noop.Executor{}, worker.Config{Pool: pool, Slots: 2, Backend: "noop"})
		known, second := newQueueLatency(t, f, pool, "second", job.DefaultPriority)
		third := firstStart(t, tenant(t, f, "third"), pool, pool+"-third", job.DefaultPriority)
		t.Logf("submission to start: established queue %v, second queue %v, third %v", known.Round(time.Microsecond),
			second.Round(time.Microsecond), third.Round(time.Microsecond))
		if third > 300*time.Millisecond {
			t.Errorf("the first job of a third queue started %v after its submission; want within 300ms", third.Round(time.Millisecond))
		}
	})
}

// holding runs a job whose command is "hold" until release is closed, and
// any other at once.
type holding struct {
	started chan string
	release chan struct{}
}

func (h holding) Run(ctx context.Context, t *executor.Task) (*executor.Outcome, error) {
	at := time.Now()
	if len(t.Request.Command) > 0 && t.Request.Command[0] == "hold" {
		h.started <- t.JobID
		select {
		case <-h.release:
		case <-ctx.Done():
			return executor.CancelledOutcome(ctx, at), nil
		}
	}
	return executor.Succeeded(at, nil), nil
}

// The pull requests whose wait a new queue cut are still open on the
// server: a job of the first queue that one brings while every slot runs
// the new queue's jobs goes back to its queue, once (delivered again at
// once it would go to the same request, back and forth), and starts when a
// slot frees.
func TestCutPullHandsBackWhatItBrings(t *testing.T) {
	f := fleettest.Start(t)
	pool := "newq-cut"
	h := holding{started: make(chan string, 2), release: make(chan struct{})}
	f.Worker(t, h, worker.Config{Pool: pool, Slots: 2, Backend: "noop", FetchWait: 3 * time.Second})
	firstStart(t, f.Client, pool, pool+"-warm", job.DefaultPriority)
	// Both slots wait on q3-default; tenant newcomer's two jobs take them.
	newcomer := tenant(t, f, "newcomer")
	for _, id := range []string{"hold-1", "hold-2"} {
		submit(t, newcomer, pool, id, job.DefaultPriority, "hold")
	}
	for range 2 {
		select {
		case <-h.started:
		case <-time.After(2 * time.Second):
			t.Fatal("the new queue's jobs did not both start within 2s (before the pull requests on the first queue expired)")
		}
	}
	// A job of default, queued while every slot runs and the cut requests
	// are open.
	submit(t, f.Client, pool, pool+"-late", job.DefaultPriority)
	time.Sleep(500 * time.Millisecond)
	released := time.Now()
	close(h.release)
	started := startedAt(t, f.Client, pool+"-late")
	for _, id := range []string{"hold-1", "hold-2"} {
		startedAt(t, newcomer, id)
	}
	if wait := started.Sub(released); wait > 4*time.Second {
		t.Errorf("the job handed back started %v after a slot freed; want within the cut request's wait, 3s, and a moment", wait.Round(time.Millisecond))
	}
	js, err := jetstream.New(f.NC)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cons, err := js.Consumer(ctx, f.Queue.Names.PoolStreamV2(pool), f.Queue.Names.QueueConsumer(job.DefaultPriority, job.DefaultTenant))
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// warm once; late once, or twice when handed back, or three times when
	// two cut requests each brought it.
	t.Logf("deliveries of %s: %d", info.Name, info.Delivered.Consumer)
	if info.Delivered.Consumer > 4 {
		t.Errorf("%s delivered %d times for its 2 jobs; want at most 4", info.Name, info.Delivered.Consumer)
	}
}
