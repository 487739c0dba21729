package capacity

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/embedded"
	"github.com/fleet-dev/fleet/internal/redistest"
	"github.com/fleet-dev/fleet/internal/testport"
	"github.com/fleet-dev/fleet/job"
)

// stores runs a test against a real redis-server, a real Redis Cluster of
// three masters, and the embedded Redis-protocol store: the same Lua must
// behave the same.
func stores(t *testing.T, run func(t *testing.T, url string)) {
	t.Run("redis-server", func(t *testing.T) { run(t, redistest.Start(t).URL()) })
	t.Run("cluster", func(t *testing.T) { run(t, redistest.StartCluster(t, 3).URL()) })
	t.Run("embedded", func(t *testing.T) {
		addr := freeAddr(t)
		r, err := embedded.StartRedis("redis://" + addr + "/0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Close)
		run(t, "redis://"+addr+"/0")
	})
}

func open(t *testing.T, url string) *Store {
	t.Helper()
	s, err := Open(url, Config{Prefix: "fleettest"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func ptr(v int64) *int64 { return &v }

const hammerWorker, hammerPool = "hammered", "hp"

var hammerTotals = Totals{Slots: 5, CPUMilli: ptr(3000), MemoryBytes: ptr(1 << 30), GPUs: 1}

// hammer reserves and releases leases on one worker's hash as fast as it
// can, and counts what it holds at once in held.
func hammer(ctx context.Context, s *Store, name string, rounds int, held *atomic.Int64, refused *atomic.Int64) error {
	for i := 0; i < rounds && ctx.Err() == nil; i++ {
		l := Lease{JobID: fmt.Sprintf("%s-%d", name, i), Attempt: 1, CPUMilli: 1000, MemoryBytes: 256 << 20, GPUs: rand.IntN(2)}
		out, err := s.ApplyLeases(ctx, hammerPool, hammerWorker, time.Minute, []LeaseOp{{Lease: l}})
		if err != nil {
			return err
		}
		if out[0] != "ok" {
			refused.Add(1)
			continue
		}
		held.Add(1)
		time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
		held.Add(-1)
		if _, err := s.ApplyLeases(ctx, hammerPool, hammerWorker, time.Minute, []LeaseOp{{Release: true, Lease: l}}); err != nil {
			return err
		}
	}
	return nil
}

// TestLeaseHammerProcess is not a test on its own: the test below starts
// the test binary again to run it, as a second and third process.
func TestLeaseHammerProcess(t *testing.T) {
	url := os.Getenv("FLEET_HAMMER_URL")
	if url == "" {
		return
	}
	var held, refused atomic.Int64
	if err := hammer(context.Background(), open(t, url), os.Getenv("FLEET_HAMMER_NAME"), 300, &held, &refused); err != nil {
		t.Fatal(err)
	}
}

func TestConcurrentReservationsNeverExceedTheWorker(t *testing.T) {
	stores(t, func(t *testing.T, url string) {
		s := open(t, url)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := setTotals(ctx, s, hammerPool, hammerWorker, hammerTotals); err != nil {
			t.Fatal(err)
		}

		// Two more processes hammer the same worker.
		var procs []*exec.Cmd
		for i := 0; i < 2; i++ {
			cmd := exec.Command(os.Args[0], "-test.run=^TestLeaseHammerProcess$", "-test.count=1")
			cmd.Env = append(os.Environ(), "FLEET_HAMMER_URL="+url, fmt.Sprintf("FLEET_HAMMER_NAME=proc%d", i))
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			procs = append(procs, cmd)
		}

		var held, refused, maxSeen atomic.Int64
		stop := make(chan struct{})
		var checks sync.WaitGroup
		checks.Add(1)
		go func() { // what Redis counts must never exceed the worker
			defer checks.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				u, err := s.Usage(ctx, hammerPool, hammerWorker)
				if err != nil {
					t.Error(err)
					return
				}
				if u.SlotsUsed > hammerTotals.Slots || u.CPUUsed > *hammerTotals.CPUMilli || u.MemUsed > *hammerTotals.MemoryBytes || u.GPUsUsed > hammerTotals.GPUs {
					t.Errorf("over the worker's totals: %+v", u)
				}
				if h := held.Load(); h > maxSeen.Load() {
					maxSeen.Store(h)
				}
			}
		}()
		var wg sync.WaitGroup
		for g := 0; g < 24; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := hammer(ctx, s, fmt.Sprintf("g%d", g), 150, &held, &refused); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		for _, p := range procs {
			if err := p.Wait(); err != nil {
				t.Errorf("hammer process: %v", err)
			}
		}
		close(stop)
		checks.Wait()

		if maxSeen.Load() > int64(hammerTotals.Slots) {
			t.Errorf("this process alone held %d leases at once; the worker has %d slots", maxSeen.Load(), hammerTotals.Slots)
		}
		if refused.Load() == 0 {
			t.Error("no reservation was ever refused: the limits were not exercised")
		}
		u, err := s.Usage(ctx, hammerPool, hammerWorker)
		if err != nil {
			t.Fatal(err)
		}
		leases, _ := s.Leases(ctx, hammerPool, hammerWorker)
		if u.SlotsUsed != 0 || u.CPUUsed != 0 || u.MemUsed != 0 || u.GPUsUsed != 0 || len(leases) != 0 {
			t.Errorf("after every release: %+v, leases %v", u, leases)
		}
	})
}

func TestLeaseScriptAnswers(t *testing.T) {
	stores(t, func(t *testing.T, url string) {
		s := open(t, url)
		ctx := context.Background()
		l := func(id string, cpu, mem int64, gpu int) Lease {
			return Lease{JobID: id, Attempt: 1, CPUMilli: cpu, MemoryBytes: mem, GPUs: gpu}
		}
		// No totals yet: the worker has not written a heartbeat.
		out, err := s.ApplyLeases(ctx, "p", "w", time.Minute, []LeaseOp{{Lease: l("a", 1, 1, 0)}})
		if err != nil || out[0] != "unknown" {
			t.Fatalf("before totals: %v %v", out, err)
		}
		if err := setTotals(ctx, s, "p", "w", Totals{Slots: 3, CPUMilli: ptr(2000), GPUs: 1}); err != nil {
			t.Fatal(err)
		}
		out, err = s.ApplyLeases(ctx, "p", "w", time.Minute, []LeaseOp{
			{Lease: l("a", 1500, 1<<40, 0)}, // memory unknown: not limited
			{Lease: l("a", 1500, 1, 0)},     // the same lease again
			{Lease: l("b", 600, 1, 0)},      // 2100m > 2000m
			{Lease: l("c", 100, 1, 2)},      // 2 GPUs > 1
			{Release: true, Lease: l("a", 0, 0, 0)},
			{Lease: l("b", 600, 1, 0)}, // fits once a is gone
			{Lease: l("d", 100, 1, 1)},
			{Lease: l("e", 100, 1, 0)},
			{Lease: l("f", 100, 1, 0)}, // a fourth lease: 3 slots
		})
		want := []string{"ok", "dup", "no:cpu", "no:gpu", "ok", "ok", "ok", "no:slots"}
		if err != nil || fmt.Sprint(out) != fmt.Sprint(want) {
			t.Fatalf("got %v (%v), want %v", out, err, want)
		}
		u, _ := s.Usage(ctx, "p", "w")
		if u.SlotsUsed != 3 || u.CPUUsed != 800 || u.GPUsUsed != 1 {
			t.Errorf("usage %+v", u)
		}
		// The hash expires with the worker's heartbeat.
		ttl, err := s.rdb.PTTL(ctx, s.slotsKey("p", "w")).Result()
		if err != nil || ttl <= 0 || ttl > time.Minute {
			t.Errorf("TTL of the leases: %v %v", ttl, err)
		}
	})
}

// A batch of 6,000 leases taken, then the same 6,000 released, each in
// one call: what a worker's ledger sends after Redis was slow for a
// moment at thousands of jobs a second. Before the script wrote its
// changes in chunks, the first failed: Redis's Lua cannot unpack so many
// values into one call.
//
// The embedded store's Lua has no such limit, and under -race runs a call
// of 6,000 in about the client's I/O timeout (2 s): on a loaded machine
// the call timed out, and its second try found the leases the first had
// taken ("dup"). It gets 1,500, three chunks of the script's writes. A
// lease answered "dup" is held, as the ledger reads it; the usage says
// each is counted once.
func TestALargeBatchOfLeases(t *testing.T) {
	stores(t, func(t *testing.T, url string) {
		s := open(t, url)
		ctx := context.Background()
		n := 6000
		if strings.HasSuffix(t.Name(), "/embedded") {
			n = 1500
		}
		if err := setTotals(ctx, s, "p", "w", Totals{Slots: n}); err != nil {
			t.Fatal(err)
		}
		var take, give []LeaseOp
		for i := range n {
			l := Lease{JobID: fmt.Sprint("j", i), Attempt: 1, CPUMilli: 1, MemoryBytes: 1}
			take = append(take, LeaseOp{Lease: l})
			give = append(give, LeaseOp{Release: true, Lease: l})
		}
		for _, ops := range [][]LeaseOp{take, give} {
			out, err := s.ApplyLeases(ctx, "p", "w", time.Minute, ops)
			if err != nil {
				t.Fatal(err)
			}
			held := func(a string) bool { return a == LeaseOK || a == LeaseDup }
			if !ops[0].Release && (len(out) != n || !held(out[0]) || !held(out[n-1])) {
				t.Fatalf("%d answers, first %v", len(out), out[:min(3, len(out))])
			}
			u, err := s.Usage(ctx, "p", "w")
			if want := int64(n); ops[0].Release {
				want = 0
				if err != nil || u.SlotsUsed != 0 || u.CPUUsed != 0 {
					t.Fatalf("after the releases: %+v %v", u, err)
				}
			} else if err != nil || int64(u.SlotsUsed) != want || u.CPUUsed != want {
				t.Fatalf("after the leases: %+v %v", u, err)
			}
		}
	})
}

// setTotals writes a worker's totals, with no lease, as its heartbeat's
// script does.
func setTotals(ctx context.Context, s *Store, pool, worker string, t Totals) error {
	keys := []string{s.slotsKey(pool, worker), s.tenantsKey(pool, worker), s.poolKey(pool), s.usageKey(pool)}
	b := Beat{Heartbeat: &job.Heartbeat{WorkerID: worker, Pool: pool}, LeaseTTL: time.Minute, Totals: t}
	return syncScript.Run(ctx, s.rdb, keys, syncArgs(b)...).Err()
}

// freeAddr returns a loopback address no one listens on, for a server the
// test starts (testport: not one the kernel hands out to others meanwhile).
func freeAddr(t *testing.T) string { return fmt.Sprintf("127.0.0.1:%d", testport.Free(t)) }
