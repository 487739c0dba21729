package e2e

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/internal/capacity/ledger"
	"github.com/fleet-dev/fleet/internal/dispatcher"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/internal/redistest"
	"github.com/fleet-dev/fleet/internal/worker"
	"github.com/fleet-dev/fleet/job"
)

// Sharing a pool between tenants (docs/sharing.md): priorities, weighted
// fair share over decayed usage, quotas. Each test reads when jobs started
// from their results (started_at, the worker's clock: one process here).

// tenantClient is a client acting as tenant.
func tenantClient(t *testing.T, f *fleettest.Fleet, tenant string) *client.Client {
	t.Helper()
	c, err := client.New(f.NATS.Connect(t), client.WithTenant(tenant))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// submitMany submits n jobs of one tenant, ids <prefix>-<i>, at priority p
// (0: the default), and returns the ids.
func submitMany(t *testing.T, c *client.Client, pool, prefix string, n, p int, command ...string) []string {
	t.Helper()
	ids := make([]string, n)
	var wg sync.WaitGroup
	var failed atomic.Value
	work := make(chan int)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				ids[i] = fmt.Sprintf("%s-%04d", prefix, i)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := c.Submit(ctx, &job.Request{ID: ids[i], Pool: pool, Priority: p, Command: command})
				cancel()
				if err != nil {
					failed.Store(err)
				}
			}
		}()
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		t.Fatalf("submit %s: %v", prefix, err)
	}
	return ids
}

// started is one job's run, from its result.
type started struct {
	id, tenant string
	at, ended  time.Time
}

// results waits for the jobs' results and returns their runs by start.
func results(t *testing.T, c *client.Client, tenant string, ids []string, within time.Duration) []started {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	out := make([]started, len(ids))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for i, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			r, err := c.Result(ctx, id)
			if err != nil {
				t.Errorf("result of %s: %v", id, err)
				return
			}
			if r.Status != job.StatusSucceeded || r.StartedAt == nil || r.Attempts != 1 {
				t.Errorf("%s: %s after %d attempts (%+v)", id, r.Status, r.Attempts, r.Failure)
				return
			}
			out[i] = started{id: id, tenant: tenant, at: *r.StartedAt, ended: r.FinishedAt}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return out
}

func byStart(runs ...[]started) []started {
	all := slices.Concat(runs...)
	sort.Slice(all, func(i, j int) bool { return all[i].at.Before(all[j].at) })
	return all
}

// With one slot busy and 100 priority-5 jobs queued, a priority-1 job
// submitted last is the next to start; the others follow in their order.
func TestPriorityJumpsTheQueue(t *testing.T) {
	f := fleettest.Start(t)
	f.Worker(t, processExec(t), worker.Config{Pool: "prio", Slots: 1})
	busy := f.Submit(t, &job.Request{ID: "prio-busy", Pool: "prio", Command: []string{"sleep", "2"}})
	waitEvent(t, f, busy, job.EventStarted)
	low := submitMany(t, f.Client, "prio", "prio-low", 100, 5, "true")
	urgent := f.Submit(t, &job.Request{ID: "prio-urgent", Pool: "prio", Priority: 1, Command: []string{"true"}})
	if st, err := f.Client.Status(context.Background(), urgent); err != nil || st.Job.State != job.StateQueued {
		t.Fatalf("the urgent job should wait behind the busy slot: %+v %v", st, err)
	}
	runs := byStart(results(t, f.Client, "default", append([]string{busy, urgent}, low...), time.Minute))
	if runs[0].id != busy || runs[1].id != urgent {
		t.Fatalf("started first: %s, %s; want %s, then %s", runs[0].id, runs[1].id, busy, urgent)
	}
	// The queued event says the priority.
	for _, e := range f.Events(t, urgent, 10*time.Second) {
		if e.Type == job.EventQueued && (e.Priority != 1 || e.Tenant != "default") {
			t.Errorf("queued event: priority %d, tenant %q", e.Priority, e.Tenant)
		}
	}
}

// Tenants A (weight 1, 2,000 jobs queued first) and B (weight 3, 200
// queued after) on a 4-slot pool: while both have work, B holds 3 of the
// 4 slots; B ends long before A; with B gone, A gets all 4: its jobs run
// four at once. (How fast A's jobs start alone against beside B is
// logged, not held to a ratio: alone, the machine's speed at starting
// processes bounds it, not the slots; CI saw 2.1× beside a loaded
// machine, where the slots alone would give 4×.)
func TestFairShareFollowsWeights(t *testing.T) {
	f := fleettest.Start(t)
	ctx := context.Background()
	if _, err := f.Client.SetPoolPolicy(ctx, "fair", &job.PolicyChange{Weights: map[string]float64{"a": 1, "b": 3}}); err != nil {
		t.Fatal(err)
	}
	a, b := tenantClient(t, f, "a"), tenantClient(t, f, "b")
	job := []string{"sleep", "0.02"}
	aIDs := submitMany(t, a, "fair", "a", 2000, 0, job...)
	f.Worker(t, processExec(t), worker.Config{Pool: "fair", Slots: 4})
	// A alone for a moment: two rounds of its jobs on the 4 slots.
	rctx, rcancel := context.WithTimeout(ctx, time.Minute)
	if _, err := a.Result(rctx, aIDs[7]); err != nil {
		t.Fatalf("A's eighth job: %v", err)
	}
	rcancel()
	bIDs := submitMany(t, b, "fair", "b", 200, 0, job...)
	aRuns, bRuns := results(t, a, "a", aIDs, 3*time.Minute), results(t, b, "b", bIDs, time.Minute)
	all := byStart(aRuns, bRuns)

	bRuns = byStart(bRuns)
	from, to := bRuns[0].at, bRuns[len(bRuns)-1].at
	var inA, inB int
	for _, r := range all {
		if r.at.Before(from) || r.at.After(to) {
			continue
		}
		if r.tenant == "b" {
			inB++
		} else {
			inA++
		}
	}
	share := float64(inB) / float64(inA+inB)
	t.Logf("while both had work (%s): B started %d, A %d: B's share %.2f", to.Sub(from).Round(time.Millisecond), inB, inA, share)
	if share < 0.675 || share > 0.825 {
		t.Errorf("B's share of the starts while both had work: %.2f, want 0.75 ± 0.075", share)
	}
	aRuns = byStart(aRuns)
	aEnd := aRuns[len(aRuns)-1].ended
	var bEnd time.Time
	for _, r := range bRuns {
		bEnd = later(bEnd, r.ended)
	}
	if aEnd.Sub(bEnd) < aEnd.Sub(aRuns[0].at)/2 {
		t.Errorf("B ended at %s, A at %s: B should end long before", bEnd.Sub(aRuns[0].at), aEnd.Sub(aRuns[0].at))
	}
	// With B gone, A's jobs start four times as fast as beside B.
	rate := func(runs []started, from, to time.Time) float64 {
		n := 0
		for _, r := range runs {
			if !r.at.Before(from) && r.at.Before(to) {
				n++
			}
		}
		return float64(n) / to.Sub(from).Seconds()
	}
	beside, alone := rate(aRuns, from, to), rate(aRuns, bEnd.Add(time.Second), aEnd)
	var afterB []started
	for _, r := range aRuns {
		if r.at.After(bEnd) {
			afterB = append(afterB, r)
		}
	}
	t.Logf("A's starts: %.0f/s beside B, %.0f/s alone; A's jobs at once after B's end: %d", beside, alone, overlap(afterB))
	if n := overlap(afterB); n != 4 {
		t.Errorf("after B's end, A ran %d jobs at once: it should get all 4 slots back", n)
	}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// A tenant that ran alone for a while yields to a newcomer of the same
// weight, as the half-life says: with a short half-life the newcomer takes
// most of the first second's starts; with a long one, half.
func TestUsageDecaysWithTheHalfLife(t *testing.T) {
	for _, c := range []struct {
		halfLife time.Duration
		min, max float64
	}{
		// Theory: old's usage is 3 slots when new comes, so new takes the
		// 4 slots, then yields as its usage grows: ~0.78 over the second.
		{halfLife: 3 * time.Second, min: 0.68, max: 1},
		{halfLife: 24 * time.Hour, min: 0.35, max: 0.65},
	} {
		t.Run(c.halfLife.String(), func(t *testing.T) {
			f := fleettest.Start(t)
			hl := job.Duration(c.halfLife)
			if _, err := f.Client.SetPoolPolicy(context.Background(), "decay", &job.PolicyChange{HalfLife: &hl}); err != nil {
				t.Fatal(err)
			}
			old, newer := tenantClient(t, f, "old"), tenantClient(t, f, "new")
			cmd := []string{"sleep", "0.05"}
			oldIDs := submitMany(t, old, "decay", "old", 600, 0, cmd...)
			f.Worker(t, processExec(t), worker.Config{Pool: "decay", Slots: 4})
			time.Sleep(6 * time.Second) // old runs alone, 4 slots
			newIDs := submitMany(t, newer, "decay", "new", 200, 0, cmd...)
			newRuns := byStart(results(t, newer, "new", newIDs, time.Minute))
			oldRuns := results(t, old, "old", oldIDs, 2*time.Minute)
			from := newRuns[0].at
			var nNew, nOld int
			for _, r := range byStart(oldRuns, newRuns) {
				if r.at.Before(from) || !r.at.Before(from.Add(time.Second)) {
					continue
				}
				if r.tenant == "new" {
					nNew++
				} else {
					nOld++
				}
			}
			share := float64(nNew) / float64(nNew+nOld)
			t.Logf("half-life %s: the newcomer started %d of the first second's %d: %.2f", c.halfLife, nNew, nNew+nOld, share)
			if share < c.min || share > c.max {
				t.Errorf("the newcomer's share of the first second's starts: %.2f, want %.2f to %.2f", share, c.min, c.max)
			}
		})
	}
}

// overlap is the most runs running at once.
func overlap(runs []started) int {
	type edge struct {
		at time.Time
		d  int
	}
	var edges []edge
	for _, r := range runs {
		edges = append(edges, edge{r.at, 1}, edge{r.ended, -1})
	}
	sort.Slice(edges, func(i, j int) bool {
		if edges[i].at.Equal(edges[j].at) {
			return edges[i].d < edges[j].d
		}
		return edges[i].at.Before(edges[j].at)
	})
	n, most := 0, 0
	for _, e := range edges {
		n += e.d
		most = max(most, n)
	}
	return most
}

// Tenant C, with a quota of 2 slots, never runs more than 2 at once on a
// pool of 3 workers and 6 free slots, submitting through 2 dispatchers;
// tenant G's quota of 1 CPU holds the same way for its jobs of half a CPU;
// the others' jobs use the free slots meanwhile. (A GPU quota holds in the
// same script: TestQuotaHoldsAcrossTheWorkersOfAPool, in
// internal/capacity; process jobs cannot ask for GPUs.)
func TestQuotaHoldsAcrossWorkersAndDispatchers(t *testing.T) {
	rs := redistest.Start(t)
	caps := openCapacity(t, rs.URL())
	f := fleettest.Start(t, func(c *dispatcher.Config) { c.Capacity = caps })
	second, err := dispatcher.New(f.NATS.Connect(t), dispatcher.Config{Queue: f.Queue, Capacity: caps, Logger: fleettest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := second.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = second.Stop(context.Background()) })
	if _, err := f.Client.SetPoolPolicy(ctx, "quota", &job.PolicyChange{Quotas: map[string]job.Quota{"c": {Slots: 2}, "g": {CPU: "1"}}}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		id := fmt.Sprintf("quota-%d", i)
		var w atomic.Pointer[worker.Worker]
		r := ledger.New(caps, ledger.Config{WorkerID: id, Pool: "quota", Backend: "process", Slots: 2, CPUMilli: ptr(4000),
			Interval: 250 * time.Millisecond, Draining: func() bool { p := w.Load(); return p != nil && p.Draining() },
			Logger: fleettest.Logger(t)})
		r.Start(ctx)
		t.Cleanup(func() { r.Stop(context.Background()) })
		w.Store(f.Worker(t, processExec(t), worker.Config{ID: id, Pool: "quota", Slots: 2, Capacity: r}))
	}
	c, g, other := tenantClient(t, f, "c"), tenantClient(t, f, "g"), tenantClient(t, f, "other")
	cmd := []string{"sleep", "0.3"}
	cIDs := submitMany(t, c, "quota", "c", 20, 0, cmd...)
	var gIDs []string
	for i := range 6 {
		id := fmt.Sprintf("g-%d", i)
		if _, err := g.Submit(ctx, &job.Request{ID: id, Pool: "quota", Command: cmd, Resources: &job.Resources{CPU: "500m"}}); err != nil {
			t.Fatal(err)
		}
		gIDs = append(gIDs, id)
	}
	oIDs := submitMany(t, other, "quota", "o", 20, 0, cmd...)
	cRuns := results(t, c, "c", cIDs, 2*time.Minute)
	gRuns := results(t, g, "g", gIDs, 2*time.Minute)
	oRuns := results(t, other, "other", oIDs, 2*time.Minute)
	t.Logf("at once: c %d, g %d, other %d, all %d", overlap(cRuns), overlap(gRuns), overlap(oRuns), overlap(slices.Concat(cRuns, gRuns, oRuns)))
	if n := overlap(cRuns); n != 2 {
		t.Errorf("tenant c ran %d at once; its quota is 2 slots (and it had work for more)", n)
	}
	if n := overlap(gRuns); n != 2 {
		t.Errorf("tenant g ran %d jobs of half a CPU at once; its quota is 1 CPU", n)
	}
	if n := overlap(oRuns); n < 3 {
		t.Errorf("tenant other ran at most %d at once beside the quotas: the free slots went unused", n)
	}
	// Pool show says what each tenant holds, and its quota.
	s, err := f.Client.Pool(ctx, "quota")
	if err != nil {
		t.Fatal(err)
	}
	if s.Slots != 6 || s.Policy == nil || s.Policy.Quotas["c"].Slots != 2 {
		t.Errorf("pool show: %d slots, policy %v", s.Slots, s.Policy)
	}
}

// The queues of a pool are durable consumers a worker binds to, named by
// priority and tenant; pool show counts what waits on them.
func TestPoolShowCountsQueuedByTenantAndPriority(t *testing.T) {
	f := fleettest.Start(t)
	ctx := context.Background()
	if _, err := f.Client.PausePool(ctx, "counted", "count"); err != nil {
		t.Fatal(err)
	}
	submitMany(t, tenantClient(t, f, "x"), "counted", "x", 5, 2, "true")
	submitMany(t, tenantClient(t, f, "y"), "counted", "y", 3, 0, "true")
	qs, err := queue.Queues(ctx, f.Dispatcher.JetStream(), f.Queue, "counted")
	if err != nil {
		t.Fatal(err)
	}
	if len(qs) != 2 || qs[queue.QueueKey{Priority: 2, Tenant: "x"}] == nil || qs[queue.QueueKey{Priority: 3, Tenant: "y"}] == nil {
		t.Fatalf("queues: %v", qs)
	}
	s, err := f.Client.Pool(ctx, "counted")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]job.TenantShare{}
	for _, ts := range s.Tenants {
		got[ts.Tenant] = ts
	}
	if got["x"].Queued != 5 || got["x"].QueuedByPri["2"] != 5 || got["y"].Queued != 3 || got["y"].QueuedByPri["3"] != 3 {
		t.Errorf("pool show: %+v", s.Tenants)
	}
	if got["x"].FairShare != 0.5 || got["x"].Weight != 1 {
		t.Errorf("x: weight %g, fair share %g; want 1 and 0.5", got["x"].Weight, got["x"].FairShare)
	}
	// A bad policy is refused, naming what is wrong, and changes nothing.
	if _, err := f.Client.SetPoolPolicy(ctx, "counted", &job.PolicyChange{Weights: map[string]float64{"x": -1}}); err == nil {
		t.Error("a negative weight was accepted")
	}
	if _, err := f.Client.SetPoolPolicy(ctx, "counted", &job.PolicyChange{Quotas: map[string]job.Quota{"x": {CPU: "lots"}}}); err == nil {
		t.Error("an unreadable CPU quota was accepted")
	}
	if s, err := f.Client.Pool(ctx, "counted"); err != nil || s.Policy != nil {
		t.Errorf("after refused changes: %v, %v", s.Policy, err)
	}
}

// A pool whose jobs an older fleet queued for its single consumer
// jobs-<pool>, with no queue of their tenant and priority: a worker of
// this fleet makes the queues from the stream, and runs them.
func TestWorkersTakeOverFromTheSingleConsumer(t *testing.T) {
	f := fleettest.Start(t)
	ctx := context.Background()
	acme := tenantClient(t, f, "acme")
	ids := submitMany(t, acme, "legacy", "old", 3, 2, "true")
	js := f.Dispatcher.JetStream()
	stream := f.Queue.Names.PoolStreamV2("legacy")
	if err := js.DeleteConsumer(ctx, stream, f.Queue.Names.QueueConsumer(2, "acme")); err != nil {
		t.Fatal(err)
	}
	var filters []string
	for p := job.HighestPriority; p <= job.LowestPriority; p++ {
		filters = append(filters, f.Queue.Names.PoolQueued("legacy", p))
	}
	if _, err := js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: f.Queue.Names.PoolConsumer("legacy"),
		FilterSubjects: filters, AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	f.Worker(t, processExec(t), worker.Config{Pool: "legacy", Slots: 2})
	results(t, acme, "acme", ids, 30*time.Second)
}

// A queue's consumer deleted by hand while its worker waits on it is made
// again: the jobs queued after run.
func TestAQueueDeletedByHandIsMadeAgain(t *testing.T) {
	f := fleettest.Start(t)
	ctx := context.Background()
	f.Worker(t, processExec(t), worker.Config{Pool: "handy", Slots: 2})
	first := f.Submit(t, &job.Request{ID: "handy-1", Pool: "handy", Command: []string{"true"}})
	f.Await(t, first, 10*time.Second)
	js := f.Dispatcher.JetStream()
	if err := js.DeleteConsumer(ctx, f.Queue.Names.PoolStreamV2("handy"), f.Queue.Names.QueueConsumer(3, "default")); err != nil {
		t.Fatal(err)
	}
	// The dispatcher made the queue once and does not look again.
	next := f.Submit(t, &job.Request{ID: "handy-2", Pool: "handy", Command: []string{"true"}})
	if r := f.Await(t, next, 20*time.Second); r.Status != job.StatusSucceeded || r.Attempts != 1 {
		t.Fatalf("the job queued after the queue was deleted: %s after %d attempts", r.Status, r.Attempts)
	}
	if r := f.Await(t, first, time.Second); r.Attempts != 1 {
		t.Errorf("the job that ran before the queue was deleted ran again: %d attempts", r.Attempts)
	}
}

// In a pool of several queues, whose worker pulls only what is known to
// wait (no pull request waits on a queue), a queue's consumer deleted by
// hand gets no word to the worker: its fetches find no responders, and the
// worker asks whether the consumer exists. The jobs queued after run.
func TestAQueueDeletedByHandWhileNoPullWaitsIsMadeAgain(t *testing.T) {
	f := fleettest.Start(t)
	ctx := context.Background()
	acme, beta := tenantClient(t, f, "acme"), tenantClient(t, f, "beta")
	first, second := submitMany(t, acme, "handier", "acme-first", 1, 0, "true"), submitMany(t, beta, "handier", "beta-first", 1, 0, "true")
	// The worker finds two queues as it starts: it never waits on one.
	f.Worker(t, processExec(t), worker.Config{Pool: "handier", Slots: 2})
	results(t, acme, "acme", first, 10*time.Second)
	results(t, beta, "beta", second, 10*time.Second)
	js := f.Dispatcher.JetStream()
	if err := js.DeleteConsumer(ctx, f.Queue.Names.PoolStreamV2("handier"), f.Queue.Names.QueueConsumer(3, "acme")); err != nil {
		t.Fatal(err)
	}
	// The dispatcher made the queue once and does not look again.
	results(t, acme, "acme", submitMany(t, acme, "handier", "acme-next", 2, 0, "true"), 20*time.Second)
}
