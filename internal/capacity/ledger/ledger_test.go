package ledger

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/capacity"
	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/redistest"
	"github.com/fleet-dev/fleet/job"
)

func open(t *testing.T, url string) *capacity.Store {
	t.Helper()
	s, err := capacity.Open(url, capacity.Config{Prefix: "fleettest"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func ptr(v int64) *int64 { return &v }

// A Ledger keeps running on local accounting while Redis is away, and
// its next heartbeat puts Redis back in line with what runs.
func TestLedgerReconcilesWhenRedisReturns(t *testing.T) {
	srv := redistest.Start(t)
	s := open(t, srv.URL())
	ctx := context.Background()
	r := New(s, Config{WorkerID: "w1", Pool: "p", Backend: "process", Slots: 4,
		CPUMilli: ptr(4000), Interval: 200 * time.Millisecond})
	r.Start(ctx)
	defer r.Stop(ctx)
	res := func(id string) capacity.Lease {
		return capacity.Lease{JobID: id, Attempt: 1, CPUMilli: 1000, MemoryBytes: 1 << 20, StartedAt: time.Now()}
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

func waitLeases(t *testing.T, s *capacity.Store, worker, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var got string
	for time.Now().Before(deadline) {
		leases, err := s.Leases(context.Background(), "p", worker)
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

// platform is a backend whose usage and inventory the test sets.
type platform struct {
	usage map[executor.AttemptID]*job.Usage
	inv   *job.Inventory
}

func (p *platform) Capacity(context.Context) (*executor.Capacity, error) {
	return &executor.Capacity{Health: job.HealthHealthy}, nil
}
func (p *platform) Usage(context.Context) map[executor.AttemptID]*job.Usage { return p.usage }
func (p *platform) Inventory(context.Context) (*job.Inventory, error)       { return p.inv, nil }

// TestHeartbeatCarriesUsageAndInventory: each running attempt's usage, as
// the backend reads it, and the backend's inventory reach the heartbeat in
// Redis; and a worker learns there which images its peers have.
func TestHeartbeatCarriesUsageAndInventory(t *testing.T) {
	srv := redistest.Start(t)
	s := open(t, srv.URL())
	ctx := context.Background()
	cpu, mem := 97.5, int64(12<<20)
	p := &platform{
		usage: map[executor.AttemptID]*job.Usage{{JobID: "spin", Attempt: 2}: {ObservedAt: time.Now(), CPUPercent: &cpu, MemoryBytes: &mem}},
		inv:   &job.Inventory{Images: []string{"registry.example/app:1"}, GPUs: []job.GPUModel{{Model: "H100", Count: 2}}},
	}
	r := New(s, Config{WorkerID: "w1", Pool: "p", Backend: "docker", Slots: 4, Platform: p, Interval: 200 * time.Millisecond})
	r.Start(ctx)
	defer r.Stop(ctx)
	other := New(s, Config{WorkerID: "w2", Pool: "p", Backend: "docker", Slots: 4, Interval: 200 * time.Millisecond})
	other.Start(ctx)
	defer other.Stop(ctx)
	for _, id := range []string{"spin", "idle"} {
		if err := r.Reserve(ctx, capacity.Lease{JobID: id, Attempt: 2, CPUMilli: 1000, StartedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		hb, err := s.LastHeartbeat(ctx, "p", "w1")
		if err == nil && hb != nil && len(hb.Running) == 2 && hb.Inventory != nil {
			for _, ra := range hb.Running {
				switch {
				case ra.JobID == "spin" && (ra.Usage == nil || *ra.Usage.CPUPercent != cpu || *ra.Usage.MemoryBytes != mem):
					t.Errorf("usage of the spinner: %+v", ra.Usage)
				case ra.JobID == "idle" && ra.Usage != nil:
					t.Errorf("usage of an attempt the backend did not read: %+v", ra.Usage)
				}
			}
			if len(hb.Inventory.GPUs) != 1 || hb.Inventory.Images[0] != "registry.example/app:1" {
				t.Errorf("inventory %+v", hb.Inventory)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("heartbeat: %+v, %v", hb, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !other.PeerHasImage(ctx, "registry.example/app:1") || other.PeerHasImage(ctx, "registry.example/other:1") {
		t.Error("a worker does not tell which images its peer has")
	}
	if r.PeerHasImage(ctx, "registry.example/app:1") {
		t.Error("a worker counts its own images as a peer's")
	}
}
