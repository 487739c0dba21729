package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/codes"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/internal/telemetry"
	"github.com/fleet-dev/fleet/job"
)

// settle carries out an action: the record, events, result and dead letter
// it calls for, then, for every verb but doRun and doAdopt, exactly one of
// Ack, Nak, NakWithDelay or Term. doRun and doAdopt only write that this
// worker runs the attempt (a compare-and-set: queue.ErrConflict when the
// record moved) and announce it; the attempt's end is settled later. When a
// write fails for good (the worker is stopped hard), the message is left to
// come back after the ack wait.
func (d *delivery) settle(ctx context.Context, act action) error {
	if act.verb == doRun || act.verb == doAdopt {
		return d.carryOut(ctx, act)
	}
	defer d.holdOn()()
	err := d.carryOut(ctx, act)
	if errors.Is(err, errSuperseded) {
		d.log.Warn("a later attempt took the job over; leaving it", "attempt", d.n)
		return nil
	}
	return err
}

func (d *delivery) carryOut(ctx context.Context, act action) error {
	switch act.verb {
	case doRun:
		return d.begin(ctx, act)
	case doAdopt:
		return d.takeOver(ctx, act)
	case doLater:
		if act.why != "" {
			d.log.Info("leaving the job for now", "why", act.why, "for", act.delay)
		}
		return d.msg.NakWithDelay(cmp.Or(act.delay, laterDelay))
	case doRefuse:
		return d.refuse(ctx, act.why)
	case doAck:
		return d.msg.Ack()
	case doRequeue:
		if err := d.requeue(ctx, act); err != nil {
			return err
		}
		return d.msg.Nak()
	case doRetry:
		if err := d.retry(ctx, act); err != nil {
			return err
		}
		return d.msg.NakWithDelay(act.delay)
	case doAwaitOwner:
		d.awaitOwner(ctx, act)
		return d.msg.NakWithDelay(cmp.Or(act.delay, laterDelay))
	case doLeaveRunning:
		d.leaveRunning(act)
		return d.msg.Nak()
	case doFinish, doConclude:
		res := act.result
		history := append(slices.Clone(d.rec.History), act.lost...)
		if act.verb == doFinish {
			_, endResult := telemetry.Step(ctx, "fleet.result")
			stored, err := d.w.journal.Result(ctx, d.resultOf(act.outcome, act.attempts, history))
			endResult(err)
			if err != nil {
				return err
			}
			res = stored
		}
		dead, err := d.conclude(ctx, res, history)
		if err != nil {
			return err
		}
		d.dropData(ctx)
		if dead {
			return d.msg.TermWithReason("dead-lettered: " + string(res.Failure.Class))
		}
		return d.msg.Ack()
	}
	return fmt.Errorf("no way to settle %s", act.verb)
}

// holdOn tells JetStream the job is still in hand while a settlement waits
// for NATS (a cluster electing a leader), so that it is not delivered to
// another worker meanwhile. It returns the function that stops it.
func (d *delivery) holdOn() (stop func()) {
	var mu sync.Mutex
	stopped := false
	var t *time.Timer
	t = time.AfterFunc(d.w.cfg.Progress, func() {
		_ = d.msg.InProgress()
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			t.Reset(d.w.cfg.Progress)
		}
	})
	return func() {
		mu.Lock()
		stopped = true
		mu.Unlock()
		t.Stop()
	}
}

// clone copies a record so that a write prepared on the copy changes
// nothing here until it is stored.
func clone(r *job.Record) *job.Record {
	c := *r
	c.History = slices.Clone(r.History)
	return &c
}

// claim writes the record as change makes it, with compare-and-set against
// the revision last read. The delivery's record changes only once the
// write is stored: a refused or failed write leaves it as it was, for the
// next decision.
func (d *delivery) claim(ctx context.Context, change func(*job.Record)) error {
	rec := clone(d.rec)
	change(rec)
	rev, err := d.w.journal.WriteRecord(ctx, rec, d.rev)
	if err != nil {
		return err
	}
	d.rec, d.rev = rec, rev
	return nil
}

// begin records the attempt as running before it starts: the
// compare-and-set fails if the record changed since it was read (a cancel,
// a deadline the dispatcher enforced), and then the decision is made
// again. Then it announces the attempt.
func (d *delivery) begin(ctx context.Context, act action) error {
	now := time.Now()
	first := false
	err := d.claim(ctx, func(rec *job.Record) {
		rec.History = append(rec.History, act.lost...)
		if n := len(act.lost); n > 0 {
			rec.Failure = act.lost[n-1].Failure
		}
		first = rec.StartedAt == nil
		rec.State, rec.Attempt, rec.WorkerID, rec.Backend = job.StateRunning, act.attempt, d.w.cfg.ID, d.w.cfg.Backend
		rec.NextAttemptAt, rec.UpdatedAt, rec.AwaitingSince = nil, now, nil
		if first {
			rec.StartedAt = &now
		}
	})
	if err != nil {
		return err
	}
	d.started, d.first = now, first
	if act.restart {
		// Tell watchers why the attempt they saw never ended, now that it
		// is recorded.
		zero := job.Duration(0)
		lost := act.lost[len(act.lost)-1]
		d.event(job.EventRetryScheduled, func(e *job.Event) {
			e.Attempt, e.WorkerID, e.Failure = d.n-1, lost.WorkerID, lost.Failure
			e.NextAttemptAt, e.Delay = &now, &zero
			e.Message = fmt.Sprintf("%s; attempt %d starts now", lost.Failure.Message, d.n)
		})
	}
	d.event(job.EventStarted, nil)
	return nil
}

// takeOver records that this worker follows the attempt a lost worker left
// running (the compare-and-set lets one of two workers given the job at
// once adopt it), then announces the adoption. The attempt keeps its
// number; nothing else changes.
func (d *delivery) takeOver(ctx context.Context, act action) error {
	owner := d.rec.WorkerID
	err := d.claim(ctx, func(rec *job.Record) {
		rec.WorkerID, rec.Backend, rec.UpdatedAt, rec.AwaitingSince = d.w.cfg.ID, d.w.cfg.Backend, time.Now(), nil
		rec.Adoptions++
	})
	if err != nil {
		return err
	}
	f := act.found
	d.log = d.log.With("adopted_attempt", d.n)
	d.seqBase = d.rec.Adoptions * adoptionSeqs
	d.started = cmp.Or(f.StartedAt, time.Now())
	how := "runs"
	if f.Standing == executor.Ended {
		how = "ended while no worker followed it"
	}
	d.eventSeq(job.EventHeartbeat, d.nextHeartbeat(), func(e *job.Event) {
		e.Phase = job.PhaseAdopted
		e.Message = fmt.Sprintf("attempt %d adopted by worker %s from worker %s: %s %s", d.n, d.w.cfg.ID, owner, f.Handle, how)
	})
	d.log.Info("attempt adopted", "from", owner, "handle", f.Handle, "standing", f.Standing)
	return nil
}

// retry records a failed attempt and announces the next one.
func (d *delivery) retry(ctx context.Context, act action) error {
	w, out := d.w, act.outcome
	next := time.Now().Add(act.delay)
	msg := fmt.Sprintf("attempt %d of %d failed (%s): %s; attempt %d in %s",
		d.n, d.req.Retry.MaxAttempts, out.Failure.Class, out.Failure.Message, d.n+1, act.delay.Round(time.Millisecond))
	if act.memory != "" {
		msg += fmt.Sprintf(" with memory raised from %s to %s", d.req.Resources.Memory, act.memory)
	}
	dl := job.Duration(act.delay)
	p := d.event(job.EventRetryScheduled, func(e *job.Event) {
		e.ExitCode, e.Failure, e.NextAttemptAt, e.Delay, e.Message = out.ExitCode, out.Failure, &next, &dl, msg
	})
	err := d.save(ctx, func(rec *job.Record) {
		rec.History = append(rec.History, attemptSummary(d.n, w.cfg.ID, out))
		rec.State, rec.Failure, rec.NextAttemptAt, rec.UpdatedAt = job.StateRetrying, out.Failure, &next, time.Now()
		if act.memory != "" {
			rec.MemoryOverride = act.memory
		}
	}, p)
	if err != nil {
		return err
	}
	w.m.retries.Add(ctx, 1, w.m.byClass(out.Failure.Class))
	d.log.Info("attempt failed; retry scheduled", "class", out.Failure.Class, "delay", act.delay)
	return nil
}

// resultOf builds the job's result from the outcome of its last attempt.
func (d *delivery) resultOf(out *executor.Outcome, attempts int, history []job.Attempt) *job.Result {
	w, rec := d.w, d.rec
	if out.FinishedAt.IsZero() {
		out.FinishedAt = time.Now()
	}
	res := &job.Result{
		JobID: d.id, Pool: w.cfg.Pool, Status: out.Status, Attempts: attempts, ExitCode: out.ExitCode,
		Outputs: out.Outputs, Artifacts: out.Artifacts, Log: out.Log, Stdout: out.Stdout, Stderr: out.Stderr, FinishedAt: out.FinishedAt,
		Failure: out.Failure, TraceID: d.traceIDOr(), RunID: d.req.RunID, NodeID: d.req.NodeID,
		History: history,
	}
	if !out.StartedAt.IsZero() {
		res.StartedAt = &out.StartedAt
		res.WorkerID, res.Backend = w.cfg.ID, w.cfg.Backend
	}
	if res.TraceID == "" {
		res.TraceID = rec.TraceID
	}
	return res
}

// conclude announces a stored result: a dead letter when the job failed,
// the final event and the final record. Every step is idempotent, so a
// delivery that finds a result published by an earlier one concludes it
// the same way. It reports whether the job was dead-lettered.
func (d *delivery) conclude(ctx context.Context, res *job.Result, history []job.Attempt) (dead bool, err error) {
	w := d.w
	// The final event is always a job's last, so that watchers can stop
	// there: the dead letter is announced before it.
	var pubs []pending
	dead = res.Status == job.StatusFailed || res.Status == job.StatusTimedOut
	if dead {
		pubs = d.deadLetter(res.Failure, res.Attempts)
	}
	pubs = append(pubs, d.event(res.Status.EventType(), func(e *job.Event) {
		e.Attempt, e.ExitCode, e.Failure = res.Attempts, res.ExitCode, res.Failure
		if res.WorkerID != "" {
			e.WorkerID = res.WorkerID
		}
		if res.Failure != nil {
			e.Message = res.Failure.Message
		}
	}))
	now := time.Now()
	err = d.save(ctx, func(rec *job.Record) {
		rec.History = history
		rec.State, rec.Attempt, rec.Failure, rec.UpdatedAt, rec.NextAttemptAt = job.State(res.Status), res.Attempts, res.Failure, now, nil
		rec.FinishedAt, rec.ExitCode = &res.FinishedAt, res.ExitCode
	}, pubs...)
	if err != nil {
		return false, err
	}
	w.m.finished.Add(ctx, 1, w.m.byStatus(res.Status))
	if res.Status != job.StatusSucceeded && d.span != nil {
		d.span.SetStatus(codes.Error, string(res.Status))
	}
	d.log.Info("job finished", "status", res.Status, "attempts", res.Attempts)
	return dead, nil
}

// requeue records that the job returns to the pool without this delivery
// counting as an attempt: if the record says this worker runs the
// delivery's attempt, it did not happen.
func (d *delivery) requeue(ctx context.Context, act action) error {
	p := d.event(job.EventQueued, func(e *job.Event) { e.Message = "handed back by worker " + d.w.cfg.ID + ": " + act.why })
	err := d.save(ctx, func(rec *job.Record) {
		rec.Handbacks++
		if rec.State == job.StateRunning && rec.WorkerID == d.w.cfg.ID && rec.Attempt == d.n {
			rec.State, rec.Attempt = job.StateQueued, d.n-1
			if d.n == 1 {
				rec.StartedAt = nil
			}
		}
		rec.UpdatedAt = time.Now()
	}, p)
	if err != nil {
		return err
	}
	d.log.Info("job requeued", "why", act.why)
	return nil
}

// refuse terminates a job message that is not a valid request. Only the
// dispatcher publishes jobs, so this means someone published to the jobs
// subject directly; if the message names a usable id, its producer gets a
// failed result saying why.
func (d *delivery) refuse(ctx context.Context, why string) error {
	d.log.Warn("refusing malformed job message", "subject", d.msg.Subject(), "err", why)
	id := d.msg.Headers().Get(queue.HeaderMsgID)
	if job.ValidID(id) {
		now := time.Now()
		res := &job.Result{JobID: id, Pool: d.w.cfg.Pool, Status: job.StatusFailed, FinishedAt: now,
			Failure: job.Failf(job.ClassRejected, job.CodeInvalid, "%s", why)}
		if _, err := d.w.journal.Result(ctx, res); err != nil {
			d.log.Warn("the result of a malformed job message was not published", "err", err)
		}
	}
	return d.msg.TermWithReason("malformed request")
}

// save writes the record as change makes it, with compare-and-set, then
// waits for the publications, publishing again what was not stored. On a
// conflict (a cancel changed the record) it reads the record again, stops
// the attempt if a cancel came, and applies change to what it read. Lost
// answers are tried again until the worker gives up for good (see
// Worker.Stop).
func (d *delivery) save(ctx context.Context, change func(*job.Record), pubs ...pending) error {
	j := d.w.journal
	for {
		err := d.claim(ctx, change)
		if err == nil {
			break
		}
		if !errors.Is(err, queue.ErrConflict) {
			return err
		}
		cur, rev, err := j.Record(ctx, d.id)
		if err != nil {
			return err
		}
		if cur.Attempt > d.n || (cur.Attempt == d.n && cur.State == job.StateRunning && cur.WorkerID != d.w.cfg.ID) {
			// Another delivery took the job over (this one was given up for
			// lost, or another worker adopted its attempt): the job and its
			// message are that one's now.
			return errSuperseded
		}
		if cur.CancelRequested && !d.rec.CancelRequested {
			d.cancel(executor.ErrCancelled)
		}
		mine := clone(d.rec)
		change(mine)
		d.rec, d.rev = cur, rev
		if cur.State.Final() && !mine.State.Final() {
			// The dispatcher finished it (a cancel while queued).
			d.cancel(executor.ErrCancelled)
			return nil
		}
	}
	for _, p := range pubs {
		if p == nil {
			continue
		}
		if err := p.Wait(ctx); err != nil {
			return err
		}
	}
	return nil
}
