package executor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fleet-dev/fleet/job"
)

// Adopter is implemented by executors whose attempts outlive the worker
// process that started them (Docker containers, Kubernetes Jobs), and that
// can follow such an attempt from another process: a worker restarted with
// the same id (Docker), or any worker of the pool (Kubernetes).
//
// When a job's message comes back while its record says an attempt runs on
// a worker that no longer holds it, the worker asks Find where the attempt
// stands. An attempt that still runs, or that ended while no worker
// watched, is adopted: Adopt follows it to its end and returns how it
// ended, as Run does, and the attempt count does not grow. One that is gone
// is counted as lost and the job runs again; one out of reach (on another
// Docker host) waits for the worker that can reach it.
type Adopter interface {
	// Find says where attempt q.Attempt of job q.JobID, recorded as run by
	// worker q.Owner, stands. It changes nothing.
	Find(ctx context.Context, q Query) (*Found, error)
	// Adopt follows an attempt that Find found running or ended until it
	// ends, collects what Run would (outputs, the tail of the log from the
	// moment of adoption), removes what Run would, and returns its outcome.
	// The attempt's timeout counts from when it started, not from the
	// adoption. Its ctx ends it as Run's does; ended with ErrLeaveRunning, Adopt
	// leaves a running attempt alone and returns ErrLeftRunning.
	Adopt(ctx context.Context, t *Task, f *Found) (*Outcome, error)
	// RecoverAdoptable is Recoverer.Recover for a worker that adopts: it
	// removes what earlier lives of worker workerID left behind, except
	// the attempts for which adoptable reports true (their job's record
	// still says that attempt runs): those are left for adoption.
	// The job's tenant is "" for the default tenant's.
	RecoverAdoptable(ctx context.Context, workerID string, adoptable func(tenant, jobID string, attempt int) bool) error
}

// Query names an attempt that a job's record says runs.
type Query struct {
	// Tenant owns the job; "" or job.DefaultTenant for the default one.
	Tenant  string
	JobID   string
	Attempt int
	// Owner is the worker the record names.
	Owner string
	// Self is the worker asking.
	Self string
}

// Standing is where a found attempt stands.
type Standing int

const (
	// Gone: nothing of the attempt is left; it is lost.
	Gone Standing = iota
	// Running: it runs; it can be adopted.
	Running
	// Ended: it ended while no worker watched; adopting it settles it from
	// its final status.
	Ended
	// Unreachable: only its owner can reach it (its Docker host); the job
	// waits for the owner to come back.
	Unreachable
)

func (s Standing) String() string {
	switch s {
	case Gone:
		return "gone"
	case Running:
		return "running"
	case Ended:
		return "ended"
	case Unreachable:
		return "unreachable"
	}
	return fmt.Sprintf("standing(%d)", int(s))
}

// Found is what Find found.
type Found struct {
	Standing Standing
	// Handle names the attempt in its backend, for people: a container,
	// a Kubernetes Job.
	Handle string
	// Why explains Gone and Unreachable.
	Why string
	// StartedAt is when the attempt started, when the backend knows it.
	StartedAt time.Time
	// Ref is the executor's own reference to the attempt, for Adopt.
	Ref any
}

// The cause and the error of leaving an attempt running for adoption.
var (
	// ErrLeaveRunning, as the cause of an attempt's ended context, asks an
	// Adopter to stop following the attempt and leave it running, for
	// another worker to adopt: the worker is stopping with --handoff.
	ErrLeaveRunning = errors.New("worker stopping: attempt left running for adoption")
	// ErrLeftRunning is what Run and Adopt return when they left the attempt
	// running on ErrLeaveRunning. An attempt that had not started in its backend
	// yet is stopped as on any cancel instead.
	ErrLeftRunning = errors.New("attempt left running for another worker to adopt")
)

// LeavingRunning reports whether ctx ended with ErrLeaveRunning: the
// attempt is to be left running, not stopped.
func LeavingRunning(ctx context.Context) bool {
	return ctx.Err() != nil && errors.Is(context.Cause(ctx), ErrLeaveRunning)
}

// UsageReader is implemented by executors that can read what their running
// attempts use from the backend: Docker's stats, /proc for processes, the
// metrics API of a cluster that serves it.
type UsageReader interface {
	// Usage reads what each running attempt uses now. Attempts it cannot
	// read are absent; CPUPercent is the CPU time since the previous call
	// (since the attempt started, on the first), in percent of one core.
	Usage(ctx context.Context) map[AttemptID]*job.Usage
}

// AttemptID names one attempt of a job.
type AttemptID struct {
	Tenant  string // "" for the default tenant
	JobID   string
	Attempt int
}

// DataKeeper is implemented by executors that give a job asking for it
// (job.Request.Persist) a data directory that every attempt sees:
// $FLEET_DATA, /fleet/data in a container.
type DataKeeper interface {
	// RemoveData removes the job's data directory; nothing if it has none.
	// tenant is "" for the default tenant.
	RemoveData(ctx context.Context, tenant, jobID string) error
	// Data lists the data directories on the backend, with when each was
	// made, so that those of finished jobs are removed.
	Data(ctx context.Context) ([]DataDir, error)
}

// DataDir is one job's data directory.
type DataDir struct {
	Tenant  string // "" for the default tenant
	JobID   string
	Created time.Time
}

// Fitter is implemented by executors whose workers differ in what they
// offer (GPU models, labels): Fits says why this worker cannot run a
// request that another worker of the pool might. The job is left for
// another worker.
type Fitter interface {
	Fits(r *job.Request) error
}

// ImageCache is implemented by executors whose hosts keep pulled images (a
// Docker host): Cached says whether the image is there now.
type ImageCache interface {
	Cached(ctx context.Context, image string) bool
}

// InventoryReader is implemented by executors that report what their backend
// offers for placement, for the heartbeat.
type InventoryReader interface {
	Inventory(ctx context.Context) (*job.Inventory, error)
}
