package monitor

import "github.com/fleet-dev/fleet/job"

// Overview is the answer of GET /v1/capacity: the pools, summed, and the
// live workers' heartbeats.
type Overview struct {
	Pools   []job.PoolCapacity `json:"pools"`
	Workers []*job.Heartbeat   `json:"workers"`
}
