package capacity

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleet-dev/fleet/internal/redistest"
	"github.com/fleet-dev/fleet/job"
)

// Every call of the Store works on a Redis Cluster, where a command or a
// script over keys of two slots fails with CROSSSLOT: the pools' keys are
// spread over the three masters, and one pool's keys (its workers')
// share a slot.
func TestEveryCallWorksOnACluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	s := open(t, cl.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cc := s.rdb.(*redis.ClusterClient)

	const n, pools = 12, 6
	masters := map[string]bool{}
	for i := 0; i < n; i++ {
		id, pool := fmt.Sprintf("w%d", i), fmt.Sprintf("p%d", i%pools)
		slots := map[int64]bool{}
		for _, k := range []string{s.hbKey(pool, id), s.lastKey(pool, id), s.slotsKey(pool, id), s.tenantsKey(pool, id),
			s.poolKey(pool), s.usageKey(pool), s.slotsKey(pool, "other")} {
			slot, err := cc.ClusterKeySlot(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			slots[slot] = true
		}
		if len(slots) != 1 {
			t.Fatalf("the keys of %s and its pool lie in %d slots", id, len(slots))
		}
		m, err := cc.MasterForKey(ctx, s.hbKey(pool, id))
		if err != nil {
			t.Fatal(err)
		}
		masters[m.String()] = true

		hb := heartbeat(id, pool)
		lease := Lease{JobID: "j-" + id, Attempt: 1, CPUMilli: 100, MemoryBytes: 1 << 20}
		if _, err := s.Beat(ctx, Beat{Heartbeat: hb, TTL: time.Minute, LeaseTTL: time.Minute,
			Totals: Totals{Slots: 2, CPUMilli: ptr(1000)}, Leases: []Lease{lease}}); err != nil {
			t.Fatalf("beat of %s: %v", id, err)
		}
		out, err := s.ApplyLeases(ctx, pool, id, time.Minute, []LeaseOp{{Lease: Lease{JobID: "k-" + id, Attempt: 1, CPUMilli: 100}}})
		if err != nil || len(out) != 1 || out[0] != LeaseOK {
			t.Fatalf("lease on %s: %v %v", id, out, err)
		}
	}
	if len(masters) < 2 {
		t.Fatalf("%d pools' keys all lie on one master: the test would not catch a cross-slot command", pools)
	}

	hbs, err := s.Workers(ctx, "")
	if err != nil || len(hbs) != n {
		t.Fatalf("Workers: %d heartbeats, %v; want %d", len(hbs), err, n)
	}
	if hbs, err := s.Workers(ctx, "p1"); err != nil || len(hbs) != n/pools {
		t.Fatalf("Workers(p1): %d heartbeats, %v", len(hbs), err)
	}
	if u, err := s.Usage(ctx, "p3", "w3"); err != nil || u.Slots != 2 || u.SlotsUsed != 2 || u.CPUUsed != 200 {
		t.Errorf("usage of w3: %+v %v", u, err)
	}
	if l, err := s.Leases(ctx, "p3", "w3"); err != nil || len(l) != 2 {
		t.Errorf("leases of w3: %v %v", l, err)
	}

	// What the reaper does, on a worker whose heartbeat is gone.
	if err := cc.Del(ctx, s.hbKey("p5", "w5")).Err(); err != nil {
		t.Fatal(err)
	}
	stale, err := s.Stale(ctx, "p5", time.Now().Add(time.Second))
	if err != nil || !strings.Contains(fmt.Sprint(stale), "w5") {
		t.Fatalf("stale: %v %v", stale, err)
	}
	if alive, err := s.Alive(ctx, "p5", "w5"); err != nil || alive {
		t.Fatalf("w5 alive: %v %v", alive, err)
	}
	if hb, err := s.LastHeartbeat(ctx, "p5", "w5"); err != nil || hb == nil || hb.WorkerID != "w5" {
		t.Fatalf("last heartbeat of w5: %+v %v", hb, err)
	}
	if mine, err := s.Unindex(ctx, "p5", "w5"); err != nil || !mine {
		t.Fatalf("unindex: %v %v", mine, err)
	}
	if mine, _ := s.Unindex(ctx, "p5", "w5"); mine {
		t.Error("unindexed twice")
	}
	if err := s.Forget(ctx, "p5", "w5"); err != nil {
		t.Fatal(err)
	}
	if n, _ := cc.Exists(ctx, s.lastKey("p5", "w5")).Result(); n != 0 {
		t.Error("forgotten, but its last heartbeat is left")
	}
	if n, _ := cc.Exists(ctx, s.slotsKey("p5", "w5")).Result(); n != 0 {
		t.Error("forgotten, but its leases are left")
	}

	// A clean stop.
	if err := s.Remove(ctx, "w4", "p4"); err != nil {
		t.Fatal(err)
	}
	if hbs, err := s.Workers(ctx, "p4"); err != nil || len(hbs) != n/pools-1 {
		t.Fatalf("after Remove: %d heartbeats in p4, %v", len(hbs), err)
	}
}

// A server without the scripts cached (restarted, or a replica promoted
// by a failover: scripts are not replicated into its cache) runs them
// all the same, for a batch of leases and for a heartbeat.
func TestScriptsRunOnAServerThatForgotThem(t *testing.T) {
	stores(t, func(t *testing.T, url string) {
		s := open(t, url)
		ctx := context.Background()
		flush := func() {
			t.Helper()
			var err error
			if cc, ok := s.rdb.(*redis.ClusterClient); ok {
				err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
					return c.ScriptFlush(ctx).Err()
				})
			} else {
				err = s.rdb.ScriptFlush(ctx).Err()
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		hb := heartbeat("w", "p")
		beat := Beat{Heartbeat: hb, TTL: time.Minute, LeaseTTL: time.Minute, Totals: Totals{Slots: 2},
			Leases: []Lease{{JobID: "a", Attempt: 1}}}
		for i := 0; i < 2; i++ { // the first run may meet an empty cache too
			flush()
			if _, err := s.Beat(ctx, beat); err != nil {
				t.Fatalf("heartbeat after SCRIPT FLUSH: %v", err)
			}
			if u, err := s.Usage(ctx, "p", "w"); err != nil || u.Slots != 2 || u.SlotsUsed != 1 {
				t.Fatalf("after the heartbeat: %+v %v", u, err)
			}
			flush()
			out, err := s.ApplyLeases(ctx, "p", "w", time.Minute, []LeaseOp{{Lease: Lease{JobID: "b", Attempt: i}}})
			if err != nil || len(out) != 1 || out[0] != LeaseOK {
				t.Fatalf("leases after SCRIPT FLUSH: %v %v", out, err)
			}
		}
	})
}

// heartbeat is a valid heartbeat document, as Workers reads only those.
func heartbeat(id, pool string) *job.Heartbeat {
	return &job.Heartbeat{WorkerID: id, Pool: pool, Backend: "noop", Version: "test", Health: job.HealthHealthy,
		ObservedAt: time.Now().UTC(), Slots: job.Slots{Total: 2}, Running: []job.RunningAttempt{}}
}
