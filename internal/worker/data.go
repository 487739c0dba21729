package worker

import (
	"cmp"
	"context"
	"errors"
	"time"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// A job that asks for it (persist) has a data directory that every attempt
// sees. It goes when the job ends for good: the worker that settles the job
// removes it at once, and every worker sweeps its backend now and then for
// those of jobs that ended elsewhere (cancelled while queued or waiting for
// a retry, settled by a worker of another host), or that outlived the
// retention.

// Defaults of Config.
const (
	// DefaultDataSweep is how often a worker looks for data directories of
	// jobs that ended.
	DefaultDataSweep = 10 * time.Minute
	// DefaultDataRetention is how long a data directory may live, whatever
	// its job's state: the jobs bucket's own retention.
	DefaultDataRetention = 7 * 24 * time.Hour
)

// dropData removes the data directory of a job that has ended.
func (d *delivery) dropData(ctx context.Context) {
	k, ok := d.w.exec.(executor.DataKeeper)
	if !ok || d.req == nil || !d.req.Persists() {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := k.RemoveData(ctx, executor.TenantKey(d.key.Tenant), d.id); err != nil {
		d.log().Warn("could not remove the job's data directory; the next sweep will", "err", err)
	}
}

// sweepOnce removes the data directories of jobs that have ended, have no
// record any more, or are older than DataRetention; the worker runs it
// every DataSweep.
func (w *Worker) sweepOnce(ctx context.Context, k executor.DataKeeper) {
	dirs, err := k.Data(ctx)
	if err != nil {
		if ctx.Err() == nil {
			w.log.Warn("cannot list the jobs' data directories", "err", err)
		}
		return
	}
	for _, d := range dirs {
		if ctx.Err() != nil {
			return
		}
		why := ""
		rec, _, err := w.journal.Record(ctx, queue.JobKey{Tenant: cmp.Or(d.Tenant, job.DefaultTenant), Pool: w.cfg.Pool, ID: d.JobID})
		switch {
		case errors.Is(err, queue.ErrNotFound):
			why = "the job has no record"
		case err != nil:
			continue // ask again at the next sweep
		case rec.State.Final():
			why = "the job ended " + string(rec.State)
		case !d.Created.IsZero() && time.Since(d.Created) > w.cfg.DataRetention:
			why = "older than the retention of " + w.cfg.DataRetention.String()
		default:
			continue
		}
		if err := k.RemoveData(ctx, d.Tenant, d.JobID); err != nil {
			w.log.Warn("could not remove a job's data directory", "job_id", d.JobID, "err", err)
			continue
		}
		w.log.Info("removed a job's data directory", "job_id", d.JobID, "why", why)
	}
}
