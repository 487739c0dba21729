package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fleet-dev/fleet/internal/capacity"
	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// Adoption: an attempt that outlives the worker that started it (a
// Kubernetes Job, a Docker container) is taken over by the worker that
// gets the job's message next, when the executor can reach it, instead of
// being run again. decide says when (doAdopt); the delivery's pipeline
// (delivery.attempt) follows it as it follows an attempt it runs; settle
// writes the take-over (takeOver). This file asks the executor where an
// attempt stands, and carries out the waits and hand-offs around it.

// lookup asks the executor where the backend's attempt of an orphan stands,
// when decide needs to know (see situation.needsLookup).
func (d *delivery) lookup(ctx context.Context, s *situation) error {
	ad, ok := d.w.exec.(executor.Adopter)
	if !ok || !s.needsLookup() {
		return nil
	}
	q := executor.Query{JobID: d.id, Attempt: s.rec.Attempt, Owner: s.rec.WorkerID, Self: d.w.cfg.ID}
	f, err := ad.Find(ctx, q)
	if err != nil {
		// Nobody can tell whether it still runs: counting it lost could
		// run the job twice at once. Look again later.
		return fmt.Errorf("find attempt %d of worker %s: %w", q.Attempt, q.Owner, err)
	}
	s.found = f
	return nil
}

// preferPeer tells decide, for the first delivery of a job whose image this
// worker would pull, whether another live worker of the pool has it cached:
// the job is left a moment for that one. Once only: at its next delivery,
// any worker pulls.
func (d *delivery) preferPeer(ctx context.Context, s *situation) {
	c, ok := d.w.exec.(executor.ImageCache)
	p, peers := d.w.cfg.Capacity.(capacity.Peers)
	if !ok || !peers || d.delivered != 1 || s.outcome != nil || s.rec.State != job.StateQueued || d.req.Image == "" ||
		d.req.PullPolicy != job.PullIfNotPresent || s.misfit != nil || s.refused != nil {
		return
	}
	if !c.Cached(ctx, d.req.Image) && p.PeerHasImage(ctx, d.req.Image) {
		s.elsewhere = "another worker of the pool has image " + d.req.Image + " cached; this one would pull it"
	}
}

// awaitOwner notes, the first time, that the job waits for the worker that
// started its attempt; the message comes back after the action's delay.
// A record that cannot be written is left: the next delivery tries again.
func (d *delivery) awaitOwner(ctx context.Context, act action) {
	d.log().Info("waiting for the worker that runs the attempt", "why", act.why, "for", act.delay)
	if d.rec.AwaitingSince != nil {
		return
	}
	now := time.Now()
	err := d.claim(ctx, act.rev, func(rec *job.Record) {
		rec.AwaitingSince, rec.UpdatedAt = &now, now
		rec.Event, rec.Phase, rec.Message = job.EventHeartbeat, job.PhaseAwaitingOwner, act.why
	})
	if err != nil {
		d.log().Warn("could not note the wait for the attempt's worker", "err", err)
	}
}

// leaveRunning announces that this worker left its attempt running for
// another to adopt.
func (d *delivery) leaveRunning(act action) {
	w := d.w
	w.m.handedOff.Add(context.Background(), 1, w.m.poolAttrs)
	d.notice(job.EventHeartbeat, func(e *job.Event) {
		e.Phase = job.PhaseHandedOff
		e.Message = fmt.Sprintf("worker %s stopped; attempt %d runs on, for the next worker to adopt", w.cfg.ID, d.n)
	})
	d.log().Info("attempt left running for adoption", "why", act.why)
}

// adoptable reports, for Recover at start, whether an attempt that an
// earlier life of this worker left may still be adopted: its job's record
// says that attempt runs, and no cancel ended it. When the record cannot be
// read, the attempt is kept: removing it could lose hours of work, and
// whoever gets its message settles it.
func (w *Worker) adoptable(ctx context.Context) func(tenant, jobID string, attempt int) bool {
	return func(tenant, jobID string, attempt int) bool {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		rec, _, err := w.journal.Record(rctx, queue.JobKey{Tenant: cmp.Or(tenant, job.DefaultTenant), Pool: w.cfg.Pool, ID: jobID})
		switch {
		case errors.Is(err, queue.ErrNotFound):
			return false
		case err != nil:
			w.log.Warn("cannot read the record of a job left running; keeping its attempt", "job_id", jobID, "attempt", attempt, "err", err)
			return true
		}
		return rec.State == job.StateRunning && rec.Attempt == attempt && !rec.CancelRequested
	}
}
