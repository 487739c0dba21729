package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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

// haInterval is the heartbeat interval of the workers below; their leases
// live five intervals (ledger.Ledger).
const haInterval = 250 * time.Millisecond

const haLeaseTTL = 5 * haInterval

// haWorker starts an in-process worker of pool, with a ledger on caps and
// 1Gi of memory to hand out.
func haWorker(t *testing.T, f *fleettest.Fleet, caps *capacity.Store, id, pool string, slots int) *worker.Worker {
	t.Helper()
	var w atomic.Pointer[worker.Worker]
	r := ledger.New(caps, ledger.Config{WorkerID: id, Pool: pool, Backend: "process", Slots: slots,
		CPUMilli: ptr(int64(slots) * 1000), MemoryBytes: ptr(1 << 30), Interval: haInterval,
		Draining: func() bool { p := w.Load(); return p != nil && p.Draining() }, Logger: fleettest.Logger(t)})
	r.Start(context.Background())
	t.Cleanup(func() { r.Stop(context.Background()) })
	w.Store(f.Worker(t, processExec(t), worker.Config{ID: id, Pool: pool, Slots: slots, Capacity: r}))
	return w.Load()
}

// haFleet starts a fleet whose dispatcher admits requests (mode reject)
// by the capacity in caps.
func haFleet(t *testing.T, caps *capacity.Store) *fleettest.Fleet {
	t.Helper()
	adm, err := monitor.NewAdmission(caps, monitor.AdmitReject, fleettest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := adm.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = adm.Stop(context.Background()) })
	return fleettest.Start(t, func(c *dispatcher.Config) { c.Admission = adm })
}

// leasesMatch reports whether Redis holds, for each worker, exactly the
// leases of what it runs, and counts them in its hash.
func leasesMatch(caps *capacity.Store, workers map[string]*worker.Worker) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for id, w := range workers {
		leases, err := caps.Leases(ctx, "default", id)
		if err != nil {
			return false
		}
		u, err := caps.Usage(ctx, "default", id)
		if err != nil || u.SlotsUsed != len(leases) || len(leases) != w.Running() {
			return false
		}
	}
	return true
}

// checkAdmission submits a request that fits the pool (it must run and
// succeed) and one that no worker could run (it must be rejected).
func checkAdmission(t *testing.T, f *fleettest.Fleet, pool, tag string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := f.Client.Submit(ctx, &job.Request{ID: "huge-" + tag, Pool: pool, Command: []string{"true"},
		Resources: &job.Resources{Memory: "64Gi"}})
	rej, ok := err.(*client.RejectedError)
	if !ok || !strings.Contains(rej.Reason, "needs 64Gi memory (the largest worker has 1Gi)") {
		t.Fatalf("a request no worker could run (%s): %v", tag, err)
	}
	id := f.Submit(t, &job.Request{ID: "fits-" + tag, Pool: pool, Command: []string{"true"}, Resources: &job.Resources{Memory: "256Mi"}})
	if r := f.Await(t, id, 20*time.Second); r.Status != job.StatusSucceeded {
		t.Fatalf("a request that fits (%s): %s", tag, r.Status)
	}
}

// The master of a Sentinel setup is SIGKILLed while jobs run: they go on
// and all succeed, the workers' leases in the new master match what runs
// within one lease TTL of the failover, nothing is leaked once the jobs
// are done, and admission reads the new master.
func TestRedisSentinelFailoverLosesNoJob(t *testing.T) {
	start := time.Now()
	st := redistest.StartSentinel(t)
	t.Logf("Sentinel setup ready in %s", time.Since(start).Round(time.Millisecond))
	caps := openCapacity(t, st.URL())
	f := haFleet(t, caps)
	nc := f.NATS.Connect(t)
	ear, late := listen(t, nc, job.DefaultTenant, "default"), listen(t, nc, job.DefaultTenant, "late")
	workers := map[string]*worker.Worker{}
	for _, id := range []string{"sen-1", "sen-2"} {
		workers[id] = haWorker(t, f, caps, id, "default", 3)
	}
	waitFor(t, "both workers in Redis", 5*time.Second, func() bool {
		hbs, err := caps.Workers(context.Background(), "default")
		return err == nil && len(hbs) == 2
	})
	checkAdmission(t, f, "default", "before")

	var ids []string
	// 60 jobs of half a second on 6 slots: 5 s of work, past the failover
	// (about 2 s here).
	for i := 0; i < 60; i++ {
		ids = append(ids, f.Submit(t, &job.Request{ID: fmt.Sprintf("through-failover-%d", i), Command: []string{"sleep", "0.5"}}))
	}
	waitFor(t, "leases in the first master", 5*time.Second, func() bool {
		u, err := caps.Usage(context.Background(), "default", "sen-1")
		return err == nil && u.SlotsUsed > 0
	})
	old := st.KillMaster()
	killed := time.Now()
	st.WaitFailover(old, 30*time.Second)
	failedOver := time.Now()
	t.Logf("failover %s after the kill", failedOver.Sub(killed).Round(time.Millisecond))
	if r := workers["sen-1"].Running() + workers["sen-2"].Running(); r == 0 {
		t.Fatal("no job ran across the failover: the test proves nothing")
	}

	// Within one lease TTL of the failover, the new master holds what runs.
	waitFor(t, "the leases in the new master to match what runs", haLeaseTTL, func() bool {
		return leasesMatch(caps, workers)
	})
	t.Logf("leases reconciled %s after the failover", time.Since(failedOver).Round(time.Millisecond))

	for _, id := range ids {
		if r := f.Await(t, id, 30*time.Second); r.Status != job.StatusSucceeded {
			t.Errorf("%s: %s", id, r.Status)
		}
	}
	done := time.Now()
	waitFor(t, "no lease left after the last job", haLeaseTTL, func() bool {
		for id := range workers {
			u, err := caps.Usage(context.Background(), "default", id)
			leases, lerr := caps.Leases(context.Background(), "default", id)
			if err != nil || lerr != nil || u.Slots != 3 || u.SlotsUsed != 0 || len(leases) != 0 {
				return false
			}
		}
		return true
	})
	t.Logf("no lease left %s after the last job", time.Since(done).Round(time.Millisecond))

	// Admission reads the new master: a pool whose only worker started
	// after the failover is admitted, and what no worker could run is not.
	haWorker(t, f, caps, "sen-late", "late", 1)
	checkAdmission(t, f, "late", "after")
	requireHistory(t, nc, job.DefaultTenant, "default", "", append(ids, "fits-before"), ear)
	requireHistory(t, nc, job.DefaultTenant, "late", "", []string{"fits-after"}, late)
}

// A fleet on a Redis Cluster of three masters: leases and heartbeats of
// workers whose keys lie on different masters, the reaper, admission.
func TestRedisClusterCarriesCapacity(t *testing.T) {
	start := time.Now()
	cl := redistest.StartCluster(t, 3)
	t.Logf("Cluster ready in %s", time.Since(start).Round(time.Millisecond))
	caps := openCapacity(t, cl.URL())
	f := haFleet(t, caps)
	ctx := context.Background()
	nc := f.NATS.Connect(t)
	ear, doomed := listen(t, nc, job.DefaultTenant, "default"), listen(t, nc, job.DefaultTenant, "doomed")

	// The workers' keys lie on at least two masters, so a command over
	// several workers' keys would fail here.
	raw := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{cl.Nodes[0].Addr()}})
	defer raw.Close()
	workers := map[string]*worker.Worker{}
	masters := map[string]bool{}
	for _, id := range []string{"cl-1", "cl-2", "cl-3", "cl-4"} {
		workers[id] = haWorker(t, f, caps, id, "default", 2)
		m, err := raw.MasterForKey(ctx, "fleet:{w:"+id+"}:hb")
		if err != nil {
			t.Fatal(err)
		}
		masters[m.String()] = true
	}
	if len(masters) < 2 {
		t.Fatalf("the workers' keys lie on %d master(s)", len(masters))
	}
	waitFor(t, "every worker's heartbeat", 5*time.Second, func() bool {
		hbs, err := caps.Workers(ctx, "default")
		return err == nil && len(hbs) == len(workers)
	})
	checkAdmission(t, f, "default", "cluster")

	var ids []string
	for i := 0; i < 24; i++ {
		ids = append(ids, f.Submit(t, &job.Request{ID: fmt.Sprintf("clustered-%d", i), Command: []string{"sleep", "0.3"}}))
	}
	waitFor(t, "leases on the cluster", 5*time.Second, func() bool {
		total := 0
		for id := range workers {
			u, err := caps.Usage(ctx, "default", id)
			if err != nil {
				return false
			}
			total += u.SlotsUsed
		}
		return total >= 4
	})
	for _, id := range ids {
		if r := f.Await(t, id, 30*time.Second); r.Status != job.StatusSucceeded {
			t.Errorf("%s: %s", id, r.Status)
		}
	}
	waitFor(t, "no lease left after the last job", haLeaseTTL, func() bool { return leasesMatch(caps, workers) })
	for id := range workers {
		if u, _ := caps.Usage(ctx, "default", id); u.SlotsUsed != 0 {
			t.Errorf("%s: %d slots used after the last job", id, u.SlotsUsed)
		}
	}

	// A worker process on the cluster is SIGKILLed while it holds a job:
	// its ledger stops without Stop, and the reaper buries it.
	env := []string{"FLEET_NATS_URL=" + f.NATS.URL(), "FLEET_REDIS_URL=" + cl.URL(), "FLEET_DATA_DIR=" + t.TempDir()}
	w := fleettest.StartProc(t, "worker", env, "--id", "cl-doomed", "--pool", "doomed", "--slots", "2",
		"--heartbeat-interval", "300ms")
	w.WaitOutput(t, "worker started", 20*time.Second)
	held := f.Submit(t, &job.Request{ID: "held-on-cluster", Pool: "doomed", Command: []string{"sleep", "30"}})
	waitFor(t, "the doomed worker's lease", 10*time.Second, func() bool {
		l, err := caps.Leases(ctx, "doomed", "cl-doomed")
		return err == nil && len(l) == 1 && l[0].JobID == held
	})
	w.Kill()
	waitFor(t, "the doomed worker to leave the pool", 3*time.Second, func() bool {
		hbs, err := caps.Workers(ctx, "doomed")
		return err == nil && len(hbs) == 0
	})
	dead, err := monitor.NewReaper(caps, monitor.ReaperConfig{Interval: 300 * time.Millisecond, Announce: f.Dispatcher.Announce, Logger: fleettest.Logger(t)}).Reap(ctx)
	if err != nil || fmt.Sprint(dead) != "[cl-doomed]" {
		t.Fatalf("reaped %v, %v", dead, err)
	}
	lost := false
	for _, e := range eventsUntil(t, f, held, "worker_lost") {
		if e.Phase == "worker_lost" && e.WorkerID == "cl-doomed" && e.Failure != nil && e.Failure.Code == job.CodeWorkerLost {
			lost = true
		}
	}
	if !lost {
		t.Error("no worker_lost event for the job the doomed worker held")
	}
	if u, err := caps.Usage(ctx, "doomed", "cl-doomed"); err != nil || u.Slots != 0 || len(mustLeases(t, caps, "doomed", "cl-doomed")) != 0 {
		t.Errorf("the reaped worker's slots: %+v %v", u, err)
	}
	requireHistory(t, nc, job.DefaultTenant, "default", "", append(ids, "fits-cluster"), ear)

	// The job the doomed worker held, cancelled while its record says
	// that worker runs it, ends once, cancelled, when a worker of its pool
	// gets its message again.
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := f.Client.Cancel(cctx, held); err != nil {
		t.Fatal(err)
	}
	f.Worker(t, processExec(t), worker.Config{Pool: "doomed", Slots: 1})
	if r := f.Await(t, held, 30*time.Second); r.Status != job.StatusCancelled {
		t.Errorf("the cancelled job of the doomed worker: %s %+v", r.Status, r.Failure)
	}
	requireHistory(t, nc, job.DefaultTenant, "doomed", "", []string{held}, doomed)
}

// eventsUntil reads a job's events until one of phase comes (or 10 s pass).
func eventsUntil(t *testing.T, f *fleettest.Fleet, id, phase string) []*job.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []*job.Event
	for e, err := range f.Client.Events(ctx, id) {
		if err != nil {
			t.Fatalf("events of %s: %v", id, err)
		}
		out = append(out, e)
		if e.Phase == phase {
			break
		}
	}
	return out
}

func mustLeases(t *testing.T, caps *capacity.Store, pool, id string) []capacity.Lease {
	t.Helper()
	l, err := caps.Leases(context.Background(), pool, id)
	if err != nil {
		t.Fatal(err)
	}
	return l
}
