package worker

import (
	"testing"

	"github.com/fleet-dev/fleet/internal/capacity"
	"github.com/fleet-dev/fleet/internal/queue"
)

// A job runs once on a worker: a second copy is refused while the first
// runs, the second's end does not forget the first, and a tenant's
// holding is what its running attempts hold, gone with the last.
func TestRunningSetHoldsOneCopyOfAJobAndWhatTenantsHold(t *testing.T) {
	var r runningSet
	first := &delivery{id: "j1", key: queue.JobKey{Tenant: "acme"}}
	second := &delivery{id: "j1", key: queue.JobKey{Tenant: "acme"}}
	other := &delivery{id: "j1", key: queue.JobKey{Tenant: "globex"}}
	if !r.add(first) || r.add(second) || !r.add(other) {
		t.Fatal("want the first copy added, the second refused, another tenant's job of the same id added")
	}
	r.remove(second)
	if r.get("acme", "j1") != first || r.len() != 2 {
		t.Fatalf("the refused copy's end forgot the first: %v, %d running", r.get("acme", "j1"), r.len())
	}
	r.remove(first)
	if r.get("acme", "j1") != nil || r.len() != 1 {
		t.Fatalf("after the first ended: %v, %d running", r.get("acme", "j1"), r.len())
	}

	h := capacity.Holding{Slots: 1, CPUMilli: 500, MemoryBytes: 1 << 20}
	r.hold("acme", h, 1)
	r.hold("acme", h, 1)
	got := r.holdings()
	if got["acme"].Slots != 2 || got["acme"].CPUMilli != 1000 || got["acme"].MemoryBytes != 2<<20 {
		t.Fatalf("two attempts of acme hold %+v", got["acme"])
	}
	got["acme"] = capacity.Holding{} // a copy: the set is not changed through it
	r.hold("acme", h, -1)
	if r.holdings()["acme"].Slots != 1 {
		t.Fatalf("after one ended acme holds %+v", r.holdings()["acme"])
	}
	r.hold("acme", h, -1)
	if _, ok := r.holdings()["acme"]; ok {
		t.Fatal("a tenant with nothing running still holds something")
	}
}
