package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/internal/capacity"
	"github.com/fleet-dev/fleet/internal/capacity/ledger"
	"github.com/fleet-dev/fleet/internal/capacity/monitor"
	"github.com/fleet-dev/fleet/internal/dispatcher"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/redistest"
	"github.com/fleet-dev/fleet/internal/worker"
	"github.com/fleet-dev/fleet/job"
)

func openCapacity(t *testing.T, url string) *capacity.Store {
	t.Helper()
	s, err := capacity.Open(url, capacity.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// capacityWorker starts an in-process worker that reports to Redis.
func capacityWorker(t *testing.T, f *fleettest.Fleet, caps *capacity.Store, id string, slots int, cpu, mem *int64) *worker.Worker {
	t.Helper()
	var w atomic.Pointer[worker.Worker]
	r := ledger.New(caps, ledger.Config{WorkerID: id, Pool: "default", Backend: "process",
		Slots: slots, CPUMilli: cpu, MemoryBytes: mem, Interval: 250 * time.Millisecond,
		Draining: func() bool { p := w.Load(); return p != nil && p.Draining() }, Logger: fleettest.Logger(t)})
	r.Start(context.Background())
	t.Cleanup(func() { r.Stop(context.Background()) })
	w.Store(f.Worker(t, processExec(t), worker.Config{ID: id, Slots: slots, Capacity: r}))
	return w.Load()
}

func ptr(v int64) *int64 { return &v }

func waitFor(t *testing.T, what string, d time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if ok() {
			return
		}
		time.Sleep(25 * time.Millisecond)
	}
	t.Fatalf("%s: not within %s", what, d)
}

func TestKilledWorkerSlotsReturnWithinTheTTL(t *testing.T) {
	rs := redistest.Start(t)
	caps := openCapacity(t, rs.URL())
	f := fleettest.Start(t)
	env := []string{"FLEET_NATS_URL=" + f.NATS.URL(), "FLEET_REDIS_URL=" + rs.URL(), "FLEET_DATA_DIR=" + t.TempDir()}
	w := fleettest.StartProc(t, "worker", env, "--id", "mortal", "--slots", "3", "--heartbeat-interval", "300ms")
	w.WaitOutput(t, "worker started", 20*time.Second)
	nc := f.NATS.Connect(t)
	ear := listen(t, nc, job.DefaultTenant, "default")
	id := f.Submit(t, &job.Request{ID: "held", Command: []string{"sleep", "30"}, Retry: &job.RetryPolicy{MaxAttempts: 2}})

	ctx := context.Background()
	waitFor(t, "the lease in Redis", 10*time.Second, func() bool {
		u, err := caps.Usage(ctx, "default", "mortal")
		return err == nil && u.SlotsUsed == 1 && u.Slots == 3
	})
	w.Kill()
	killed := time.Now()
	// Three intervals, and a little for Redis' expiry cycle.
	// Three intervals, and a little for Redis' expiry cycle: the worker is
	// out of every capacity view.
	waitFor(t, "the worker to leave the pool", 2*time.Second, func() bool {
		hbs, _ := caps.Workers(ctx, "default")
		return len(hbs) == 0
	})
	t.Logf("worker gone %s after the kill", time.Since(killed).Round(10*time.Millisecond))

	// The reaper announces the job the worker held.
	dead, err := monitor.NewReaper(caps, monitor.ReaperConfig{Interval: 300 * time.Millisecond, Announce: f.Dispatcher.Announce, Logger: fleettest.Logger(t)}).Reap(ctx)
	if err != nil || len(dead) != 1 || dead[0] != "mortal" {
		t.Fatalf("reaped %v, %v", dead, err)
	}
	ctx2, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var lost *job.Event
	for e, err := range f.Client.Events(ctx2, id) {
		if err != nil {
			t.Fatal(err)
		}
		if e.Phase == "worker_lost" {
			lost = e
			break
		}
	}
	if lost == nil || lost.WorkerID != "mortal" || lost.Failure == nil || lost.Failure.Code != job.CodeWorkerLost {
		t.Fatalf("worker_lost event: %+v", lost)
	}
	// A second reaper (another dispatcher) finds nothing left to do.
	if dead, _ := monitor.NewReaper(caps, monitor.ReaperConfig{Interval: 300 * time.Millisecond, Announce: f.Dispatcher.Announce}).Reap(ctx); len(dead) != 0 {
		t.Errorf("reaped twice: %v", dead)
	}
	// Both see it among the recently lost workers, once, with what it held.
	lostWorkers, err := caps.Lost(ctx, 0)
	if err != nil || len(lostWorkers) != 1 || lostWorkers[0].WorkerID != "mortal" || len(lostWorkers[0].Jobs) != 1 ||
		lostWorkers[0].Jobs[0].JobID != id || lostWorkers[0].LastSeen.IsZero() {
		t.Errorf("recently lost workers: %+v, %v", lostWorkers, err)
	}
	// And nothing of the dead worker is left in Redis.
	if u, err := caps.Usage(ctx, "default", "mortal"); err != nil || u.Slots != 0 || u.SlotsUsed != 0 {
		t.Errorf("the dead worker's slots: %+v %v", u, err)
	}

	// The job, cancelled while its record says the dead worker runs it,
	// ends once, cancelled, when a worker gets its message again.
	cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
	defer ccancel()
	if _, err := f.Client.Cancel(cctx, id); err != nil {
		t.Fatal(err)
	}
	f.Worker(t, processExec(t), worker.Config{Slots: 1})
	if r := f.Await(t, id, 30*time.Second); r.Status != job.StatusCancelled {
		t.Errorf("the cancelled job of the dead worker: %s %+v", r.Status, r.Failure)
	}
	requireHistory(t, nc, job.DefaultTenant, "default", "", []string{id}, ear)
}

func TestAdmissionRefusesWhatNoWorkerCouldRun(t *testing.T) {
	rs := redistest.Start(t)
	caps := openCapacity(t, rs.URL())
	for _, mode := range []string{monitor.AdmitReject, monitor.AdmitQueue} {
		t.Run(mode, func(t *testing.T) {
			adm, err := monitor.NewAdmission(caps, mode, fleettest.Logger(t))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if err := adm.Start(ctx); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = adm.Stop(context.Background()) })
			f := fleettest.Start(t, func(c *dispatcher.Config) { c.Admission = adm })
			// The worker starts after the view was read, and the requests
			// come at once: admission reads the view again before it
			// refuses, so it judges by this worker, not by an empty pool.
			time.Sleep(200 * time.Millisecond)
			capacityWorker(t, f, caps, "w-"+mode, 2, ptr(2000), ptr(1<<30))

			big := &job.Request{ID: "big-" + mode, Command: []string{"true"}, Resources: &job.Resources{Memory: "4Gi"}}
			s, err := f.Client.Submit(ctx, big)
			if mode == monitor.AdmitReject {
				rej, ok := err.(*client.RejectedError)
				if !ok || !strings.Contains(rej.Reason, "needs 4Gi memory (the largest worker has 1Gi)") {
					t.Fatalf("oversized request: %+v, %v", s, err)
				}
			} else if err != nil || !strings.Contains(s.Warning, "needs 4Gi memory (the largest worker has 1Gi); queued anyway") {
				t.Fatalf("oversized request with admission=queue: %+v, %v", s, err)
			}
			ok := f.Submit(t, &job.Request{ID: "fits-" + mode, Command: []string{"true"}, Resources: &job.Resources{Memory: "512Mi"}})
			if r := f.Await(t, ok, 20*time.Second); r.Status != job.StatusSucceeded {
				t.Errorf("a request that fits: %s", r.Status)
			}
		})
	}
}

func TestRedisOutageLosesNoJobAndLeasesEndTrue(t *testing.T) {
	rs := redistest.Start(t)
	caps := openCapacity(t, rs.URL())
	f := fleettest.Start(t)
	w := capacityWorker(t, f, caps, "steady", 4, nil, nil)
	nc := f.NATS.Connect(t)
	ear := listen(t, nc, job.DefaultTenant, "default")
	var ids []string
	// 24 jobs of a second on 4 slots: six seconds of work, so that jobs
	// still run when Redis is back and its leases are compared with them
	// (with jobs of 0.3 s, all had ended before the breaker's probe found
	// Redis again on a loaded machine, and nothing was left to compare).
	for i := 0; i < 24; i++ {
		ids = append(ids, f.Submit(t, &job.Request{ID: fmt.Sprintf("through-%d", i), Command: []string{"sleep", "1"}}))
	}
	time.Sleep(400 * time.Millisecond)
	rs.Stop()
	time.Sleep(time.Second) // jobs go on without Redis
	rs.Start()              // empty
	ctx := context.Background()
	// Once a heartbeat has run, Redis holds exactly what runs.
	waitFor(t, "leases to match what runs", 5*time.Second, func() bool {
		leases, err := caps.Leases(ctx, "default", "steady")
		return err == nil && len(leases) == w.Running() && len(leases) > 0
	})
	for _, id := range ids {
		if r := f.Await(t, id, 30*time.Second); r.Status != job.StatusSucceeded {
			t.Errorf("%s: %s", id, r.Status)
		}
	}
	waitFor(t, "no lease left after the last job", 5*time.Second, func() bool {
		u, err := caps.Usage(ctx, "default", "steady")
		leases, _ := caps.Leases(ctx, "default", "steady")
		return err == nil && u.Slots == 4 && u.SlotsUsed == 0 && len(leases) == 0
	})
	requireHistory(t, nc, job.DefaultTenant, "default", "", ids, ear)
}

// capacityAPI starts Redis, a fleet and the dispatcher's HTTP API with its
// capacity routes.
func capacityAPI(t *testing.T) (*redistest.Server, *capacity.Store, *fleettest.Fleet, *httptest.Server) {
	t.Helper()
	rs := redistest.Start(t)
	caps := openCapacity(t, rs.URL())
	f := fleettest.Start(t)
	api := dispatcher.NewAPI(f.Dispatcher)
	api.ServeCapacity(caps)
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	return rs, caps, f, srv
}

func TestFleetctlCapacityFollowsTheJobs(t *testing.T) {
	_, caps, f, srv := capacityAPI(t)
	capacityWorker(t, f, caps, "counted", 4, ptr(4000), ptr(4<<30))

	usedSlots := func() int {
		cmd := exec.Command(fleettest.Binary(t, "fleetctl"), "capacity", "-o", "json", "--http-addr", srv.URL)
		cmd.Env = os.Environ()
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("fleetctl capacity: %v\n%s", err, out)
		}
		var pools []job.PoolCapacity
		if err := json.Unmarshal(out, &pools); err != nil || len(pools) != 1 {
			t.Fatalf("fleetctl capacity -o json: %v\n%s", err, out)
		}
		return pools[0].Slots.Used
	}
	if n := usedSlots(); n != 0 {
		t.Fatalf("%d slots used before any job", n)
	}
	var wg sync.WaitGroup
	for i := 0; i < 3; i++ {
		id := f.Submit(t, &job.Request{ID: fmt.Sprintf("counted-%d", i), Command: []string{"sleep", "2"}})
		wg.Add(1)
		go func() { defer wg.Done(); f.Await(t, id, 30*time.Second) }()
	}
	waitFor(t, "3 used slots in fleetctl capacity", 5*time.Second, func() bool { return usedSlots() == 3 })
	wg.Wait()
	waitFor(t, "0 used slots in fleetctl capacity", 5*time.Second, func() bool { return usedSlots() == 0 })
}

func TestCapacityRoutesAnswerFromTheHeartbeats(t *testing.T) {
	rs, caps, f, srv := capacityAPI(t)
	capacityWorker(t, f, caps, "listed", 3, ptr(2000), ptr(1<<30))

	get := func(path string, v any) int {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if err := json.Unmarshal(body, v); err != nil {
			t.Fatalf("GET %s: %v\n%s", path, err, body)
		}
		return resp.StatusCode
	}
	var hbs []*job.Heartbeat
	waitFor(t, "the worker in GET /v1/workers", 5*time.Second, func() bool {
		return get("/v1/workers", &hbs) == http.StatusOK && len(hbs) == 1 && hbs[0].WorkerID == "listed"
	})
	if code := get("/v1/workers?pool=elsewhere", &hbs); code != http.StatusOK || hbs == nil || len(hbs) != 0 {
		t.Errorf("GET /v1/workers?pool=elsewhere: %d %v, want 200 and an empty list", code, hbs)
	}
	var o monitor.Overview
	if code := get("/v1/capacity?pool=default", &o); code != http.StatusOK || len(o.Pools) != 1 || len(o.Workers) != 1 ||
		o.Pools[0].Slots.Total != 3 || o.Pools[0].Workers != 1 {
		t.Errorf("GET /v1/capacity?pool=default: %d %+v, want one pool of one worker and 3 slots", code, o)
	}
	if o.Pools[0].Paused {
		t.Errorf("pool default shows paused before anyone paused it")
	}

	// Pools paused through the API say so in the overview.
	post := func(path string) int {
		t.Helper()
		resp, err := http.Post(srv.URL+path, "application/json", strings.NewReader(`{"reason":"drain the hosts"}`))
		if err != nil {
			t.Fatalf("POST %s: %v", path, err)
		}
		defer resp.Body.Close()
		return resp.StatusCode
	}
	if code := post("/v1/pools/default/pause"); code != http.StatusOK {
		t.Fatalf("POST /v1/pools/default/pause: %d", code)
	}
	var ps job.PoolState
	if code := get("/v1/pools/default", &ps); code != http.StatusOK || !ps.Paused || ps.Reason != "drain the hosts" {
		t.Errorf("GET /v1/pools/default after a pause: %d %+v", code, ps)
	}
	if get("/v1/capacity?pool=default", &o); len(o.Pools) != 1 || !o.Pools[0].Paused {
		t.Errorf("GET /v1/capacity?pool=default of a paused pool: %+v", o.Pools)
	}
	if code := post("/v1/pools/default/resume"); code != http.StatusOK {
		t.Fatalf("POST /v1/pools/default/resume: %d", code)
	}
	o = monitor.Overview{}
	if get("/v1/capacity?pool=default", &o); len(o.Pools) != 1 || o.Pools[0].Paused {
		t.Errorf("GET /v1/capacity?pool=default of a resumed pool: %+v", o.Pools)
	}
	if code := post("/v1/pools/bad%20name/pause"); code != http.StatusBadRequest {
		t.Errorf("POST /v1/pools/bad name/pause: %d, want 400", code)
	}

	rs.Stop()
	var e map[string]string
	if code := get("/v1/capacity", &e); code != http.StatusServiceUnavailable || e["error"] == "" || strings.Contains(e["error"], "127.0.0.1") {
		t.Errorf("GET /v1/capacity with Redis down: %d %v, want 503 and an error that names no address", code, e)
	}
}

// TestKilledWorkersJobsRunAgainWithinTheTTL SIGKILLs a worker that runs
// jobs: the reaper gives them back to the pool as soon as the worker's
// heartbeat expires, and another worker starts them within the heartbeat
// TTL and a second of the kill, not after the ack wait.
func TestKilledWorkersJobsRunAgainWithinTheTTL(t *testing.T) {
	const interval = time.Second
	ttl := 3 * interval
	rs := redistest.Start(t)
	caps := openCapacity(t, rs.URL())
	f := fleettest.Start(t)
	reaper := monitor.NewReaper(caps, monitor.ReaperConfig{Interval: interval, Announce: f.Dispatcher.Announce,
		Requeue: f.Dispatcher.Requeue, Logger: fleettest.Logger(t)})
	if err := reaper.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reaper.Stop(context.Background()) })
	env := []string{"FLEET_NATS_URL=" + f.NATS.URL(), "FLEET_REDIS_URL=" + rs.URL(), "FLEET_DATA_DIR=" + t.TempDir()}
	args := func(id string) []string {
		return []string{"--id", id, "--slots", "4", "--heartbeat-interval", interval.String(), "--ack-wait", "30s", "--grace", "100ms"}
	}
	mortal := fleettest.StartProc(t, "worker", env, args("mortal")...)
	mortal.WaitOutput(t, "worker started", 20*time.Second)
	nc := f.NATS.Connect(t)
	ear := listen(t, nc, job.DefaultTenant, "default")
	var ids []string
	for i := range 4 {
		ids = append(ids, f.Submit(t, &job.Request{ID: fmt.Sprintf("held-%d", i), Command: []string{"sleep", "3"}}))
	}
	ctx := context.Background()
	waitFor(t, "the mortal worker to hold the jobs", 10*time.Second, func() bool {
		u, err := caps.Usage(ctx, "default", "mortal")
		return err == nil && u.SlotsUsed == len(ids)
	})
	fleettest.StartProc(t, "worker", env, args("survivor")...).WaitOutput(t, "worker started", 20*time.Second)
	mortal.Kill()
	killed := time.Now()

	for _, id := range ids {
		r := f.Await(t, id, 30*time.Second)
		if r.Status != job.StatusSucceeded || r.WorkerID != "survivor" || r.Attempts != 2 || len(r.History) != 1 ||
			r.History[0].Failure == nil || r.History[0].Failure.Code != job.CodeWorkerLost {
			t.Fatalf("%s: %s on %s after %d attempts, history %+v", id, r.Status, r.WorkerID, r.Attempts, r.History)
		}
		again := r.StartedAt.Sub(killed)
		t.Logf("%s: running again %s after the kill (heartbeat TTL %s)", id, again.Round(10*time.Millisecond), ttl)
		if again > ttl+time.Second {
			t.Errorf("%s ran again %s after its worker was killed, more than the heartbeat TTL %s and a second", id, again, ttl)
		}
	}
	requireHistory(t, nc, job.DefaultTenant, "default", "", ids, ear)
}
