package capacity

import (
	"context"
	"errors"
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

// ErrNoCapacity says the worker cannot take an attempt now.
var ErrNoCapacity = errors.New("no capacity for this attempt")
