package console

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/natstest"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// feedFleet is a NATS server with the fleet's streams and a pool, and a
// console following them whose streams are listed every check.
type feedFleet struct {
	js   jetstream.JetStream
	cfg  queue.Config
	jobs *queue.Jobs
	c    *Console
}

func startFeed(t *testing.T, check time.Duration, pools ...string) *feedFleet {
	t.Helper()
	srv := natstest.Run(t)
	js, _ := jetstream.New(srv.Connect(t))
	ctx := context.Background()
	f := &feedFleet{js: js, jobs: queue.NewJobs(js, queue.Names{})}
	if err := queue.Setup(ctx, js, f.cfg, nil); err != nil {
		t.Fatal(err)
	}
	for _, p := range pools {
		if _, err := queue.EnsurePoolStream(ctx, js, f.cfg, p, nil); err != nil {
			t.Fatal(err)
		}
	}
	cjs, _ := jetstream.New(srv.Connect(t))
	c, err := New(Config{JS: cjs, Queue: f.cfg, Logger: fleettest.Logger(t),
		History: func(context.Context, string, string) (*job.HistoryReply, error) { return nil, errors.New("none") }})
	if err != nil {
		t.Fatal(err)
	}
	c.feed.check = check
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	f.c = c
	waitUntil(t, "the index ready", 10*time.Second, c.index.Ready)
	return f
}

func waitUntil(t *testing.T, what string, d time.Duration, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if ok() {
			return
		}
	}
	t.Fatalf("%s: not within %s", what, d)
}

// run writes a job's versions: queued, running, and succeeded unless
// running is set.
func (f *feedFleet) run(t *testing.T, tenant, pool, id string, running bool) {
	t.Helper()
	ctx := context.Background()
	now := time.Now()
	q := &job.Record{ID: id, Tenant: tenant, Pool: pool, Priority: 3, State: job.StateQueued, Event: job.EventQueued,
		SubmittedAt: now, UpdatedAt: now, Request: &job.Request{ID: id, Command: []string{"true"}}}
	rev, err := f.jobs.Queue(ctx, q, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := q.Version()
	s.State, s.Event, s.Attempt, s.WorkerID, s.StartedAt = job.StateRunning, job.EventStarted, 1, "w", &now
	if rev, err = f.jobs.Write(ctx, s, rev); err != nil || running {
		if err != nil {
			t.Fatal(err)
		}
		return
	}
	r := s.Version()
	r.State, r.Event, r.FinishedAt = job.StateSucceeded, job.EventSucceeded, &now
	if _, err := f.jobs.Write(ctx, r, rev); err != nil {
		t.Fatal(err)
	}
}

// republish turns the pool stream's live copies on or off, as a stream
// whose leader changed may not make some.
func (f *feedFleet) republish(t *testing.T, pool string, on bool) {
	t.Helper()
	sc := f.cfg.PoolStreamV2(pool)
	if !on {
		sc.RePublish = nil
	}
	if _, err := f.js.UpdateStream(context.Background(), sc); err != nil {
		t.Fatal(err)
	}
}

func (f *feedFleet) state(tenant, pool, id string) job.State {
	r, _, ok := f.c.index.Job(queue.JobKey{Tenant: tenant, Pool: pool, ID: id})
	if !ok {
		return ""
	}
	return r.State
}

// TestFeedReplaysFollowsAndCatchesUp: the index holds what the streams
// held before it started (the replay), follows what comes live, finds a
// pool that appears, and reads from the stream what the live copies
// missed: after a hole in the sequences at once, and, when nothing came
// after the hole, from the listing of the streams.
func TestFeedReplaysFollowsAndCatchesUp(t *testing.T) {
	t.Run("after a hole", func(t *testing.T) {
		f := startFeed(t, time.Hour, "default") // listed only when it starts
		f.run(t, "acme", "default", "live-1", false)
		waitUntil(t, "a job live", 5*time.Second, func() bool { return f.state("acme", "default", "live-1") == job.StateSucceeded })
		f.republish(t, "default", false)
		f.run(t, "acme", "default", "missed-1", false)
		f.run(t, job.DefaultTenant, "default", "missed-2", true)
		f.republish(t, "default", true)
		f.run(t, "acme", "default", "after-1", true)
		waitUntil(t, "the missed versions", 5*time.Second, func() bool {
			return f.state("acme", "default", "missed-1") == job.StateSucceeded &&
				f.state(job.DefaultTenant, "default", "missed-2") == job.StateRunning &&
				f.state("acme", "default", "after-1") == job.StateRunning
		})
		// A pool made after the feed started comes with its first job.
		if _, err := queue.EnsurePoolStream(context.Background(), f.js, f.cfg, "late", nil); err != nil {
			t.Fatal(err)
		}
		f.run(t, "acme", "late", "late-1", false)
		waitUntil(t, "a new pool's job", 5*time.Second, func() bool { return f.state("acme", "late", "late-1") == job.StateSucceeded })
		if n := f.c.index.Len(); n != 5 {
			t.Errorf("%d jobs in the index, want 5", n)
		}
	})
	t.Run("nothing after the hole", func(t *testing.T) {
		f := startFeed(t, 100*time.Millisecond, "default")
		f.republish(t, "default", false)
		f.run(t, "acme", "default", "quiet-1", false)
		waitUntil(t, "the missed versions, from the listing", 5*time.Second, func() bool {
			return f.state("acme", "default", "quiet-1") == job.StateSucceeded
		})
	})
	t.Run("replay", func(t *testing.T) {
		srv := natstest.Run(t)
		js, _ := jetstream.New(srv.Connect(t))
		cfg := queue.Config{}
		if err := queue.Setup(context.Background(), js, cfg, nil); err != nil {
			t.Fatal(err)
		}
		before := &feedFleet{js: js, cfg: cfg, jobs: queue.NewJobs(js, cfg.Names)}
		for i, p := range []string{"default", "gpu"} {
			if _, err := queue.EnsurePoolStream(context.Background(), js, cfg, p, nil); err != nil {
				t.Fatal(err)
			}
			for n := range 50 {
				before.run(t, "acme", p, fmt.Sprint("old-", n), n%2 == i)
			}
		}
		cjs, _ := jetstream.New(srv.Connect(t))
		c, err := New(Config{JS: cjs, Queue: cfg, Logger: fleettest.Logger(t),
			History: func(context.Context, string, string) (*job.HistoryReply, error) { return nil, errors.New("none") }})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Stop(context.Background()) })
		waitUntil(t, "the index ready", 10*time.Second, c.index.Ready)
		st := c.index.Stats(time.Now())[0]
		if c.index.Len() != 100 || st.ByState["running"] != 50 || st.ByState["succeeded"] != 50 {
			t.Errorf("after the replay: %d jobs, %v", c.index.Len(), st.ByState)
		}
		// The replay's consumers are gone once it is done.
		for _, p := range []string{"default", "gpu"} {
			s, err := js.Stream(context.Background(), cfg.PoolStreamV2(p).Name)
			if err != nil {
				t.Fatal(err)
			}
			waitUntil(t, "no consumer left on "+p, 5*time.Second, func() bool {
				info, err := s.Info(context.Background())
				return err == nil && info.State.Consumers == 0
			})
		}
	})
}

// A pool's read whose fetches nobody answers is not taken for caught up.
// The console's user may create consumers but not pull from them: the
// read fails, and the pool stays behind, to be read again at the next
// listing, where it once returned as if the pool had nothing past where
// it began.
func TestAPoolReadWhoseFetchesGoUnansweredIsNotCaughtUp(t *testing.T) {
	srv := natstest.Run(t,
		natstest.WithUser("admin", "admin", nil),
		natstest.WithUser("console", "console", &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{"$JS.API.>"}, Deny: []string{"$JS.API.CONSUMER.MSG.NEXT.>"}},
			Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
		}))
	ctx := context.Background()
	js, _ := jetstream.New(srv.ConnectAs(t, "admin", "admin"))
	f := &feedFleet{js: js, jobs: queue.NewJobs(js, queue.Names{})}
	if err := queue.Setup(ctx, js, f.cfg, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := queue.EnsurePoolStream(ctx, js, f.cfg, "default", nil); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		f.run(t, "acme", "default", fmt.Sprint("j-", i), false)
	}
	// Read by a user who may pull, the pool's nine versions are all there.
	admin := newFeed(js, queue.Names{}, NewIndex(time.Hour, 1000), fleettest.Logger(t))
	if end, err := admin.read(ctx, "default", 1); err != nil || admin.index.Len() != 3 {
		t.Fatalf("read by a user who may pull: %d jobs, end %d (%v)", admin.index.Len(), end, err)
	}
	cjs, _ := jetstream.New(srv.ConnectAs(t, "console", "console"))
	fd := newFeed(cjs, queue.Names{}, NewIndex(time.Hour, 1000), fleettest.Logger(t))
	end, err := fd.read(ctx, "default", 1)
	if err == nil {
		t.Fatalf("a read whose fetches went unanswered ended at %d with no error, %d jobs in the index", end, fd.index.Len())
	}
}
