package executor

import (
	"context"
	"errors"
	"time"

	"github.com/fleet-dev/fleet/job"
)

// An Executor runs one attempt of a job on its platform: a process, a Docker
// container, a Kubernetes Job.
//
// Run returns when the attempt has ended and nothing it started is left
// running. The Outcome says how the attempt ended: succeeded, failed (with
// the exit code), timed_out (the executor enforces Task.Request.Timeout) or
// cancelled (ctx ended; context.Cause tells why). An error means the
// executor could not run or follow the attempt; a *job.Failure error
// carries its class (an image that cannot be pulled is ClassImage), any
// other error counts as ClassInfrastructure.
type Executor interface {
	Run(ctx context.Context, t *Task) (*Outcome, error)
}

// Validator is implemented by executors with requirements of their own (an
// image, a command). The worker refuses, as ClassRejected, a request that an
// executor says it can never run.
type Validator interface {
	Validate(r *job.Request) error
}

// Task is one attempt handed to an executor.
type Task struct {
	// Tenant owns the job (contract v2): "" or job.DefaultTenant for the
	// default tenant, whose jobs executors name and label as before.
	// Job ids are a tenant's own, so an executor tells jobs apart by both.
	Tenant   string
	JobID    string
	Attempt  int
	WorkerID string
	Pool     string
	// Request is the normalized request. Its memory may have been raised by
	// an OOM retry.
	Request *job.Request
	// Report receives what the attempt says while it runs.
	Report Reporter
	// Artifacts fetches the inputs by reference and stores the outputs
	// that do not fit in the result; nil when the worker has no object
	// store. See NewWorkspace and CollectOutputs.
	Artifacts Artifacts
}

// RunEnv is the environment that names a run's node to its attempt,
// FLEET_RUN_ID and FLEET_NODE_ID, as the request's run_id and node_id say;
// nothing for another job.
func RunEnv(r *job.Request) []string {
	if r == nil || r.RunID == "" && r.NodeID == "" {
		return nil
	}
	return []string{"FLEET_RUN_ID=" + r.RunID, "FLEET_NODE_ID=" + r.NodeID}
}

// Reporter receives output and progress from a running attempt. Its methods
// are safe for concurrent use and never block for long: the worker bounds
// what it publishes.
type Reporter interface {
	// Log reports one line of output on "stdout" or "stderr".
	Log(stream, line string)
	// Phase reports a change of the backend's own state, such as a pod
	// moving from Pending to Running.
	Phase(phase, message string)
}

// Outcome is how an attempt ended.
type Outcome struct {
	Status   job.Status
	ExitCode *int
	// Failure is nil when the attempt succeeded.
	Failure *job.Failure
	// Outputs holds the declared outputs that were found and carried
	// inline, by name.
	Outputs map[string]string
	// Artifacts holds the declared outputs that were found and stored as
	// objects, by name.
	Artifacts map[string]job.Artifact
	// Log describes the attempt's archived log when it was truncated; the
	// worker sets it.
	Log *job.LogInfo
	// Stdout and Stderr are the tails of the attempt's output.
	Stdout, Stderr        string
	StartedAt, FinishedAt time.Time
}

// DefaultGrace is how long an attempt has to exit after SIGTERM before it
// is killed, when its executor is not told otherwise.
const DefaultGrace = 10 * time.Second

// Causes of a cancelled attempt context.
var (
	// ErrCancelled: a user cancelled the job.
	ErrCancelled = errors.New("job cancelled")
	// ErrRequeue: the worker is shutting down, stops the attempt and
	// gives the job back to its pool, uncounted.
	ErrRequeue = errors.New("worker draining: job requeued")
)

// Succeeded builds the Outcome of a successful attempt.
func Succeeded(started time.Time, outputs map[string]string) *Outcome {
	zero := 0
	return &Outcome{Status: job.StatusSucceeded, ExitCode: &zero, Outputs: outputs, StartedAt: started, FinishedAt: time.Now()}
}

// CancelledOutcome builds the Outcome of an attempt stopped because ctx ended.
func CancelledOutcome(ctx context.Context, started time.Time) *Outcome {
	msg := "cancelled"
	if c := context.Cause(ctx); c != nil {
		msg = c.Error()
	}
	return &Outcome{
		Status: job.StatusCancelled, StartedAt: started, FinishedAt: time.Now(),
		Failure: job.Failf(job.ClassCancelled, job.CodeCancelled, "%s", msg),
	}
}

// Recoverer is implemented by executors whose attempts can outlive the
// worker process (containers, Kubernetes Jobs). Recover runs once when the
// worker starts, before it pulls: it finds what an earlier process with the
// same worker id left behind and settles it, so that nothing it owned is
// left running or orphaned. The jobs themselves come back through
// JetStream redelivery.
type Recoverer interface {
	Recover(ctx context.Context, workerID string) error
}

// Cleaner is implemented by executors that leave what an ended attempt
// used in its backend (a Kubernetes Job, its pod and Secret) when Run or
// Adopt returns, so that removing it does not hold up the result. Nothing
// of it runs any more, but it is still there.
//
// The worker calls Cleanup once it has settled the attempt (published its
// result, or recorded its failure and the retry), off the attempt's path.
// It never calls it for an attempt left running (ErrLeftRunning), which runs
// on, nor when the settlement failed: the attempt is then left for whoever
// settles it next, who may need to find it ended. What a worker killed
// before Cleanup leaves behind, Recover or RecoverAdoptable removes when it
// or a peer starts: the attempt's record no longer says it runs.
type Cleaner interface {
	Cleanup(ctx context.Context, t *Task) error
}

// CapacityReader is implemented by executors that know what their backend
// can hold; the worker's heartbeat reports it.
type CapacityReader interface {
	Capacity(ctx context.Context) (*Capacity, error)
}

// Capacity is what a backend can hold. Nil totals are unknown.
type Capacity struct {
	CPUMilli    *int64
	MemoryBytes *int64
	GPUs        int
	Host        *job.Host
	Containers  *job.ContainerCounts
	// Health is job.HealthHealthy, HealthDegraded or HealthUnhealthy;
	// Reason says why when it is not healthy.
	Health string
	Reason string
}

// Supervise waits for an attempt to end by itself: exited delivers how it
// ended. When its timeout passes or ctx ends first, stop stops it (SIGTERM,
// grace, then SIGKILL), waits for exited and says how it stopped; stopped
// then says why the worker ended the attempt (ClassTimeout or
// ClassCancelled). stopped is nil when the attempt ended by itself.
func Supervise[T any](ctx context.Context, timeout time.Duration, exited <-chan T, stop func() (T, string)) (end T, stopped *job.Failure) {
	return SuperviseLeft(ctx, timeout, timeout, exited, stop)
}

// SuperviseLeft is Supervise of an attempt that has left of its timeout
// (an adopted attempt, which started before it was adopted).
func SuperviseLeft[T any](ctx context.Context, timeout, left time.Duration, exited <-chan T, stop func() (T, string)) (end T, stopped *job.Failure) {
	timer := time.NewTimer(max(left, time.Millisecond))
	defer timer.Stop()
	select {
	case end = <-exited:
		return end, nil
	case <-timer.C:
		end, how := stop()
		return end, job.Failf(job.ClassTimeout, job.CodeAttemptTimeout, "ran longer than its timeout of %s; %s", timeout, how)
	case <-ctx.Done():
		end, how := stop()
		return end, job.Failf(job.ClassCancelled, job.CodeCancelled, "%v; %s", context.Cause(ctx), how)
	}
}

// StatusOf is the status an attempt ends with when it fails with f:
// timed_out for a timeout, cancelled for a cancel, failed otherwise.
func StatusOf(f *job.Failure) job.Status {
	switch f.Class {
	case job.ClassTimeout:
		return job.StatusTimedOut
	case job.ClassCancelled:
		return job.StatusCancelled
	}
	return job.StatusFailed
}

// TenantKey is how executors keep a job's tenant in names and labels: ""
// for the default tenant, whose jobs they name as before tenants were, and
// the tenant otherwise.
func TenantKey(tenant string) string {
	if tenant == job.DefaultTenant {
		return ""
	}
	return tenant
}

// TenantsDir is the folder, in a folder of per-job folders named by job
// id, that holds the other tenants' jobs' folders, by tenant: it is not a
// valid job id, so it cannot be a job's.
const TenantsDir = "@tenants"

// JobPath is the relative path of a job's folder in a folder of per-job
// folders: <job id> for the default tenant's, @tenants/<tenant>/<job id>
// for another's.
func JobPath(tenant, jobID string) string {
	if t := TenantKey(tenant); t != "" {
		return TenantsDir + "/" + t + "/" + jobID
	}
	return jobID
}
