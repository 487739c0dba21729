package worker

import (
	"context"

	"github.com/fleet-dev/fleet/internal/artifact"
	"github.com/fleet-dev/fleet/internal/executor"
)

// An attempt's files in the object store: the worker hands the executor
// what fetches its inputs by reference and stores its large or binary
// outputs (both while its workspace exists), and archives every line the
// executor reports (see Log) into the attempt's log, which it closes once
// the executor is done, before the attempt settles: the log is whole when
// the result is published.

// openArtifacts prepares the attempt's files; nil when the worker has no
// object store.
func (d *delivery) openArtifacts() executor.Artifacts {
	w := d.w
	if w.cfg.Artifacts == nil {
		return nil
	}
	lim := w.cfg.ArtifactLimits
	if lim.MaxInputBytes == 0 {
		lim.MaxInputBytes = w.cfg.Limits.MaxInputRefBytes
	}
	// The attempt's files are its pool's (the worker's bucket) and named
	// by its tenant: its outputs and log go to outputs/<tenant>/... and
	// logs/<tenant>/..., its inputs are its tenant's only.
	d.arts = w.cfg.Artifacts.Attempt(d.id, d.n, d.req, artifact.AttemptOptions{Tenant: d.key.Tenant, Pool: d.key.Pool,
		Limits: lim, LogContext: w.scope.settle,
		// A job handed back runs again under the same attempt number.
		Rerun: d.rec.Handbacks > 0})
	return d.arts
}

// closeArtifacts completes the attempt's log, and notes in out when it was
// truncated; a log that cannot be stored whole is a warning, not the
// job's failure. The log of an attempt requeued is dropped: the
// attempt runs again under its number.
func (d *delivery) closeArtifacts(ctx context.Context, out *executor.Outcome, requeued bool) {
	if d.arts == nil {
		return
	}
	if requeued {
		if err := d.arts.AbortLog(ctx); err != nil {
			d.log().Warn("the log of the handed-back attempt was not dropped", "err", err)
		}
		return
	}
	info, err := d.arts.CloseLog(ctx)
	if err != nil {
		d.log().Warn("the attempt's log was not stored whole", "err", err)
	}
	if out != nil {
		out.Log = info
	}
}
