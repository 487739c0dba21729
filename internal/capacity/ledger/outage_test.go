package ledger

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/capacity"
	"github.com/fleet-dev/fleet/internal/redistest"
)

// cycles reserves and releases n leases one after the other, as attempts
// do, and returns how long each reservation took.
func cycles(t *testing.T, r *Ledger, tag string, n int) []time.Duration {
	t.Helper()
	ctx := context.Background()
	out := make([]time.Duration, 0, n)
	for i := 0; i < n; i++ {
		l := capacity.Lease{JobID: fmt.Sprintf("%s-%d", tag, i), Attempt: 1, CPUMilli: 1000, StartedAt: time.Now()}
		start := time.Now()
		if err := r.Reserve(ctx, l); err != nil {
			t.Fatalf("reserve %s: %v", l.JobID, err)
		}
		out = append(out, time.Since(start))
		if err := r.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond) // heartbeats (every 20 ms) fall between them
	}
	return out
}

func p99(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)*99/100]
}

// With Redis SIGKILLed, a reservation takes no longer than with Redis up,
// side by side, heartbeats failing all the while; the Holds of a job
// redelivered meanwhile fail at once; and once Redis is back, empty, the
// leases in it match what the ledger holds within one lease TTL.
func TestLedgerCountsAtFullSpeedWhileRedisIsAway(t *testing.T) {
	srv := redistest.Start(t)
	s, err := capacity.Open(srv.URL(), capacity.Config{Prefix: "fleettest", ProbeFirst: 10 * time.Millisecond, ProbeMax: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	const interval = 20 * time.Millisecond
	r := New(s, Config{WorkerID: "w1", Pool: "p", Backend: "process", Slots: 2, CPUMilli: ptr(2000), Interval: interval})
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer r.Stop(ctx)

	const n = 300
	up := cycles(t, r, "up", n)
	srv.Stop()
	down := cycles(t, r, "down", n)
	t.Logf("reservation p99 with Redis up %s (max %s), with Redis killed %s (max %s)",
		p99(up), slices.Max(up), p99(down), slices.Max(down))
	if p99(down) > p99(up) {
		t.Errorf("with Redis away a reservation takes %s at p99, more than with Redis up (%s)", p99(down), p99(up))
	}
	start := time.Now()
	if _, err := r.Holds(ctx, "w2", "", "j", 1); !errors.Is(err, capacity.ErrUnavailable) {
		t.Errorf("Holds while Redis is away: %v, want ErrUnavailable", err)
	}
	if d := time.Since(start); d > p99(up) {
		t.Errorf("Holds while Redis is away took %s", d)
	}

	// Local accounting still refuses what does not fit.
	for _, id := range []string{"a", "b"} {
		if err := r.Reserve(ctx, capacity.Lease{JobID: id, Attempt: 1, CPUMilli: 500}); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Reserve(ctx, capacity.Lease{JobID: "c", Attempt: 1}); !errors.Is(err, capacity.ErrNoCapacity) {
		t.Fatalf("a third lease on two slots while Redis is away: %v", err)
	}
	srv.Start()
	back := time.Now()
	waitLeases(t, s, "w1", "[a b]")
	if d := time.Since(back); d > 5*interval+100*time.Millisecond {
		t.Errorf("leases matched %s after Redis returned, more than one lease TTL (%s) and the probe", d, 5*interval)
	}
	if u, err := s.Usage(ctx, "p", "w1"); err != nil || u.Slots != 2 || u.SlotsUsed != 2 {
		t.Fatalf("usage after the outage: %+v %v", u, err)
	}
	// And Redis counts again: it refuses what its count does not hold.
	if err := r.Release(ctx, capacity.Lease{JobID: "a", Attempt: 1}); err != nil {
		t.Fatal(err)
	}
	waitLeases(t, s, "w1", "[b]")
}

// A Redis that hangs (SIGSTOP) rather than refuses costs the reservations
// waiting on the call under way one CallTimeout, once; then they take no
// longer than with Redis up.
func TestLedgerHungRedisCostsOneTimeout(t *testing.T) {
	srv := redistest.Start(t)
	s := open(t, srv.URL())
	ctx := context.Background()
	r := New(s, Config{WorkerID: "w1", Pool: "p", Backend: "process", Slots: 2, Interval: 20 * time.Millisecond})
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer r.Stop(ctx)
	up := cycles(t, r, "up", 100)
	srv.Freeze()
	defer srv.Thaw()
	hung := cycles(t, r, "hung", 300)
	slowest := slices.Max(hung)
	t.Logf("reservation p99 with Redis up %s; with Redis hung: slowest %s, p99 %s", p99(up), slowest, p99(hung))
	if slowest > CallTimeout+200*time.Millisecond {
		t.Errorf("with Redis hung a reservation waited %s, more than one call's timeout (%s)", slowest, CallTimeout)
	}
	if p99(hung) > p99(up) {
		t.Errorf("with Redis hung, reservations take %s at p99, more than with Redis up (%s)", p99(hung), p99(up))
	}
}

// A reservation that nothing in Redis can refuse (no quota for its tenant,
// no bound for the pool) is answered by the ledger at once: with Redis
// frozen, it returns within milliseconds, and its lease reaches Redis
// with the next batch once Redis answers. (One that a quota bounds waits
// for Redis's answer: the quota tests of package capacity refuse them
// there.)
func TestAReservationWithoutAQuotaDoesNotWaitForRedis(t *testing.T) {
	srv := redistest.Start(t)
	s := open(t, srv.URL())
	ctx := context.Background()
	r := New(s, Config{WorkerID: "w1", Pool: "p", Backend: "process", Slots: 4, Interval: time.Second})
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer r.Stop(ctx)
	srv.Freeze()
	thawed := false
	defer func() {
		if !thawed {
			srv.Thaw()
		}
	}()
	start := time.Now()
	if err := r.Reserve(ctx, capacity.Lease{JobID: "free", Attempt: 1, CPUMilli: 100, StartedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 50*time.Millisecond {
		t.Errorf("a reservation without a quota took %s with Redis frozen; want it answered at once", took)
	}
	srv.Thaw()
	thawed = true
	deadline := time.Now().Add(5 * time.Second)
	for {
		held, err := s.Holds(ctx, "p", "w1", "", "free", 1)
		if err == nil && held {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the lease never reached Redis: %v %v", held, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
