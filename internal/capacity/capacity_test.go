package capacity

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/embedded"
	"github.com/fleet-dev/fleet/internal/redistest"
	"github.com/fleet-dev/fleet/internal/worker"
	"github.com/fleet-dev/fleet/job"
)

// stores runs a test against a real redis-server and against the
// embedded Redis-protocol store: the same Lua must behave the same.
func stores(t *testing.T, run func(t *testing.T, url string)) {
	t.Run("redis-server", func(t *testing.T) { run(t, redistest.Start(t).URL()) })
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
	s, err := Open(url, "fleettest")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func ptr(v int64) *int64 { return &v }

const hammerWorker = "hammered"

var hammerTotals = totals{cpu: ptr(3000), mem: ptr(1 << 30), gpu: 1}

const hammerSlots = 5

// hammer reserves and releases leases on one worker's hash as fast as it
// can, and counts what it holds at once in held.
func hammer(ctx context.Context, s *Store, name string, rounds int, held *atomic.Int64, refused *atomic.Int64) error {
	for i := 0; i < rounds && ctx.Err() == nil; i++ {
		l := Lease{JobID: fmt.Sprintf("%s-%d", name, i), Attempt: 1, CPUMilli: 1000, MemoryBytes: 256 << 20, GPUs: rand.IntN(2)}
		out, err := s.apply(ctx, hammerWorker, time.Minute, []op{{lease: l}})
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
		if _, err := s.apply(ctx, hammerWorker, time.Minute, []op{{release: true, lease: l}}); err != nil {
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
		if err := syncScript.Run(ctx, s.rdb, []string{s.slotsKey(hammerWorker)},
			syncArgs(time.Minute, hammerSlots, hammerTotals, nil)...).Err(); err != nil {
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
				u, err := s.Usage(ctx, hammerWorker)
				if err != nil {
					t.Error(err)
					return
				}
				if u.SlotsUsed > hammerSlots || u.CPUUsed > *hammerTotals.cpu || u.MemUsed > *hammerTotals.mem || u.GPUsUsed > hammerTotals.gpu {
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

		if maxSeen.Load() > hammerSlots {
			t.Errorf("this process alone held %d leases at once; the worker has %d slots", maxSeen.Load(), hammerSlots)
		}
		if refused.Load() == 0 {
			t.Error("no reservation was ever refused: the limits were not exercised")
		}
		u, err := s.Usage(ctx, hammerWorker)
		if err != nil {
			t.Fatal(err)
		}
		leases, _ := s.Leases(ctx, hammerWorker)
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
		out, err := s.apply(ctx, "w", time.Minute, []op{{lease: l("a", 1, 1, 0)}})
		if err != nil || out[0] != "unknown" {
			t.Fatalf("before totals: %v %v", out, err)
		}
		if err := syncScript.Run(ctx, s.rdb, []string{s.slotsKey("w")},
			syncArgs(time.Minute, 3, totals{cpu: ptr(2000), mem: nil, gpu: 1}, nil)...).Err(); err != nil {
			t.Fatal(err)
		}
		out, err = s.apply(ctx, "w", time.Minute, []op{
			{lease: l("a", 1500, 1<<40, 0)}, // memory unknown: not limited
			{lease: l("a", 1500, 1, 0)},     // the same lease again
			{lease: l("b", 600, 1, 0)},      // 2100m > 2000m
			{lease: l("c", 100, 1, 2)},      // 2 GPUs > 1
			{release: true, lease: l("a", 0, 0, 0)},
			{lease: l("b", 600, 1, 0)}, // fits once a is gone
			{lease: l("d", 100, 1, 1)},
			{lease: l("e", 100, 1, 0)},
			{lease: l("f", 100, 1, 0)}, // a fourth lease: 3 slots
		})
		want := []string{"ok", "dup", "no:cpu", "no:gpu", "ok", "ok", "ok", "no:slots"}
		if err != nil || fmt.Sprint(out) != fmt.Sprint(want) {
			t.Fatalf("got %v (%v), want %v", out, err, want)
		}
		u, _ := s.Usage(ctx, "w")
		if u.SlotsUsed != 3 || u.CPUUsed != 800 || u.GPUsUsed != 1 {
			t.Errorf("usage %+v", u)
		}
		// The hash expires with the worker's heartbeat.
		ttl, err := s.rdb.PTTL(ctx, s.slotsKey("w")).Result()
		if err != nil || ttl <= 0 || ttl > time.Minute {
			t.Errorf("TTL of the leases: %v %v", ttl, err)
		}
	})
}

// A Reporter keeps running on local accounting while Redis is away, and
// its next heartbeat puts Redis back in line with what runs.
func TestReporterReconcilesWhenRedisReturns(t *testing.T) {
	srv := redistest.Start(t)
	s := open(t, srv.URL())
	ctx := context.Background()
	r := NewReporter(s, ReporterConfig{WorkerID: "w1", Pool: "p", Backend: "process", Slots: 4,
		CPUMilli: ptr(4000), Interval: 200 * time.Millisecond})
	r.Start(ctx)
	defer r.Stop(ctx)
	res := func(id string) worker.Reservation {
		return worker.Reservation{JobID: id, Attempt: 1, CPUMilli: 1000, MemoryBytes: 1 << 20, StartedAt: time.Now()}
	}
	for _, id := range []string{"a", "b", "c"} {
		if err := r.Reserve(ctx, res(id)); err != nil {
			t.Fatal(err)
		}
	}
	waitLeases(t, s, "w1", "[a b c]")

	srv.Stop()
	// While Redis is away: local accounting still refuses a fifth lease.
	if err := r.Release(ctx, res("a")); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"d", "e"} {
		if err := r.Reserve(ctx, res(id)); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Reserve(ctx, res("f")); err == nil {
		t.Fatal("a fifth lease on four slots was granted")
	}
	srv.Start() // empty: the restart lost everything
	waitLeases(t, s, "w1", "[b c d e]")
	hbs, err := s.Workers(ctx, "p")
	if err != nil || len(hbs) != 1 || hbs[0].Slots.Used != 4 || len(hbs[0].Running) != 4 {
		t.Fatalf("heartbeat after the outage: %+v %v", hbs, err)
	}
}

func waitLeases(t *testing.T, s *Store, worker, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var got string
	for time.Now().Before(deadline) {
		leases, err := s.Leases(context.Background(), worker)
		if err == nil {
			var ids []string
			for _, l := range leases {
				ids = append(ids, l.JobID)
			}
			if got = fmt.Sprint(ids); got == want {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("leases of %s in Redis: %s, want %s", worker, got, want)
}

func TestAdmissionJudge(t *testing.T) {
	hb := func(pool, backend string, cpu, mem *int64, gpu int) *job.Heartbeat {
		return &job.Heartbeat{WorkerID: pool + backend, Pool: pool, Backend: backend, Health: job.HealthHealthy,
			CPUMilli: job.Amount{Total: cpu}, MemoryBytes: job.Amount{Total: mem}, GPUs: job.GPUs{Total: gpu}}
	}
	pools := view([]*job.Heartbeat{
		hb("small", "docker", ptr(2000), ptr(4<<30), 0),
		hb("small", "docker", ptr(4000), ptr(2<<30), 1),
		hb("procs", "process", nil, nil, 0),
	})
	req := func(pool, cpu, mem string, gpu int, image string) *job.Request {
		r := &job.Request{Pool: pool, Image: image, Command: []string{"x"}, Resources: &job.Resources{CPU: cpu, Memory: mem, GPU: gpu}}
		r.Normalize()
		return r
	}
	for _, tc := range []struct {
		r    *job.Request
		want string
	}{
		{req("small", "4", "4Gi", 1, "img"), ""}, // each total fits some worker
		{req("small", "5", "1Gi", 0, "img"), "needs 5 CPU (the largest worker has 4)"},
		{req("small", "1", "8Gi", 2, "img"), "needs 8Gi memory (the largest worker has 4Gi) and 2 GPUs"},
		{req("small", "1", "1Gi", 0, ""), "needs an image"},
		{req("procs", "64", "1Ti", 0, ""), ""}, // unknown totals: anything may fit
		{req("gone", "1", "1Gi", 0, ""), `pool "gone" has no live worker`},
	} {
		got := judge(tc.r, pools[tc.r.Pool])
		if (tc.want == "") != (got == "") || tc.want != "" && !contains(got, tc.want) {
			t.Errorf("judge(%s %s %s gpu %d) = %q, want %q", tc.r.Pool, tc.r.Resources.CPU, tc.r.Resources.Memory, tc.r.Resources.GPU, got, tc.want)
		}
	}
}

func contains(s, sub string) bool {
	return len(sub) == 0 || (len(s) >= len(sub) && (s[:len(sub)] == sub || contains(s[1:], sub)))
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
