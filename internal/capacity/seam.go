package capacity

import (
	"context"
	"errors"
	"time"

	"github.com/fleet-dev/fleet/job"
)

// The seam between a worker and its capacity: what the worker asks before
// an attempt runs and after it ends. The ledger (package ledger) is the
// fleet's implementation, on Redis; a worker without one counts its slots
// alone.

// Capacity reserves what an attempt needs before it runs and releases it
// after. A reservation that fails with ErrNoCapacity gives the job back to
// the pool, for another worker.
type Capacity interface {
	Reserve(ctx context.Context, l Lease) error
	Release(ctx context.Context, l Lease) error
}

// Holder is implemented by a Capacity that can tell whether another worker
// still runs an attempt: a job recorded as running is then left to it,
// rather than run again, when JetStream delivers it to another worker.
type Holder interface {
	Holds(ctx context.Context, workerID, tenant, jobID string, attempt int) (bool, error)
}

// Peers is implemented by a Capacity that knows what the other live
// workers of the pool report: whether one has an image cached.
type Peers interface {
	PeerHasImage(ctx context.Context, image string) bool
}

// Room is implemented by a Capacity that knows how many more jobs of the
// default size the worker's resources hold; the worker pulls no more.
type Room interface {
	Room() int
}

// Sharer is implemented by a Capacity that shares its pool between
// tenants: it enforces the pool's quotas and bound on every reservation,
// and knows what each tenant holds on the pool's other workers and its
// usage, as its last round trip to Redis learned them.
type Sharer interface {
	// SetPolicy gives it the pool's policy (quotas, bound, half-life).
	SetPolicy(p *job.PoolPolicy)
	// Shares returns what it last learned of the pool.
	Shares() Shares
}

// Shares is what a worker knows of its pool's tenants.
type Shares struct {
	// At is when it was learned; zero when nothing was.
	At time.Time
	// Tenants are what each tenant holds on the pool's other workers, and
	// its usage at At.
	Tenants map[string]TenantUse
	// Slots, CPUMilli, MemoryBytes and GPUs are the totals of the pool's
	// workers, this one's included (CPU and memory -1 when unknown); Used
	// is the slots the other workers' leases hold.
	Slots, CPUMilli, MemoryBytes, GPUs, Used int64
}

// ErrNoCapacity says the worker cannot take an attempt now.
var ErrNoCapacity = errors.New("no capacity for this attempt")
