package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
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
		d.log().Warn("a later attempt took the job over; leaving it", "attempt", d.n)
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
			d.log().Info("leaving the job for now", "why", act.why, "for", act.delay)
		}
		return d.msg.NakWithDelay(cmp.Or(act.delay, laterDelay))
	case doRefuse:
		return d.refuse(ctx, act.why)
	case doAck:
		// A copy of a job that ended: a run's node's end is said again,
		// should the delivery that ended it have died before it did.
		if err := d.announce(ctx, d.rec); err != nil {
			return err
		}
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
	case doFinish:
		history := append(slices.Clone(d.rec.History), act.lost...)
		res := d.resultOf(act.outcome, act.attempts, history)
		dead, acked, err := d.finish(ctx, act.rev, res)
		if acked {
			return nil
		}
		if errors.Is(err, errFinished) {
			// Another delivery, or a cancel, finished it first: that
			// result stands (and, for a run's node, its end is said).
			if _, _, _, node := job.ParseRunJobID(d.id); node {
				if rec, _, err := d.w.journal.Record(ctx, d.key); err == nil {
					if err := d.announce(ctx, rec); err != nil {
						return err
					}
				}
			}
			return d.msg.Ack()
		}
		if err != nil {
			return err
		}
		if err := d.announce(ctx, d.rec); err != nil {
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

// errFinished: the job's record was finished by another delivery or a
// cancel while this one settled; its result stands.
var errFinished = errors.New("the job was finished meanwhile")

// clone starts the next version of a record, on a copy, so that a write
// prepared on it changes nothing here until it is stored. What only one
// version says (its event and message; the request, the result) does not
// carry over.
func clone(r *job.Record) *job.Record {
	c := r.Version()
	c.Event = ""
	return c
}

// next starts the record's next version (see clone). While the attempt's
// running version is held back (unrecorded), d.rec is that version, not
// stored, and the next one records the attempt's start too.
func (d *delivery) next() *job.Record {
	c := clone(d.rec)
	c.AttemptStarted = d.unrecorded
	return c
}

// claim writes the record as change makes it, with compare-and-set against
// revision rev, the one its decision was made on; queue.ErrConflict, with
// nothing sent, when this delivery holds a later version than that (the
// decision was made on an older copy). The delivery's record changes only
// once the write is stored: a refused or failed write leaves it as it was,
// for the next decision.
func (d *delivery) claim(ctx context.Context, rev uint64, change func(*job.Record)) error {
	if rev != d.rev {
		return fmt.Errorf("%w: decided on version %d of the record, which is at %d", queue.ErrConflict, rev, d.rev)
	}
	rec := d.next()
	change(rec)
	rev, err := d.w.journal.WriteRecord(ctx, rec, d.rev)
	if err != nil {
		return err
	}
	d.rec, d.rev, d.unrecorded = rec, rev, false
	return nil
}

// begin records the attempt as running before it starts: the
// compare-and-set fails if the record changed since it was read (a cancel,
// a deadline the dispatcher enforced), and then the decision is made
// again. Then it announces the attempt.
//
// With the worker's RunningAfter, the running version of a job's first
// delivery is made here and held back: the attempt starts at once, and
// its clock (see clock) stores that version once the attempt has run
// RunningAfter; an attempt that ends sooner writes no running version,
// and the version that ends it records its start (AttemptStarted). Its
// compare-and-set is then the held-back version's: against the version
// the decision was made on. A delivery after the first records the
// attempt before it starts, as an adoption does: its first delivery may
// have died in that moment (a job that kills its worker at once is then
// counted lost from its second delivery on, up to max_lost).
func (d *delivery) begin(ctx context.Context, act action) error {
	now := time.Now()
	first := false
	if d.w.runningAfter() > 0 && d.delivered == 1 {
		if act.rev != d.rev {
			return fmt.Errorf("%w: decided on version %d of the record, which is at %d", queue.ErrConflict, act.rev, d.rev)
		}
		rec := d.next()
		first = d.running(rec, act, now)
		d.rec, d.unrecorded = rec, true
		d.started, d.first = now, first
		return nil
	}
	err := d.claim(ctx, act.rev, func(rec *job.Record) { first = d.running(rec, act, now) })
	if err != nil {
		return err
	}
	d.started, d.first = now, first
	return nil
}

// running makes rec the version that says this worker runs attempt
// act.attempt since now, and reports whether it is the job's first.
func (d *delivery) running(rec *job.Record, act action, now time.Time) (first bool) {
	rec.History = append(rec.History, act.lost...)
	if n := len(act.lost); n > 0 {
		rec.Failure = act.lost[n-1].Failure
	}
	rec.Event = job.EventStarted
	if act.restart {
		// Watchers learn why the attempt they saw never ended.
		lost := act.lost[len(act.lost)-1]
		rec.Message = fmt.Sprintf("%s; attempt %d starts now", lost.Failure.Message, act.attempt)
	}
	rec.State, rec.Attempt, rec.WorkerID, rec.Backend = job.StateRunning, act.attempt, d.w.cfg.ID, d.w.cfg.Backend
	rec.NextAttemptAt, rec.UpdatedAt, rec.AwaitingSince = nil, now, nil
	if rec.StartedAt == nil {
		rec.StartedAt = &now
		return true
	}
	return false
}

// takeOver records that this worker follows the attempt a lost worker left
// running (the compare-and-set lets one of two workers given the job at
// once adopt it), then announces the adoption. The attempt keeps its
// number; nothing else changes.
func (d *delivery) takeOver(ctx context.Context, act action) error {
	owner, f := d.rec.WorkerID, act.found
	how := "runs"
	if f.Standing == executor.Ended {
		how = "ended while no worker followed it"
	}
	err := d.claim(ctx, act.rev, func(rec *job.Record) {
		rec.WorkerID, rec.Backend, rec.UpdatedAt, rec.AwaitingSince = d.w.cfg.ID, d.w.cfg.Backend, time.Now(), nil
		rec.Adoptions++
		rec.Event, rec.Phase = job.EventHeartbeat, job.PhaseAdopted
		rec.Message = fmt.Sprintf("attempt %d adopted by worker %s from worker %s: %s %s", d.n, d.w.cfg.ID, owner, f.Handle, how)
	})
	if err != nil {
		return err
	}
	d.logAdopted = d.n
	d.started = cmp.Or(f.StartedAt, time.Now())
	d.log().Info("attempt adopted", "from", owner, "handle", f.Handle, "standing", f.Standing)
	return nil
}

// retry records a failed attempt and announces the next one.
func (d *delivery) retry(ctx context.Context, act action) error {
	w, out := d.w, act.outcome
	now := time.Now()
	next := now.Add(act.delay)
	msg := fmt.Sprintf("attempt %d of %d failed (%s): %s; attempt %d in %s",
		d.n, d.req.Retry.MaxAttempts, out.Failure.Class, out.Failure.Message, d.n+1, act.delay.Round(time.Millisecond))
	if act.memory != "" {
		msg += fmt.Sprintf(" with memory raised from %s to %s", d.req.Resources.Memory, act.memory)
	}
	err := d.save(ctx, act.rev, func(rec *job.Record) {
		rec.History = append(rec.History, attemptSummary(d.n, w.cfg.ID, out))
		rec.State, rec.Failure, rec.NextAttemptAt, rec.UpdatedAt = job.StateRetrying, out.Failure, &next, now
		rec.Event, rec.Message, rec.ExitCode = job.EventRetryScheduled, msg, out.ExitCode
		if act.memory != "" {
			rec.MemoryOverride = act.memory
		}
	})
	if err != nil {
		return err
	}
	w.m.retries.Add(ctx, 1, w.m.byClass(out.Failure.Class))
	d.log().Info("attempt failed; retry scheduled", "class", out.Failure.Class, "delay", act.delay)
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

// finish writes the job's final record, which carries its one result,
// after the dead letter of a job that failed (the final version is always
// a job's last, so that watchers can stop there). It reports whether the
// job was dead-lettered, and whether its message was acknowledged too
// (by the completer); errFinished when another delivery or a cancel
// finished it first.
//
// The final version of a job that was not dead-lettered, and keeps no
// data directory, goes through the completer with others; what the
// completer does not know stored, save writes, the same version to the
// byte (its time is taken once), so that a write whose answer was lost is
// known for this one's.
func (d *delivery) finish(ctx context.Context, rev uint64, res *job.Result) (dead, acked bool, err error) {
	w := d.w
	var dlq pending
	dead = res.Status == job.StatusFailed || res.Status == job.StatusTimedOut
	if dead {
		dlq = d.deadLetter(res.Failure, res.Attempts)
	}
	_, endResult := telemetry.Step(ctx, "fleet.result")
	now := time.Now()
	final := func(rec *job.Record) {
		rec.History = res.History
		rec.State, rec.Attempt, rec.Failure, rec.UpdatedAt, rec.NextAttemptAt = job.State(res.Status), res.Attempts, res.Failure, now, nil
		rec.FinishedAt, rec.ExitCode = &res.FinishedAt, res.ExitCode
		rec.Event, rec.Result = res.Status.EventType(), res
		if res.WorkerID != "" {
			rec.WorkerID = res.WorkerID
		}
		if res.Failure != nil {
			rec.Message = res.Failure.Message
		}
		rec.DeadLettered = dead
	}
	var refused error
	// (A run's node's final version is written alone: its end is said
	// once it is stored, before its message is acknowledged.)
	if !dead && w.completer != nil && d.req != nil && !d.req.Persists() && d.req.RunID == "" && rev == d.rev {
		rec := d.next()
		final(rec)
		var stored uint64
		stored, refused = w.completer.complete(finalVersion{msg: d.msg, rec: rec, rev: rev, log: d.log})
		if acked = stored != 0; acked {
			d.rec, d.rev = rec, stored
		}
	}
	if !acked {
		err = d.saveAfter(ctx, rev, final, refused, dlq)
	}
	endResult(err)
	if err != nil {
		return false, false, err
	}
	w.m.finished.Add(ctx, 1, w.m.byStatus(res.Status))
	if res.Status != job.StatusSucceeded && d.span != nil {
		d.span.SetStatus(codes.Error, string(res.Status))
	}
	d.logFinished(res)
	return dead, acked, nil
}

// announce says, for a run's node whose job's final version rec is
// stored, that its job ended, and waits until that is stored too: what
// takes the nodes after it on (see package runs). Nothing for another
// job.
func (d *delivery) announce(ctx context.Context, rec *job.Record) error {
	e, ok := job.EndOf(rec)
	if !ok {
		return nil
	}
	p, err := d.w.journal.NodeEnded(d.key.Tenant, e)
	if err == nil {
		err = p.Wait(ctx)
	}
	if err != nil {
		return fmt.Errorf("say that node %s of run %s ended: %w", e.NodeID, e.RunID, err)
	}
	return nil
}

// logFinished logs the end of the job: at Info when it did not succeed,
// at Debug when it did (a line per job is a cost per job; what an
// operator must see, a failure, is at Info). The line's attributes are
// built only when it is written.
func (d *delivery) logFinished(res *job.Result) {
	level := slog.LevelInfo
	if res.Status == job.StatusSucceeded {
		level = slog.LevelDebug
	}
	ctx := context.Background()
	if !d.w.log.Enabled(ctx, level) {
		return
	}
	args := append(d.logAttrs(make([]any, 0, 14)), "status", res.Status, "attempts", res.Attempts)
	d.w.log.Log(ctx, level, "job finished", args...)
}

// requeue records that the job returns to the pool without this delivery
// counting as an attempt: if the record says this worker runs the
// delivery's attempt, it did not happen.
func (d *delivery) requeue(ctx context.Context, act action) error {
	err := d.save(ctx, act.rev, func(rec *job.Record) {
		rec.Event, rec.Message = job.EventQueued, "requeued by worker "+d.w.cfg.ID+": "+act.why
		rec.Handbacks++
		if rec.State == job.StateRunning && rec.WorkerID == d.w.cfg.ID && rec.Attempt == d.n {
			// (A start held back did not happen either.)
			rec.State, rec.Attempt, rec.AttemptStarted = job.StateQueued, d.n-1, false
			if d.n == 1 {
				rec.StartedAt = nil
			}
		}
		rec.UpdatedAt = time.Now()
	})
	if err != nil {
		return err
	}
	d.log().Info("job requeued", "why", act.why)
	return nil
}

// refuse terminates a job message that is not a valid request. Only the
// dispatcher publishes jobs, so this means someone published to the jobs
// subject directly; if the message names a usable id, its producer gets a
// failed result saying why.
func (d *delivery) refuse(ctx context.Context, why string) error {
	d.log().Warn("refusing malformed job message", "subject", d.msg.Subject(), "err", why)
	_, k, ok := d.w.names.ParsePoolJob(d.msg.Subject())
	meta, err := d.msg.Metadata()
	if ok && err == nil && k.Pool == d.w.cfg.Pool && job.ValidID(k.ID) && job.ValidTenant(k.Tenant) {
		// The job's producer learns why, if the message was the job's
		// first record version and nothing came after it.
		now := time.Now()
		f := job.Failf(job.ClassRejected, job.CodeInvalid, "%s", why)
		rec := &job.Record{ID: k.ID, Tenant: k.Tenant, Pool: k.Pool, State: job.StateFailed, Event: job.EventFailed,
			SubmittedAt: now, UpdatedAt: now, FinishedAt: &now, Failure: f, Message: why,
			Result: &job.Result{JobID: k.ID, Pool: k.Pool, Status: job.StatusFailed, FinishedAt: now, Failure: f}}
		if _, err := d.w.journal.WriteRecord(ctx, rec, meta.Sequence.Stream); err != nil {
			d.log().Warn("the result of a malformed job message was not written", "err", err)
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
func (d *delivery) save(ctx context.Context, rev uint64, change func(*job.Record), pubs ...pending) error {
	return d.saveAfter(ctx, rev, change, nil, pubs...)
}

// saveAfter is save when the first write was refused already, with
// refused (queue.ErrConflict or queue.ErrFinal; nil: it was not).
func (d *delivery) saveAfter(ctx context.Context, rev uint64, change func(*job.Record), refused error, pubs ...pending) error {
	j := d.w.journal
	for {
		err := refused
		refused = nil
		if err == nil {
			err = d.claim(ctx, rev, change)
		}
		if err == nil {
			break
		}
		if errors.Is(err, queue.ErrFinal) {
			// The stream holds a final version of the job already, which
			// stands: it refuses a second whatever revision it names.
			return errFinished
		}
		if !errors.Is(err, queue.ErrConflict) {
			return err
		}
		cur, curRev, err := j.Record(ctx, d.key)
		if err != nil {
			return err
		}
		mine := d.next()
		change(mine)
		if cur.State.Final() && mine.State.Final() {
			return errFinished
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
		// What was read is stored: with a running version held back, it
		// is that version, whose write's answer was lost (another
		// worker's would have superseded this delivery above).
		d.rec, d.rev, rev, d.unrecorded = cur, curRev, curRev, false
		if cur.State.Final() {
			// The dispatcher finished it (a cancel while queued): nothing
			// is written over a final version.
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
