package monitor

import (
	"sort"

	"github.com/fleet-dev/fleet/job"
)

// Summarize sums heartbeats per pool, with the heartbeat's field names. A
// pool's CPU or memory total is unknown (nil) when any of its workers' is.
func Summarize(hbs []*job.Heartbeat) []job.PoolCapacity {
	byPool := map[string]*job.PoolCapacity{}
	unknownCPU, unknownMem := map[string]bool{}, map[string]bool{}
	for _, hb := range hbs {
		p := byPool[hb.Pool]
		if p == nil {
			zero1, zero2 := int64(0), int64(0)
			zero3, zero4 := int64(0), int64(0)
			p = &job.PoolCapacity{Pool: hb.Pool,
				CPUMilli:    job.Amount{Total: &zero1, Available: &zero2},
				MemoryBytes: job.Amount{Total: &zero3, Available: &zero4}}
			byPool[hb.Pool] = p
		}
		p.Workers++
		p.Slots.Total += hb.Slots.Total
		p.Slots.Used += hb.Slots.Used
		p.Slots.Available += hb.Slots.Available
		p.GPUs.Total += hb.GPUs.Total
		p.GPUs.Reserved += hb.GPUs.Reserved
		p.Running += len(hb.Running)
		add(&p.CPUMilli, hb.CPUMilli, unknownCPU, hb.Pool)
		add(&p.MemoryBytes, hb.MemoryBytes, unknownMem, hb.Pool)
	}
	out := make([]job.PoolCapacity, 0, len(byPool))
	for pool, p := range byPool {
		if unknownCPU[pool] {
			p.CPUMilli.Total, p.CPUMilli.Available = nil, nil
		}
		if unknownMem[pool] {
			p.MemoryBytes.Total, p.MemoryBytes.Available = nil, nil
		}
		out = append(out, *p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Pool < out[j].Pool })
	return out
}

func add(sum *job.Amount, a job.Amount, unknown map[string]bool, pool string) {
	sum.Reserved += a.Reserved
	if a.Total == nil || a.Available == nil {
		unknown[pool] = true
		return
	}
	*sum.Total += *a.Total
	*sum.Available += *a.Available
}
