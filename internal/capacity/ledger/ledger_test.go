package ledger

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/capacity"
	"github.com/fleet-dev/fleet/internal/redistest"
	"github.com/fleet-dev/fleet/internal/worker"
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

func waitLeases(t *testing.T, s *capacity.Store, worker, want string) {
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
