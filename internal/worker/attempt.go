package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/fleet-dev/fleet/internal/artifact"
	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/internal/telemetry"
	"github.com/fleet-dev/fleet/job"
)

// attempt is one delivery of a job message to this worker, from the moment
// it arrives until it is acknowledged, handed back or scheduled again.
// What happens to it is decided by decide; settle carries it out, and is
// the one place that acknowledges, naks or terminates the message.
type attempt struct {
	w         *Worker
	msg       jetstream.Msg
	log       *slog.Logger
	id        string
	n         int // the attempt number, from 1
	delivered int // deliveries of the message, this one included
	req       *job.Request
	rec       *job.Record // the record as last written
	rev       uint64      // and its revision
	sub       time.Time   // submission time
	span      trace.Span
	traceID   string // from the job message

	ctx    context.Context // the attempt's own: cancelled to stop it
	cancel context.CancelCauseFunc

	started time.Time
	first   bool // this is the job's first attempt to start

	logMu sync.Mutex
	logs  int
	hbSeq int
	// seqBase numbers the log and heartbeat events of an adopted attempt
	// apart from those of the lives before, whose ids JetStream would take
	// for duplicates.
	seqBase int

	releaseLease func() // gives the attempt's capacity lease back; nil without one
	slotFreed    bool

	arts *artifact.Attempt // its files in the object store; nil without one
}

// freeSlot gives the delivery's slot and capacity lease back to the worker,
// once: as soon as the executor is done with the attempt, so that what is
// left to settle (writes that may wait for a NATS election) does not hold
// the worker's capacity.
func (a *attempt) freeSlot() {
	if a.slotFreed {
		return
	}
	a.slotFreed = true
	if a.releaseLease != nil {
		a.releaseLease()
	}
	a.w.slots.release(1)
	a.w.ended.fire()
}

// laterDelay is how long a job waits when the fleet could not read or
// write its record.
const laterDelay = 2 * time.Second

// errSuperseded: a later attempt of the job was recorded while this one
// settled; this delivery must leave the job and its message alone.
var errSuperseded = errors.New("a later attempt took the job over")

// handle runs one delivery. It never returns before the message is
// acknowledged, handed back, scheduled again, or left for redelivery.
func (w *Worker) handle(msg jetstream.Msg) {
	defer w.attempts.Done()
	a := &attempt{w: w, msg: msg, log: w.log}
	defer a.freeSlot()
	if err := a.handle(); err != nil {
		a.log.Error("job handling failed; it will be redelivered", "err", err)
	}
}

func (a *attempt) handle() error {
	w := a.w
	meta, err := a.msg.Metadata()
	if err != nil {
		return fmt.Errorf("message metadata: %w", err)
	}
	a.delivered = int(meta.NumDelivered)
	req, err := job.DecodeJob(a.msg.Data())
	if err == nil {
		err = req.Validate(w.cfg.Limits)
	}
	if err == nil && req.ID == "" {
		err = errors.New("invalid request: id is missing")
	}
	if err != nil {
		return a.settle(w.settling, action{verb: doRefuse, why: err.Error()})
	}
	req.Normalize()
	a.req, a.id = req, req.ID
	a.log = w.log.With("job_id", a.id)
	a.sub = submittedAt(a.msg.Headers())

	// Register before reading the record: a cancel published after the
	// dispatcher wrote the record then reaches this attempt.
	a.ctx, a.cancel = context.WithCancelCause(w.runCtx)
	defer a.cancel(nil)
	if !w.register(a) {
		// Redelivered while still running here (progress acks were lost):
		// the running attempt settles the message.
		a.log.Warn("job redelivered while running on this worker; ignoring the copy")
		return nil
	}
	defer w.unregister(a)

	ctx := telemetry.Propagator.Extract(w.settling, queue.HeaderCarrier(a.msg.Headers()))
	a.traceID = telemetry.TraceID(ctx)
	// On a first delivery the record is the one the dispatcher created, at
	// the revision the message names: the worker's first write is a
	// compare-and-set against it, and no read is needed. Otherwise, read it.
	rev, _ := strconv.ParseUint(a.msg.Headers().Get(queue.HeaderRecordRev), 10, 64)
	if a.delivered == 1 && rev > 0 {
		a.rec, a.rev = a.newRecord(), rev
	} else if err := a.refresh(ctx); err != nil {
		_ = a.settle(ctx, action{verb: doLater})
		return err
	}
	s := a.situation()
	a.n = s.attemptOf()
	a.log = a.log.With("attempt", a.n)
	if a.traceID != "" {
		a.log = a.log.With("trace_id", a.traceID)
	}

	ctx, a.span = telemetry.Tracer().Start(ctx, "fleet.attempt", trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("fleet.job.id", a.id), attribute.String("fleet.pool", w.cfg.Pool),
			attribute.Int("fleet.attempt", a.n), attribute.String("fleet.worker.id", w.cfg.ID)))
	defer a.span.End()
	a.ctx = trace.ContextWithSpan(a.ctx, a.span)

	act, err := a.decide(ctx, s)
	if err != nil {
		_ = a.settle(ctx, action{verb: doLater})
		return err
	}
	switch act.verb {
	case doRun:
		return a.run(ctx, act)
	case doAdopt:
		return a.adopt(ctx, act)
	}
	return a.settle(ctx, act)
}

// situation gathers what the worker knows now, for decide.
func (a *attempt) situation() *situation {
	return &situation{rec: a.rec, req: a.req, submitted: a.sub, now: time.Now(),
		draining: a.w.Draining(), paused: a.w.pause.paused(), retryDelay: a.w.cfg.Retry, recheck: a.w.cfg.Queue.AckWait, adoptWait: a.w.cfg.AdoptWait}
}

// decide completes s with what it needs from outside (the stored result,
// whether another worker still runs the job, the executor's judgement of
// the request), then decides.
func (a *attempt) decide(ctx context.Context, s *situation) (action, error) {
	if h, ok := a.w.cfg.Capacity.(Holder); ok && s.needsOwner(a.w.cfg.ID) {
		runs, err := h.Holds(ctx, s.rec.WorkerID, a.id, s.rec.Attempt)
		if err != nil {
			// Without Redis, nobody can tell: the attempt counts as lost,
			// as it does on a fleet without capacity accounting.
			a.log.Warn("cannot tell whether the job's worker still runs it", "worker", s.rec.WorkerID, "err", err)
		}
		s.ownerRuns = runs
	}
	if s.needsResult() {
		res, err := a.existingResult(ctx)
		if err != nil {
			return action{}, err
		}
		s.result = res
	}
	if err := a.lookup(ctx, s); err != nil {
		return action{}, err
	}
	if v, ok := a.w.exec.(executor.Validator); ok && s.outcome == nil {
		if err := v.Validate(a.req); err != nil {
			s.refused = fmt.Errorf("%s executor cannot run it: %w", a.w.cfg.Backend, err)
		}
	}
	if f, ok := a.w.exec.(executor.Fitter); ok && s.outcome == nil && s.refused == nil {
		s.misfit = f.Fits(a.req)
	}
	a.preferPeer(ctx, s)
	return decide(s), nil
}

// refresh reads the job's record; a job the dispatcher has not recorded
// (only the dispatcher publishes jobs, so this is rare) gets a fresh one.
func (a *attempt) refresh(ctx context.Context) error {
	rec, rev, err := a.w.store.Get(ctx, a.id)
	switch {
	case errors.Is(err, queue.ErrNotFound):
		a.rec, a.rev = a.newRecord(), 0
	case err != nil:
		return err
	default:
		a.rec, a.rev = rec, rev
	}
	return nil
}

// run reserves capacity, records the attempt as running, runs it and
// settles its outcome.
func (a *attempt) run(ctx context.Context, act action) error {
	w, req := a.w, a.req
	if a.rec.MemoryOverride != "" {
		req.Resources.Memory = a.rec.MemoryOverride
	}
	res := Reservation{JobID: a.id, Attempt: a.n, CPUMilli: req.Resources.CPUMilli(),
		MemoryBytes: req.Resources.MemoryBytes(), GPUs: req.Resources.GPU, StartedAt: time.Now(), Handle: a.msg.Reply()}
	// The slot is reserved while the record is written: two round trips
	// at once, not one after the other.
	reserved := func() error { return nil }
	if c := w.cfg.Capacity; c != nil {
		done := make(chan error, 1)
		go func() { done <- c.Reserve(ctx, res) }()
		var once sync.Once
		var rerr error
		reserved = func() error { once.Do(func() { rerr = <-done }); return rerr }
		a.releaseLease = sync.OnceFunc(func() {
			_ = reserved()
			if err := c.Release(context.WithoutCancel(ctx), res); err != nil {
				a.log.Warn("capacity release failed", "err", err)
			}
		})
	}

	// Record the attempt as running before it starts: the compare-and-set
	// fails if the record changed since it was read (a cancel, a deadline
	// the dispatcher enforced), and then the decision is made again.
	for {
		err := a.begin(ctx, act)
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
		if act, err = a.decide(ctx, a.situation()); err != nil {
			_ = a.settle(ctx, action{verb: doLater})
			return err
		}
		if act.verb != doRun {
			return a.settle(ctx, act)
		}
	}
	if err := reserved(); errors.Is(err, ErrNoCapacity) {
		return a.settle(ctx, action{verb: doHandBack, attempt: a.n, why: "not enough capacity on this worker"})
	} else if err != nil {
		a.log.Warn("capacity reservation failed; running on local accounting", "err", err)
	}
	a.event(job.EventStarted, nil)
	w.m.started.Add(ctx, 1, w.m.poolAttrs)
	if a.first && !a.sub.IsZero() {
		w.m.wait.Record(ctx, a.started.Sub(a.sub).Seconds(), w.m.poolAttrs)
	}

	// An attempt may not outlive the job's deadline.
	deadlineBound := false
	if d := req.Deadline; d != nil {
		if left := time.Until(a.sub.Add(d.Std())); left < req.Timeout.Std() {
			bounded := job.Duration(max(left, time.Millisecond))
			req.Timeout, deadlineBound = &bounded, true
		}
	}
	stopProgress := a.progress()
	out, err := w.exec.Run(a.ctx, &executor.Task{JobID: a.id, Attempt: a.n, WorkerID: w.cfg.ID, Pool: w.cfg.Pool, Request: req, Report: a,
		Artifacts: a.openArtifacts()})
	stopProgress()
	a.freeSlot()
	return a.ended(ctx, out, err, deadlineBound)
}

// ended settles how an attempt that ran, or was adopted, ended: its outcome
// or the executor's error.
func (a *attempt) ended(ctx context.Context, out *executor.Outcome, err error, deadlineBound bool) error {
	w := a.w
	handedOff := errors.Is(err, executor.ErrHandedOff)
	if handedOff {
		err = nil
		out = executor.CancelledOutcome(a.ctx, time.Time{})
	}
	if err != nil {
		f, ok := err.(*job.Failure)
		if !ok {
			f = job.Failf(job.ClassInfrastructure, job.CodeExecutorError, "%v", err)
		}
		out = &executor.Outcome{Status: executor.StatusOf(f), Failure: f}
	}
	if out.StartedAt.IsZero() {
		out.StartedAt = a.started
	}
	if out.FinishedAt.IsZero() {
		out.FinishedAt = time.Now()
	}
	w.m.duration.Record(ctx, out.FinishedAt.Sub(out.StartedAt).Seconds(), w.m.byStatus(out.Status))

	s := a.situation()
	s.outcome, s.deadlineBound, s.handedOff = out, deadlineBound, handedOff
	cause := context.Cause(a.ctx)
	s.handedBack = errors.Is(cause, executor.ErrHandBack) || errors.Is(cause, executor.ErrHandOff)
	a.closeArtifacts(ctx, out, s.handedBack || s.handedOff)
	if err := a.settle(ctx, decide(s)); err != nil {
		return err
	}
	if c, ok := w.exec.(executor.Cleaner); ok && !handedOff {
		// After the result, so nobody waits for it; what a crash leaves
		// here, Recover removes.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if err := c.Cleanup(cctx, &executor.Task{JobID: a.id, Attempt: a.n, WorkerID: w.cfg.ID, Pool: w.cfg.Pool}); err != nil {
			a.log.Warn("could not clean up after the attempt; this worker's next start, or a peer's, will", "err", err)
		}
	}
	return nil
}

// cleanupTimeout bounds an executor's Cleanup.
const cleanupTimeout = 30 * time.Second

// begin writes the record of a starting attempt.
func (a *attempt) begin(ctx context.Context, act action) error {
	a.started = time.Now()
	rec := a.rec
	rec.History = append(rec.History, act.lost...)
	if n := len(act.lost); n > 0 {
		rec.Failure = act.lost[n-1].Failure
	}
	a.first = rec.StartedAt == nil
	rec.State, rec.Attempt, rec.WorkerID, rec.Backend = job.StateRunning, a.n, a.w.cfg.ID, a.w.cfg.Backend
	rec.NextAttemptAt, rec.UpdatedAt, rec.AwaitingSince = nil, a.started, nil
	if a.first {
		rec.StartedAt = &a.started
	}
	rev, err := a.w.store.Update(ctx, rec, a.rev)
	if err != nil {
		// The write did not happen: the record stays as read, for the next
		// decision.
		rec.History = rec.History[:len(rec.History)-len(act.lost)]
		return err
	}
	a.rev = rev
	if act.restart {
		// Tell watchers why the attempt they saw never ended, now that it
		// is recorded.
		now := time.Now()
		zero := job.Duration(0)
		a.event(job.EventRetryScheduled, func(e *job.Event) {
			e.Attempt, e.WorkerID, e.Failure = a.n-1, act.lost[len(act.lost)-1].WorkerID, rec.Failure
			e.NextAttemptAt, e.Delay = &now, &zero
			e.Message = fmt.Sprintf("%s; attempt %d starts now", rec.Failure.Message, a.n)
		})
	}
	return nil
}

// settle carries out an action: the record, events, result and dead letter
// it calls for, then exactly one of Ack, Nak, NakWithDelay or Term. When a
// write fails for good (the worker is stopped hard), the message is left
// to come back after the ack wait.
func (a *attempt) settle(ctx context.Context, act action) error {
	defer a.holdOn()()
	err := a.carryOut(ctx, act)
	if errors.Is(err, errSuperseded) {
		a.log.Warn("a later attempt took the job over; leaving it", "attempt", a.n)
		return nil
	}
	return err
}

func (a *attempt) carryOut(ctx context.Context, act action) error {
	switch act.verb {
	case doLater:
		if act.why != "" {
			a.log.Info("leaving the job for now", "why", act.why, "for", act.delay)
		}
		return a.msg.NakWithDelay(cmp.Or(act.delay, laterDelay))
	case doRefuse:
		return a.refuse(act.why)
	case doAck:
		return a.msg.Ack()
	case doHandBack:
		if err := a.handBack(ctx, act.why); err != nil {
			return err
		}
		return a.msg.Nak()
	case doRetry:
		if err := a.retry(ctx, act); err != nil {
			return err
		}
		return a.msg.NakWithDelay(act.delay)
	case doAwait:
		a.await(ctx, act)
		return a.msg.NakWithDelay(cmp.Or(act.delay, laterDelay))
	case doHandOff:
		a.handOff(act)
		return a.msg.Nak()
	case doAdopt:
		// Decided again while a new attempt was being recorded: the next
		// delivery adopts it.
		return a.msg.NakWithDelay(laterDelay)
	case doFinish, doConclude:
		res := act.result
		if act.verb == doFinish {
			a.rec.History = append(a.rec.History, act.lost...)
			_, endResult := telemetry.Step(ctx, "fleet.result")
			stored, err := a.publishResult(ctx, a.resultOf(act.outcome, act.attempts))
			endResult(err)
			if err != nil {
				return err
			}
			res = stored
		}
		dead, err := a.conclude(ctx, res)
		if err != nil {
			return err
		}
		a.dropData(ctx)
		if dead {
			return a.msg.TermWithReason("dead-lettered: " + string(res.Failure.Class))
		}
		return a.msg.Ack()
	}
	return fmt.Errorf("no way to settle %s", act.verb)
}

// holdOn tells JetStream the job is still in hand while a settlement waits
// for NATS (a cluster electing a leader), so that it is not delivered to
// another worker meanwhile. It returns the function that stops it.
func (a *attempt) holdOn() (stop func()) {
	var mu sync.Mutex
	stopped := false
	var t *time.Timer
	t = time.AfterFunc(a.w.cfg.Progress, func() {
		_ = a.msg.InProgress()
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			t.Reset(a.w.cfg.Progress)
		}
	})
	return func() {
		mu.Lock()
		stopped = true
		mu.Unlock()
		t.Stop()
	}
}

// retry records a failed attempt and announces the next one.
func (a *attempt) retry(ctx context.Context, act action) error {
	w, out := a.w, act.outcome
	next := time.Now().Add(act.delay)
	rec := a.rec
	rec.History = append(rec.History, attemptSummary(a.n, w.cfg.ID, out))
	rec.State, rec.Failure, rec.NextAttemptAt, rec.UpdatedAt = job.StateRetrying, out.Failure, &next, time.Now()
	msg := fmt.Sprintf("attempt %d of %d failed (%s): %s; attempt %d in %s",
		a.n, a.req.Retry.MaxAttempts, out.Failure.Class, out.Failure.Message, a.n+1, act.delay.Round(time.Millisecond))
	if act.memory != "" {
		rec.MemoryOverride = act.memory
		msg += fmt.Sprintf(" with memory raised from %s to %s", a.req.Resources.Memory, act.memory)
	}
	d := job.Duration(act.delay)
	f := a.event(job.EventRetryScheduled, func(e *job.Event) {
		e.ExitCode, e.Failure, e.NextAttemptAt, e.Delay, e.Message = out.ExitCode, out.Failure, &next, &d, msg
	})
	if err := a.save(ctx, []jetstream.PubAckFuture{f}); err != nil {
		return err
	}
	w.m.retries.Add(ctx, 1, w.m.byClass(out.Failure.Class))
	a.log.Info("attempt failed; retry scheduled", "class", out.Failure.Class, "delay", act.delay)
	return nil
}

// resultOf builds the job's result from the outcome of its last attempt.
func (a *attempt) resultOf(out *executor.Outcome, attempts int) *job.Result {
	w, rec := a.w, a.rec
	if out.FinishedAt.IsZero() {
		out.FinishedAt = time.Now()
	}
	res := &job.Result{
		JobID: a.id, Pool: w.cfg.Pool, Status: out.Status, Attempts: attempts, ExitCode: out.ExitCode,
		Outputs: out.Outputs, Artifacts: out.Artifacts, Log: out.Log, Stdout: out.Stdout, Stderr: out.Stderr, FinishedAt: out.FinishedAt,
		Failure: out.Failure, TraceID: telemetry.TraceID(a.ctx), RunID: a.req.RunID, NodeID: a.req.NodeID,
		History: rec.History,
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
func (a *attempt) conclude(ctx context.Context, res *job.Result) (dead bool, err error) {
	w, rec := a.w, a.rec
	now := time.Now()
	rec.State, rec.Attempt, rec.Failure, rec.UpdatedAt, rec.NextAttemptAt = job.State(res.Status), res.Attempts, res.Failure, now, nil
	rec.FinishedAt, rec.ExitCode = &res.FinishedAt, res.ExitCode
	// The final event is always a job's last, so that watchers can stop
	// there: the dead letter is announced before it.
	var futures []jetstream.PubAckFuture
	dead = res.Status == job.StatusFailed || res.Status == job.StatusTimedOut
	if dead {
		futures = a.deadLetter(res.Failure, res.Attempts)
	}
	futures = append(futures, a.event(res.Status.EventType(), func(e *job.Event) {
		e.Attempt, e.ExitCode, e.Failure = res.Attempts, res.ExitCode, res.Failure
		if res.WorkerID != "" {
			e.WorkerID = res.WorkerID
		}
		if res.Failure != nil {
			e.Message = res.Failure.Message
		}
	}))
	if err := a.save(ctx, futures); err != nil {
		return false, err
	}
	w.m.finished.Add(ctx, 1, w.m.byStatus(res.Status))
	if res.Status != job.StatusSucceeded && a.span != nil {
		a.span.SetStatus(codes.Error, string(res.Status))
	}
	a.log.Info("job finished", "status", res.Status, "attempts", res.Attempts)
	return dead, nil
}

// handBack records that the job returns to the pool without this delivery
// counting as an attempt.
func (a *attempt) handBack(ctx context.Context, why string) error {
	rec := a.rec
	rec.Handbacks++
	if rec.State == job.StateRunning && rec.WorkerID == a.w.cfg.ID && rec.Attempt == a.n {
		rec.State, rec.Attempt = job.StateQueued, a.n-1
		if a.n == 1 {
			rec.StartedAt = nil
		}
	}
	rec.UpdatedAt = time.Now()
	f := a.event(job.EventQueued, func(e *job.Event) { e.Message = "handed back by worker " + a.w.cfg.ID + ": " + why })
	if err := a.save(ctx, []jetstream.PubAckFuture{f}); err != nil {
		return err
	}
	a.log.Info("job handed back", "why", why)
	return nil
}

// refuse terminates a job message that is not a valid request. Only the
// dispatcher publishes jobs, so this means someone published to the jobs
// subject directly; if the message names a usable id, its producer gets a
// failed result saying why.
func (a *attempt) refuse(why string) error {
	a.log.Warn("refusing malformed job message", "subject", a.msg.Subject(), "err", why)
	id := a.msg.Headers().Get(queue.HeaderMsgID)
	if job.ValidID(id) {
		now := time.Now()
		res := &job.Result{JobID: id, Pool: a.w.cfg.Pool, Status: job.StatusFailed, FinishedAt: now,
			Failure: job.Failf(job.ClassRejected, job.CodeInvalid, "%s", why)}
		if m, err := a.w.names.ResultMsg(res); err == nil {
			_, _ = a.w.js.PublishMsg(context.Background(), m)
		}
	}
	return a.msg.TermWithReason("malformed request")
}

// save writes a.rec with compare-and-set, then waits for the futures,
// publishing again what was not stored. On a conflict (a cancel changed the
// record) it merges the cancel request into the record, stops the attempt
// if it runs, and writes again. Lost answers are tried again until the
// worker gives up for good (see Worker.Stop).
func (a *attempt) save(ctx context.Context, futures []jetstream.PubAckFuture) error {
	store := a.w.store
	for {
		rev, err := store.Update(ctx, a.rec, a.rev)
		if err == nil {
			a.rev = rev
			break
		}
		if !errors.Is(err, queue.ErrConflict) {
			return err
		}
		cur, rev, err := store.Get(ctx, a.id)
		if err != nil {
			return err
		}
		if cur.Attempt > a.n || (cur.Attempt == a.n && cur.State == job.StateRunning && cur.WorkerID != a.w.cfg.ID) {
			// Another delivery took the job over (this one was given up for
			// lost, or another worker adopted its attempt): the job and its
			// message are that one's now.
			return errSuperseded
		}
		a.rev = rev
		if cur.CancelRequested && !a.rec.CancelRequested {
			a.rec.CancelRequested = true
			a.cancel(executor.ErrCancelled)
		}
		if cur.State.Final() && !a.rec.State.Final() {
			// The dispatcher finished it (a cancel while queued).
			a.cancel(executor.ErrCancelled)
			return nil
		}
	}
	for _, f := range futures {
		if f == nil {
			continue
		}
		if _, err := queue.Await(ctx, a.w.js, f); err != nil {
			return err
		}
	}
	return nil
}

func (a *attempt) newRecord() *job.Record {
	now := time.Now()
	sub := a.sub
	if sub.IsZero() {
		sub = now
	}
	return &job.Record{ID: a.id, Pool: a.w.cfg.Pool, State: job.StateQueued, MaxAttempts: a.req.Retry.MaxAttempts,
		SubmittedAt: sub, UpdatedAt: now, RunID: a.req.RunID, NodeID: a.req.NodeID, Labels: a.req.Labels,
		TraceID: a.traceID}
}

func attemptSummary(n int, worker string, out *executor.Outcome) job.Attempt {
	s := job.Attempt{Attempt: n, WorkerID: worker, ExitCode: out.ExitCode, Failure: out.Failure, Log: out.Log}
	if !out.StartedAt.IsZero() {
		t := out.StartedAt
		s.StartedAt = &t
	}
	if !out.FinishedAt.IsZero() {
		t := out.FinishedAt
		s.FinishedAt = &t
	}
	return s
}

func submittedAt(h nats.Header) time.Time {
	t, _ := time.Parse(time.RFC3339Nano, h.Get(queue.HeaderSubmittedAt))
	return t
}
