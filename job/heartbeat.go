package job

import "time"

// Worker health, as reported in heartbeats.
const (
	HealthHealthy   = "healthy"
	HealthDegraded  = "degraded"  // running, but its backend answers badly
	HealthDraining  = "draining"  // stopping: takes no new work
	HealthUnhealthy = "unhealthy" // cannot run work
)

// Heartbeat is a worker's capacity snapshot (schema capacity-heartbeat.v1),
// written to Redis every interval with a TTL of three intervals. Amounts a
// backend cannot know are nil, and appear as null.
type Heartbeat struct {
	WorkerID    string            `json:"worker_id"`
	Pool        string            `json:"pool"`
	Backend     string            `json:"backend"`
	Labels      map[string]string `json:"labels,omitempty"`
	Version     string            `json:"version"`
	ObservedAt  time.Time         `json:"observed_at"`
	Health      string            `json:"health"`
	Reason      string            `json:"reason,omitempty"`
	Slots       Slots             `json:"slots"`
	CPUMilli    Amount            `json:"cpu_milli"`
	MemoryBytes Amount            `json:"memory_bytes"`
	GPUs        GPUs              `json:"gpus"`
	Running     []RunningAttempt  `json:"running"`
	Host        *Host             `json:"host,omitempty"`
	// Containers counts the backend's containers or pods by state, where the
	// backend has them.
	Containers *ContainerCounts `json:"containers,omitempty"`
}

// Slots are job slots: one running attempt holds one.
type Slots struct {
	Total     int `json:"total"`
	Used      int `json:"used"`
	Available int `json:"available"`
}

// Amount is a resource total, what running attempts reserve of it, and what
// is left. Total and Available are nil when unknown.
type Amount struct {
	Total     *int64 `json:"total"`
	Reserved  int64  `json:"reserved"`
	Available *int64 `json:"available"`
}

// GPUs on a worker.
type GPUs struct {
	Total    int `json:"total"`
	Reserved int `json:"reserved"`
}

// RunningAttempt is one attempt a worker holds.
type RunningAttempt struct {
	JobID       string    `json:"job_id"`
	Attempt     int       `json:"attempt"`
	StartedAt   time.Time `json:"started_at"`
	CPUMilli    int64     `json:"cpu_milli"`
	MemoryBytes int64     `json:"memory_bytes"`
	GPUs        int       `json:"gpus,omitempty"`
}

// Host describes the machine behind the worker's backend.
type Host struct {
	Hostname         string  `json:"hostname,omitempty"`
	OS               string  `json:"os,omitempty"`
	Arch             string  `json:"arch,omitempty"`
	KernelVersion    string  `json:"kernel_version,omitempty"`
	BackendVersion   string  `json:"backend_version,omitempty"`
	Cores            int     `json:"cores"`
	Load1            float64 `json:"load1"`
	Load5            float64 `json:"load5"`
	Load15           float64 `json:"load15"`
	MemoryTotalBytes int64   `json:"memory_total_bytes"`
	MemoryUsedBytes  int64   `json:"memory_used_bytes"`
}

// ContainerCounts counts containers (or pods) by state.
type ContainerCounts struct {
	Running   int `json:"running"`
	Starting  int `json:"starting"`
	Exited    int `json:"exited"`
	Unhealthy int `json:"unhealthy"`
}

// PoolCapacity sums the heartbeats of one pool's live workers, with the same
// field names as a heartbeat.
type PoolCapacity struct {
	Pool        string `json:"pool"`
	Workers     int    `json:"workers"`
	Slots       Slots  `json:"slots"`
	CPUMilli    Amount `json:"cpu_milli"`
	MemoryBytes Amount `json:"memory_bytes"`
	GPUs        GPUs   `json:"gpus"`
	Running     int    `json:"running"`
}
