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

// With Redis SIGKILLed, the ledger goes on counting on its own: once a
// heartbeat found Redis unreachable (the breaker open), reservations are
// answered, none sent to Redis; the Holds of a job redelivered meanwhile
// fails with ErrUnavailable, a call that was not sent; what does not fit
// is refused locally; and once Redis is back, empty, the leases in it
// match what the ledger holds. (How fast a reservation is with Redis up,
// away and hung, side by side, is BenchmarkReserve's.)
func TestLedgerCountsWhileRedisIsAway(t *testing.T) {
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

	cycles(t, r, "up", 50)
	srv.Stop()
	// The next heartbeat finds Redis gone: the breaker opens.
	for deadline := time.Now().Add(10 * time.Second); s.Up(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("with Redis gone, the breaker stayed closed")
		}
	}
	cycles(t, r, "down", 300)
	if _, err := r.Holds(ctx, "w2", "", "j", 1); !errors.Is(err, capacity.ErrUnavailable) {
		t.Errorf("Holds while Redis is away: %v, want ErrUnavailable (not sent)", err)
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
	t.Logf("leases matched %s after Redis returned", time.Since(back).Round(time.Millisecond))
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
// waiting on the call under way one CallTimeout, once: none waits two.
func TestLedgerHungRedisCostsOneTimeout(t *testing.T) {
	srv := redistest.Start(t)
	s := open(t, srv.URL())
	ctx := context.Background()
	r := New(s, Config{WorkerID: "w1", Pool: "p", Backend: "process", Slots: 2, Interval: 20 * time.Millisecond})
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer r.Stop(ctx)
	cycles(t, r, "up", 50)
	srv.Freeze()
	defer srv.Thaw()
	hung := cycles(t, r, "hung", 300)
	slowest := slices.Max(hung)
	t.Logf("with Redis hung: slowest reservation %s, p99 %s", slowest, p99(hung))
	// A reservation that waited on a second call would have waited two
	// timeouts: the breaker opened with the first.
	if slowest >= 2*CallTimeout {
		t.Errorf("with Redis hung a reservation waited %s, two calls' timeouts (%s each)", slowest, CallTimeout)
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
	// A call to the frozen Redis would have waited its whole timeout.
	if took := time.Since(start); took >= CallTimeout/2 {
		t.Errorf("a reservation without a quota took %s with Redis frozen (a call's timeout is %s); want it answered without Redis", took, CallTimeout)
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

// BenchmarkReserve: a reservation and its release, as an attempt makes
// them, with Redis up, SIGKILLed (the breaker open) and hung (SIGSTOP):
// the ledger answers a reservation nothing in Redis can refuse at once,
// whether Redis answers or not.
func BenchmarkReserve(b *testing.B) {
	for _, state := range []string{"up", "away", "hung"} {
		b.Run("redis "+state, func(b *testing.B) {
			srv := redistest.Start(b)
			s, err := capacity.Open(srv.URL(), capacity.Config{Prefix: "fleetbench", ProbeFirst: 10 * time.Millisecond, ProbeMax: 50 * time.Millisecond})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			ctx := context.Background()
			r := New(s, Config{WorkerID: "w1", Pool: "p", Backend: "process", Slots: 2, CPUMilli: ptr(2000), Interval: 20 * time.Millisecond})
			if err := r.Start(ctx); err != nil {
				b.Fatal(err)
			}
			defer r.Stop(ctx)
			switch state {
			case "away":
				srv.Stop()
				for s.Up() {
					time.Sleep(5 * time.Millisecond)
				}
			case "hung":
				srv.Freeze()
				defer srv.Thaw()
				for s.Up() { // the call under way times out, once
					time.Sleep(5 * time.Millisecond)
				}
			}
			b.ResetTimer()
			for i := range b.N {
				l := capacity.Lease{JobID: fmt.Sprintf("bench-%d", i), Attempt: 1, CPUMilli: 1000, StartedAt: time.Now()}
				if err := r.Reserve(ctx, l); err != nil {
					b.Fatal(err)
				}
				if err := r.Release(ctx, l); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
