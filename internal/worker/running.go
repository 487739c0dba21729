package worker

import (
	"sync"

	"github.com/fleet-dev/fleet/internal/capacity"
)

// runningSet is what runs on a worker: each delivery by its job, so that a
// cancel finds it and a second copy of the job does not start beside it,
// and what they hold by tenant, for the plan (see tenantView).
type runningSet struct {
	mu       sync.Mutex
	byJob    map[string]*delivery
	byTenant map[string]capacity.Holding
}

// runKey names a running delivery: job ids are a tenant's.
func runKey(tenant, id string) string { return tenant + "/" + id }

// add notes d as running; false when another copy of its job already
// runs here.
func (r *runningSet) add(d *delivery) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := runKey(d.key.Tenant, d.id)
	if r.byJob[k] != nil {
		return false
	}
	if r.byJob == nil {
		r.byJob = map[string]*delivery{}
	}
	r.byJob[k] = d
	return true
}

// remove forgets d, unless another copy of its job took its place.
func (r *runningSet) remove(d *delivery) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if k := runKey(d.key.Tenant, d.id); r.byJob[k] == d {
		delete(r.byJob, k)
	}
}

// get returns the delivery of a tenant's job running here, or nil.
func (r *runningSet) get(tenant, id string) *delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byJob[runKey(tenant, id)]
}

func (r *runningSet) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.byJob)
}

// hold counts h in what tenant runs here (sign 1), or no longer (-1).
func (r *runningSet) hold(tenant string, h capacity.Holding, sign int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byTenant == nil {
		r.byTenant = map[string]capacity.Holding{}
	}
	o := r.byTenant[tenant].Add(capacity.Holding{Slots: sign * h.Slots, CPUMilli: sign * h.CPUMilli, MemoryBytes: sign * h.MemoryBytes, GPUs: sign * h.GPUs})
	if o.Slots <= 0 {
		delete(r.byTenant, tenant)
		return
	}
	r.byTenant[tenant] = o
}

// holdings returns a copy of what runs here, by tenant.
func (r *runningSet) holdings() map[string]capacity.Holding {
	r.mu.Lock()
	defer r.mu.Unlock()
	own := make(map[string]capacity.Holding, len(r.byTenant))
	for t, h := range r.byTenant {
		own[t] = h
	}
	return own
}
