package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fleet-dev/fleet/internal/capacity"
	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// Adoption: an attempt that outlives the worker that started it (a
// Kubernetes Job, a Docker container) is taken over by the worker that
// gets the job's message next, when the executor can reach it, instead of
// being run again. decide says when (doAdopt); this file carries it out.

// lookup asks the executor where the backend's attempt of an orphan stands,
// when decide needs to know (see situation.needsLookup).
func (a *attempt) lookup(ctx context.Context, s *situation) error {
	ad, ok := a.w.exec.(executor.Adopter)
	if !ok || !s.needsLookup() {
		return nil
	}
	q := executor.Query{JobID: a.id, Attempt: s.rec.Attempt, Owner: s.rec.WorkerID, Self: a.w.cfg.ID}
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
func (a *attempt) preferPeer(ctx context.Context, s *situation) {
	c, ok := a.w.exec.(executor.ImageCache)
	p, peers := a.w.cfg.Capacity.(capacity.Peers)
	if !ok || !peers || a.delivered != 1 || s.outcome != nil || s.rec.State != job.StateQueued || a.req.Image == "" ||
		a.req.PullPolicy != job.PullIfNotPresent || s.misfit != nil || s.refused != nil {
		return
	}
	if !c.Cached(ctx, a.req.Image) && p.PeerHasImage(ctx, a.req.Image) {
		s.elsewhere = "another worker of the pool has image " + a.req.Image + " cached; this one would pull it"
	}
}

// adopt takes over the attempt that act names, follows it to its end and
// settles its outcome. The attempt keeps its number: the record names this
// worker instead of the one that started it, and nothing else changes.
func (a *attempt) adopt(ctx context.Context, act action) error {
	w, req := a.w, a.req
	ad := w.exec.(executor.Adopter) // decide adopts only with an Adopter
	a.n = act.attempt
	a.log = a.log.With("adopted_attempt", a.n)
	if a.rec.MemoryOverride != "" {
		req.Resources.Memory = a.rec.MemoryOverride
	}
	if c := w.cfg.Capacity; c != nil {
		res := capacity.Lease{JobID: a.id, Attempt: a.n, CPUMilli: req.Resources.CPUMilli(), MemoryBytes: req.Resources.MemoryBytes(),
			GPUs: req.Resources.GPU, StartedAt: time.Now(), Handle: a.msg.Reply()}
		if act.found.StartedAt.After(time.Time{}) {
			res.StartedAt = act.found.StartedAt
		}
		switch err := c.Reserve(ctx, res); {
		case errors.Is(err, capacity.ErrNoCapacity):
			// The attempt runs on regardless; a worker with room adopts it.
			return a.settle(ctx, action{verb: doLater, attempt: a.n, why: "no capacity on this worker to adopt the attempt: " + err.Error()})
		case err != nil:
			a.log.Warn("capacity reservation failed; adopting on local accounting", "err", err)
		}
		a.releaseLease = sync.OnceFunc(func() {
			if err := c.Release(context.WithoutCancel(ctx), res); err != nil {
				a.log.Warn("capacity release failed", "err", err)
			}
		})
	}

	// The record names this worker before anything else: two workers given
	// the job at once cannot both adopt it, the compare-and-set lets one.
	owner := a.rec.WorkerID
	for {
		err := a.takeOver(ctx)
		if err == nil {
			break
		}
		if !errors.Is(err, queue.ErrConflict) {
			_ = a.settle(ctx, action{verb: doLater})
			return err
		}
		if err := a.refresh(ctx); err != nil {
			_ = a.settle(ctx, action{verb: doLater})
			return err
		}
		next, err := a.decide(ctx, a.situation())
		if err != nil {
			_ = a.settle(ctx, action{verb: doLater})
			return err
		}
		if next.verb != doAdopt || next.attempt != a.n {
			// The record moved on (a cancel finished it, another worker
			// adopted it): decide again at the next delivery.
			a.freeSlot()
			return a.settle(ctx, action{verb: doLater, attempt: a.n, why: "the job's record changed while adopting"})
		}
		owner, act = a.rec.WorkerID, next
	}
	a.seqBase = a.rec.Adoptions * adoptionSeqs
	f := act.found
	how := "runs"
	if f.Standing == executor.Ended {
		how = "ended while no worker followed it"
	}
	a.eventSeq(job.EventHeartbeat, a.nextHeartbeat(), func(e *job.Event) {
		e.Phase = job.PhaseAdopted
		e.Message = fmt.Sprintf("attempt %d adopted by worker %s from worker %s: %s %s", a.n, w.cfg.ID, owner, f.Handle, how)
	})
	w.m.adopted.Add(ctx, 1, w.m.poolAttrs)
	a.log.Info("attempt adopted", "from", owner, "handle", f.Handle, "standing", f.Standing)

	if a.rec.CancelRequested {
		a.cancel(executor.ErrCancelled)
	}
	started := f.StartedAt
	if started.IsZero() {
		started = time.Now()
	}
	a.started = started
	deadlineBound := false
	if d := req.Deadline; d != nil && !a.sub.IsZero() {
		// The executor counts the timeout from the attempt's start.
		if left := a.sub.Add(d.Std()).Sub(started); left < req.Timeout.Std() {
			bounded := job.Duration(max(left, time.Millisecond))
			req.Timeout, deadlineBound = &bounded, true
		}
	}
	stopProgress := a.progress()
	out, err := ad.Adopt(a.ctx, &executor.Task{JobID: a.id, Attempt: a.n, WorkerID: w.cfg.ID, Pool: w.cfg.Pool, Request: req, Report: a}, f)
	stopProgress()
	a.freeSlot()
	if out != nil && out.StartedAt.IsZero() {
		out.StartedAt = started
	}
	return a.ended(ctx, out, err, deadlineBound)
}

// adoptionSeqs numbers apart the events of each life of an attempt: the
// heartbeat and log events of the n-th adoption start at n times it.
const adoptionSeqs = 1_000_000

// takeOver writes the record of an adopted attempt: this worker runs it.
func (a *attempt) takeOver(ctx context.Context) error {
	prev := *a.rec
	rec := a.rec
	rec.WorkerID, rec.Backend, rec.UpdatedAt, rec.AwaitingSince = a.w.cfg.ID, a.w.cfg.Backend, time.Now(), nil
	rec.Adoptions++
	rev, err := a.w.store.Update(ctx, rec, a.rev)
	if err != nil {
		*a.rec = prev
		return err
	}
	a.rev = rev
	return nil
}

// await notes, the first time, that the job waits for the worker that
// started its attempt; the message comes back after the action's delay.
// A record that cannot be written is left: the next delivery tries again.
func (a *attempt) await(ctx context.Context, act action) {
	a.log.Info("waiting for the worker that runs the attempt", "why", act.why, "for", act.delay)
	if a.rec.AwaitingSince != nil {
		return
	}
	now := time.Now()
	rec := *a.rec
	rec.AwaitingSince, rec.UpdatedAt = &now, now
	rev, err := a.w.store.Update(ctx, &rec, a.rev)
	if err != nil {
		a.log.Warn("could not note the wait for the attempt's worker", "err", err)
		return
	}
	*a.rec, a.rev = rec, rev
	// Announced once per life of the attempt (the record keeps the wait):
	// the last number of the life's range is the announcement's.
	seq := (rec.Adoptions+1)*adoptionSeqs - 1
	a.eventSeq(job.EventHeartbeat, seq, func(e *job.Event) {
		e.Attempt, e.WorkerID, e.Phase, e.Message = act.attempt, rec.WorkerID, job.PhaseAwaitingOwner, act.why
	})
}

// handOff announces that this worker left its attempt running for another
// to adopt.
func (a *attempt) handOff(act action) {
	w := a.w
	w.m.handedOff.Add(context.Background(), 1, w.m.poolAttrs)
	a.eventSeq(job.EventHeartbeat, a.nextHeartbeat(), func(e *job.Event) {
		e.Phase = job.PhaseHandedOff
		e.Message = fmt.Sprintf("worker %s stopped; attempt %d runs on, for the next worker to adopt", w.cfg.ID, a.n)
	})
	a.log.Info("attempt handed off", "why", act.why)
}

// adoptable reports, for Recover at start, whether an attempt that an
// earlier life of this worker left may still be adopted: its job's record
// says that attempt runs, and no cancel ended it. When the record cannot be
// read, the attempt is kept: removing it could lose hours of work, and
// whoever gets its message settles it.
func (w *Worker) adoptable(ctx context.Context) func(jobID string, attempt int) bool {
	return func(jobID string, attempt int) bool {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		rec, _, err := w.store.Get(rctx, jobID)
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
