package producer

import (
	"fmt"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// queuesOf makes queues with the given backlogs: "p/tenant" → waiting.
func queuesOf(backlog map[string]int64) *queues {
	qs := newQueues()
	for k, n := range backlog {
		var p int
		var t string
		fmt.Sscanf(k, "%d/%s", &p, &t)
		q := &workQueue{key: queue.QueueKey{Priority: p, Tenant: t}}
		q.pending.Store(n)
		qs.add(q)
	}
	return qs
}

func planned(plan []take) map[string]int {
	out := map[string]int{}
	for _, t := range plan {
		out[fmt.Sprintf("%d/%s", t.q.key.Priority, t.q.key.Tenant)] += t.n
	}
	return out
}

func noLoad(string) tenantView { return tenantView{} }

func TestPlanTakesHigherPrioritiesFirst(t *testing.T) {
	qs := queuesOf(map[string]int64{"5/a": 100, "1/b": 2, "3/c": 3})
	got := planned(qs.plan(4, nil, noLoad, time.Second, 0, time.Now()))
	if fmt.Sprint(got) != "map[1/b:2 3/c:2]" {
		t.Errorf("plan of 4 slots: %v; want b's two priority-1 jobs, then two of c's priority 3", got)
	}
}

// A queue of priority 2 being bound (held) keeps every slot from the
// queues of a lower priority, probes included; the queues of its
// priority and above are planned as before.
func TestPlanGivesNothingBelowAQueueBeingBound(t *testing.T) {
	qs := queuesOf(map[string]int64{"1/a": 1, "2/b": 1, "3/c": 5, "5/d": 0})
	qs.list[3].unacked.Store(1)
	if got := planned(qs.plan(4, nil, noLoad, time.Second, 2, time.Now())); fmt.Sprint(got) != "map[1/a:1 2/b:1]" {
		t.Errorf("4 slots, priority 2 held: %v; want a's and b's jobs only", got)
	}
	qs = queuesOf(map[string]int64{"1/a": 1, "2/b": 1, "3/c": 5})
	if got := planned(qs.plan(4, nil, noLoad, time.Second, 0, time.Now())); got["3/c"] != 2 {
		t.Errorf("4 slots, nothing held: %v; want two of c's jobs after a's and b's", got)
	}
}

func TestPlanSharesByWeightAndLoad(t *testing.T) {
	qs := queuesOf(map[string]int64{"3/a": 1000, "3/b": 1000})
	policy := &job.PoolPolicy{Weights: map[string]float64{"a": 1, "b": 3}}
	if got := planned(qs.plan(4, policy, noLoad, time.Second, 0, time.Now())); got["3/a"] != 1 || got["3/b"] != 3 {
		t.Errorf("4 free slots, weights 1 and 3: %v", got)
	}
	// b already runs 3: the next slot is a's.
	busy := func(t string) tenantView {
		if t == "b" {
			return tenantView{load: 3}
		}
		return tenantView{}
	}
	if got := planned(qs.plan(1, policy, busy, time.Second, 0, time.Now())); got["3/a"] != 1 {
		t.Errorf("one free slot, b running 3, a none: %v", got)
	}
	// Usage counts as load: a that ran a lot yields its weight's share.
	used := func(t string) tenantView {
		if t == "a" {
			return tenantView{load: 10}
		}
		return tenantView{}
	}
	if got := planned(qs.plan(8, nil, used, time.Second, 0, time.Now())); got["3/b"] != 8 {
		t.Errorf("8 slots, a with 10 slots of past usage, equal weights: %v", got)
	}
}

func TestPlanSkipsBlockedTenantsAndProbesForRetries(t *testing.T) {
	qs := queuesOf(map[string]int64{"3/a": 10, "3/b": 10})
	blocked := func(t string) tenantView { return tenantView{blocked: t == "a"} }
	if got := planned(qs.plan(4, nil, blocked, time.Second, 0, time.Now())); got["3/a"] != 0 || got["3/b"] != 4 {
		t.Errorf("a at its quota: %v", got)
	}
	// A queue with nothing known waiting, but deliveries not acknowledged
	// (a retry due later), is asked for one job once per probeAfter.
	idle := queuesOf(map[string]int64{"3/c": 0})
	idle.list[0].unacked.Store(1)
	now := time.Now()
	if got := planned(idle.plan(4, nil, noLoad, time.Second, 0, now)); got["3/c"] != 1 {
		t.Errorf("probe: %v", got)
	}
	if got := planned(idle.plan(4, nil, noLoad, time.Second, 0, now.Add(500*time.Millisecond))); len(got) != 0 {
		t.Errorf("probed again within probeAfter: %v", got)
	}
}

func TestUsageDecays(t *testing.T) {
	var u usage
	now := time.Now()
	hl := 10 * time.Second
	u.add("a", 20*time.Second, hl, now) // 20 slot-seconds
	if got := u.slots("a", hl, now); got < 1.38 || got > 1.39 {
		t.Errorf("20 slot-s over a 10 s half-life: %.3f slots, want 20·ln2/10 = 1.386", got)
	}
	if got := u.slots("a", hl, now.Add(hl)); got < 0.69 || got > 0.70 {
		t.Errorf("one half-life later: %.3f, want half", got)
	}
}

// A cut gives back what the waiting pull requests hold and have not
// filled, once: what they bring after takes no slot of theirs, and their
// end gives back nothing more.
func TestCutReturnsWhatWaitingRequestsHold(t *testing.T) {
	s := &queueSet{queues: newQueues()}
	freed := 0
	free := func() { freed++ }
	a, b := s.wait(4, time.Second, free), s.wait(2, time.Second, free)
	if !a.take() || !a.take() {
		t.Fatal("a request with room refused a message")
	}
	if requests, slots := s.cut(); requests != 2 || slots != 4 {
		t.Fatalf("cut: %d requests, %d slots; want 2 and 4 (a's 2 left, b's 2)", requests, slots)
	}
	if freed != 2 {
		t.Errorf("cut gave back %d places among the open fetches; want 2", freed)
	}
	if a.take() || b.take() {
		t.Error("a request cut took a slot of its own")
	}
	if requests, slots := s.cut(); requests != 0 || slots != 0 {
		t.Errorf("second cut: %d requests, %d slots; want none", requests, slots)
	}
	if n := s.waited(a) + s.waited(b); n != 0 {
		t.Errorf("the requests cut gave back %d slots as they ended; want 0", n)
	}
	a.free()
	b.free()
	if freed != 2 {
		t.Errorf("the requests cut gave their places back %d times in all; want once each", freed)
	}
	c := s.wait(3, time.Second, free)
	c.take()
	if n := s.waited(c); n != 2 {
		t.Errorf("a request that was not cut gave back %d slots; want the 2 it did not fill", n)
	}
	c.free()
	if freed != 3 {
		t.Errorf("places given back: %d; want 3", freed)
	}
	if requests, _ := s.cut(); requests != 0 {
		t.Errorf("cut %d requests that had ended", requests)
	}
}
