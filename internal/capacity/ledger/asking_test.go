package ledger

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/capacity"
	"github.com/fleet-dev/fleet/internal/redistest"
	"github.com/fleet-dev/fleet/job"
)

// A lease Redis is asked to check against a quota is not written by a
// heartbeat that comes before Redis answers. The heartbeat replaces the
// worker's leases in Redis with its own; had it carried the lease, the
// check would have found it held already ("dup") and granted it, and the
// tenant would have run past its quota (TestQuotaHoldsAcrossWorkersAndDispatchers
// saw 3 at once against a quota of 2, its workers beating every 250 ms).
// Here the heartbeat comes exactly there: the test holds the batch lock,
// as the loop does while it beats, until the reservation waits in the
// batch.
func TestAHeartbeatDoesNotWriteALeaseRedisHasNotChecked(t *testing.T) {
	srv := redistest.Start(t)
	s := open(t, srv.URL())
	ctx := context.Background()
	policy := &job.PoolPolicy{Quotas: map[string]job.Quota{"c": {Slots: 1}}}
	start := func(id string) *Ledger {
		r := New(s, Config{WorkerID: id, Pool: "p", Backend: "process", Slots: 4, Interval: time.Hour})
		r.SetPolicy(policy)
		if err := r.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Stop(ctx) })
		return r
	}
	w2 := start("w2")
	w1 := start("w1") // its first heartbeat finds w2 a peer
	if err := w2.Reserve(ctx, capacity.Lease{Tenant: "c", JobID: "c-1", Attempt: 1, StartedAt: time.Now()}); err != nil {
		t.Fatalf("the quota's one slot: %v", err)
	}

	w1.sending.Lock()
	answer := make(chan error, 1)
	go func() {
		answer <- w1.Reserve(ctx, capacity.Lease{Tenant: "c", JobID: "c-2", Attempt: 1, StartedAt: time.Now()})
	}()
	for queued := false; !queued; {
		w1.mu.Lock()
		queued = len(w1.ops) == 1
		w1.mu.Unlock()
		if !queued {
			time.Sleep(time.Millisecond)
		}
	}
	w1.heartbeat(ctx)
	w1.flush(ctx)
	w1.sending.Unlock()

	if err := <-answer; !errors.Is(err, capacity.ErrNoCapacity) {
		t.Fatalf("a second lease of tenant c, quota 1 slot, held by w2: %v; want refused", err)
	}
	if held, err := s.Holds(ctx, "p", "w1", "c", "c-2", 1); err != nil || held {
		t.Errorf("Redis holds the refused lease: %v, %v", held, err)
	}
	if n := len(w1.Snapshot().Running); n != 0 {
		t.Errorf("w1 counts %d running after the refusal", n)
	}
}
