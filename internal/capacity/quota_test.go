package capacity

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/job"
)

// A tenant's quota counts its leases on every worker of the pool: three
// workers reserving for one tenant at once, from many goroutines, never
// hold more than its quota of slots or GPUs together; the pool's bound
// holds the same way; a release makes room; and a batch that names the
// wrong peers is not applied but answered with the pool's workers.
func TestQuotaHoldsAcrossTheWorkersOfAPool(t *testing.T) {
	stores(t, func(t *testing.T, url string) {
		s := open(t, url)
		ctx := context.Background()
		workers := []string{"w1", "w2", "w3"}
		for _, w := range workers {
			if err := setTotals(ctx, s, "shared", w, Totals{Slots: 40, CPUMilli: ptr(40000), GPUs: 4}); err != nil {
				t.Fatal(err)
			}
		}
		peersOf := func(self string) []string {
			var p []string
			for _, w := range workers {
				if w != self {
					p = append(p, w)
				}
			}
			return p
		}
		slots2 := &job.QuotaLimits{Slots: 2, CPUMilli: -1, MemoryBytes: -1, GPUs: -1}
		gpu1 := &job.QuotaLimits{Slots: -1, CPUMilli: -1, MemoryBytes: -1, GPUs: 1}
		var mu sync.Mutex
		granted := map[string]int{}
		var wg sync.WaitGroup
		for i := range 30 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				w := workers[i%3]
				ops := []LeaseOp{
					{Lease: Lease{Tenant: "c", JobID: fmt.Sprintf("c-%d", i), Attempt: 1, CPUMilli: 100}, Quota: slots2},
					{Lease: Lease{Tenant: "g", JobID: fmt.Sprintf("g-%d", i), Attempt: 1, CPUMilli: 100, GPUs: 1}, Quota: gpu1},
					{Lease: Lease{Tenant: "g", JobID: fmt.Sprintf("g-cpu-%d", i), Attempt: 1, CPUMilli: 100}, Quota: gpu1},
				}
				a, err := s.Apply(ctx, LeaseBatch{Pool: "shared", Worker: w, TTL: time.Minute, Ops: ops, Peers: peersOf(w)})
				if err != nil || a.Stale() {
					t.Errorf("apply: %v %+v", err, a)
					return
				}
				mu.Lock()
				defer mu.Unlock()
				for k, r := range a.Replies {
					granted[fmt.Sprintf("%d:%s", k, r)]++
				}
			}()
		}
		wg.Wait()
		if granted["0:ok"] != 2 || granted["0:no:quota:slots"] != 28 {
			t.Errorf("slot quota 2: %v", granted)
		}
		if granted["1:ok"] != 1 || granted["1:no:quota:gpu"] != 29 {
			t.Errorf("GPU quota 1: %v", granted)
		}
		if granted["2:ok"] != 30 {
			t.Errorf("jobs without GPUs of a tenant at its GPU quota: %v", granted)
		}
		// What the tenants hold, as the dispatcher reads it.
		held, slots, err := s.Tenants(ctx, "shared", time.Minute)
		if err != nil || slots != 120 || held["c"].Others.Slots != 2 || held["g"].Others.GPUs != 1 {
			t.Errorf("tenants: %+v, %d slots, %v", held, slots, err)
		}
		// A release on one worker makes room on another.
		var cHeld []Lease
		var from string
		for _, w := range workers {
			ls, _ := s.Leases(ctx, "shared", w)
			for _, l := range ls {
				if l.Tenant == "c" {
					cHeld = append(cHeld, l)
					from = w
				}
			}
		}
		if len(cHeld) != 2 {
			t.Fatalf("tenant c holds %d leases", len(cHeld))
		}
		cHeld[0] = cHeld[len(cHeld)-1] // from's
		if _, err := s.Apply(ctx, LeaseBatch{Pool: "shared", Worker: from, TTL: time.Minute, Peers: peersOf(from),
			Ops: []LeaseOp{{Release: true, Lease: cHeld[0]}}}); err != nil {
			t.Fatal(err)
		}
		other := workers[0]
		if other == from {
			other = workers[1]
		}
		a, err := s.Apply(ctx, LeaseBatch{Pool: "shared", Worker: other, TTL: time.Minute, Peers: peersOf(other),
			Ops: []LeaseOp{{Lease: Lease{Tenant: "c", JobID: "c-after", Attempt: 1}, Quota: slots2}}})
		if err != nil || a.Stale() || a.Replies[0] != LeaseOK {
			t.Errorf("after a release elsewhere: %+v %v", a, err)
		}
		// The pool's bound: 33 leases held; a bound of 34 lets one more in.
		a, err = s.Apply(ctx, LeaseBatch{Pool: "shared", Worker: "w1", TTL: time.Minute, Peers: peersOf("w1"), Ops: []LeaseOp{
			{Lease: Lease{Tenant: "x", JobID: "x-1", Attempt: 1}, MaxRunning: 34},
			{Lease: Lease{Tenant: "x", JobID: "x-2", Attempt: 1}, MaxRunning: 34},
		}})
		if err != nil || a.Stale() || fmt.Sprint(a.Replies) != "[ok no:max_running]" {
			t.Errorf("max_running: %+v %v", a, err)
		}
		// Peers that are not the pool's workers: nothing applied, the
		// answer names them.
		a, err = s.Apply(ctx, LeaseBatch{Pool: "shared", Worker: "w1", TTL: time.Minute, Peers: []string{"w2"},
			Ops: []LeaseOp{{Lease: Lease{Tenant: "c", JobID: "c-stale", Attempt: 1}, Quota: slots2}}})
		if err != nil || !a.Stale() || fmt.Sprint(a.Peers) != "[w2 w3]" {
			t.Errorf("stale peers: %+v %v", a, err)
		}
		if ls, _ := s.Leases(ctx, "shared", "w1"); slices.ContainsFunc(ls, func(l Lease) bool { return l.JobID == "c-stale" }) {
			t.Error("a stale batch was applied")
		}
	})
}
