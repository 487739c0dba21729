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
	// Inventory is what the worker's backend offers for placement: GPU
	// models, the nodes' labels, cached images. Bounded (see the Max
	// constants).
	Inventory *Inventory `json:"inventory,omitempty"`
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
	// Tenant owns the job (v2); absent for the default tenant.
	Tenant      string    `json:"tenant,omitempty"`
	JobID       string    `json:"job_id"`
	Attempt     int       `json:"attempt"`
	StartedAt   time.Time `json:"started_at"`
	CPUMilli    int64     `json:"cpu_milli"`
	MemoryBytes int64     `json:"memory_bytes"`
	GPUs        int       `json:"gpus,omitempty"`
	// Usage is what the attempt uses now, read from the backend; nil when
	// the backend cannot tell.
	Usage *Usage `json:"usage,omitempty"`
}

// Usage is what a running attempt uses, as its backend reports it at
// ObservedAt. A field the backend cannot read is absent (nil).
type Usage struct {
	ObservedAt time.Time `json:"observed_at"`
	// CPUPercent is the CPU time used since the previous reading, in
	// percent of one core: 250 is two and a half cores.
	CPUPercent       *float64 `json:"cpu_percent,omitempty"`
	MemoryBytes      *int64   `json:"memory_bytes,omitempty"`
	MemoryLimitBytes *int64   `json:"memory_limit_bytes,omitempty"`
	// Network and block I/O, in bytes since the attempt started.
	NetRxBytes      *int64 `json:"net_rx_bytes,omitempty"`
	NetTxBytes      *int64 `json:"net_tx_bytes,omitempty"`
	BlockReadBytes  *int64 `json:"block_read_bytes,omitempty"`
	BlockWriteBytes *int64 `json:"block_write_bytes,omitempty"`
	Pids            *int64 `json:"pids,omitempty"`
}

// Inventory is what a worker's backend offers for placement.
type Inventory struct {
	// GPUs lists the GPU models the backend has, each with the most of it
	// one node (one Docker host) offers.
	GPUs []GPUModel `json:"gpus,omitempty"`
	// PlacementKeys are the label keys requests may select nodes by
	// (placement.node_selector).
	PlacementKeys []string `json:"placement_keys,omitempty"`
	// Nodes lists, on Kubernetes, the nodes the worker can see with their
	// labels of the placement keys and the GPU model label; at most
	// MaxInventoryNodes.
	Nodes []Node `json:"nodes,omitempty"`
	// Images lists images cached on the Docker host, at most
	// MaxInventoryImages.
	Images []string `json:"images,omitempty"`
}

// GPUModel is a GPU model and how many of it one node offers.
type GPUModel struct {
	Model string `json:"model"`
	Count int    `json:"count"`
}

// Node is a Kubernetes node as a worker's inventory shows it.
type Node struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels,omitempty"`
}

// Bounds of a heartbeat's inventory.
const (
	MaxInventoryNodes  = 64
	MaxInventoryImages = 256
	MaxInventoryGPUs   = 16
)

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
	// Paused is set while an operator has paused the pool.
	Paused bool `json:"paused,omitempty"`
}
