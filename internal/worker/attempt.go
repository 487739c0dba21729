package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/internal/telemetry"
	"github.com/fleet-dev/fleet/job"
)

// attempt is one delivery of a job message to this worker, from the moment
// it arrives until it is acknowledged, handed back or scheduled again.
type attempt struct {
	w    *Worker
	msg  jetstream.Msg
	log  *slog.Logger
	id   string
	n    int // the attempt number, from 1
	req  *job.Request
	rec  *job.Record // the record as last written
	rev  uint64      // and its revision
	sub  time.Time   // submission time
	span trace.Span

	ctx    context.Context
	cancel context.CancelCauseFunc

	started time.Time
	first   bool   // this is the job's first attempt to start
	traceID string // from the job message

	logMu sync.Mutex
	logs  int
	hbSeq int
}

// handle runs one delivery. It never returns before the message is
// acknowledged, handed back, scheduled again, or left for redelivery.
func (w *Worker) handle(msg jetstream.Msg) {
	defer w.attempts.Done()
	defer w.ended.fire()
	defer w.slots.release(1)
	a := &attempt{w: w, msg: msg, log: w.log}
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
	// The dispatcher bounded the request's size at intake; its re-encoding
	// may be larger (JSON escapes), and is not held against it.
	lim := w.cfg.Limits
	lim.MaxRequestBytes = math.MaxInt
	req, err := job.DecodeRequest(a.msg.Data(), lim)
	if err == nil {
		err = req.Validate(w.cfg.Limits)
	}
	if err == nil && req.ID == "" {
		err = errors.New("invalid request: id is missing")
	}
	if err != nil {
		return a.refuseMalformed(err)
	}
	req.Normalize()
	a.req, a.id = req, req.ID
	a.log = w.log.With("job_id", a.id)
	a.sub = submittedAt(a.msg.Headers())

	// Register before reading the record: a cancel published after the
	// dispatcher wrote the record then reaches this attempt.
	a.ctx, a.cancel = context.WithCancelCause(w.runCtx)
	defer a.cancel(nil)
	w.mu.Lock()
	if other := w.running[a.id]; other != nil {
		w.mu.Unlock()
		// Redelivered while still running here (progress acks were lost):
		// the running attempt's ack settles it.
		a.log.Warn("job redelivered while running on this worker; ignoring the copy")
		return nil
	}
	w.running[a.id] = a
	w.mu.Unlock()
	defer w.unregister(a)

	ctx := telemetry.Propagator.Extract(context.Background(), queue.HeaderCarrier(a.msg.Headers()))
	a.traceID = telemetry.TraceID(ctx)
	// On a first delivery the record is the one the dispatcher created, at
	// the revision the message names: the worker's first write is a
	// compare-and-set against it, and no read is needed. Otherwise, read it.
	rev, _ := strconv.ParseUint(a.msg.Headers().Get(queue.HeaderRecordRev), 10, 64)
	if meta.NumDelivered == 1 && rev > 0 {
		a.rec, a.rev = a.newRecord(), rev
	} else if err := a.refresh(ctx); err != nil {
		_ = a.msg.NakWithDelay(2 * time.Second)
		return err
	}
	a.n = max(1, int(meta.NumDelivered)-a.rec.Handbacks)
	a.log = a.log.With("attempt", a.n)
	if a.traceID != "" {
		a.log = a.log.With("trace_id", a.traceID)
	}

	ctx, a.span = telemetry.Tracer().Start(ctx, "fleet.attempt", trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("fleet.job.id", a.id), attribute.String("fleet.pool", w.cfg.Pool),
			attribute.Int("fleet.attempt", a.n), attribute.String("fleet.worker.id", w.cfg.ID)))
	defer a.span.End()
	a.ctx = trace.ContextWithSpan(a.ctx, a.span)

	if w.Draining() {
		// Arrived on a fetch that was open when the worker began to stop.
		return a.handBack(ctx, "worker "+w.cfg.ID+" is shutting down")
	}
	if done, err := a.checkBeforeRun(ctx); done || err != nil {
		return err
	}
	return a.run(ctx)
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

// checkBeforeRun settles deliveries that must not run: jobs already
// finished or cancelled, out of time, or whose previous attempt was lost.
func (a *attempt) checkBeforeRun(ctx context.Context) (done bool, err error) {
	rec, req, now := a.rec, a.req, time.Now()
	switch {
	case rec.State.Final():
		// Finished by an earlier delivery that did not get to acknowledge.
		return true, a.msg.Ack()
	case rec.CancelRequested:
		return true, a.finish(ctx, &executor.Outcome{Status: job.StatusCancelled,
			Failure: job.Failf(job.ClassCancelled, job.CodeCancelled, "cancelled before attempt %d started", a.n)}, a.n-1)
	case req.Deadline != nil && now.After(a.sub.Add(req.Deadline.Std())):
		return true, a.finish(ctx, &executor.Outcome{Status: job.StatusTimedOut,
			Failure: job.Failf(job.ClassTimeout, job.CodeDeadline, "the job's deadline of %s passed before attempt %d", req.Deadline, a.n)}, a.n-1)
	case req.QueueTimeout != nil && rec.StartedAt == nil && now.After(a.sub.Add(req.QueueTimeout.Std())):
		return true, a.finish(ctx, &executor.Outcome{Status: job.StatusTimedOut,
			Failure: job.Failf(job.ClassTimeout, job.CodeQueueTimeout, "queued longer than queue_timeout %s", req.QueueTimeout)}, 0)
	}

	// Deliveries between the last recorded attempt and this one were lost
	// with their worker: a running attempt that stopped without a word, and
	// any delivery that died before it started. Each costs an attempt, and
	// the history says so, so that attempts always add up.
	first := rec.Attempt + 1
	if rec.State == job.StateRunning {
		first = rec.Attempt
	}
	if first >= 1 && first < a.n {
		// Unless it got as far as publishing the result.
		if res, err := a.existingResult(ctx); err == nil && res != nil {
			return true, a.conclude(ctx, res)
		}
		for k := first; k < a.n; k++ {
			lost := job.Attempt{Attempt: k, Failure: job.Failf(job.ClassInfrastructure, job.CodeWorkerLost,
				"attempt %d was delivered to a worker that stopped before it started", k)}
			if k == rec.Attempt && rec.State == job.StateRunning {
				lost.WorkerID, lost.StartedAt = rec.WorkerID, rec.StartedAt
				lost.Failure.Message = fmt.Sprintf("worker %s stopped responding during attempt %d", rec.WorkerID, k)
			}
			a.rec.History = append(a.rec.History, lost)
			a.rec.Failure = lost.Failure
		}
		last := a.n - 1
		if !req.Retry.Retries(job.ClassInfrastructure, nil) || last >= req.Retry.MaxAttempts {
			return true, a.finish(ctx, &executor.Outcome{Status: job.StatusFailed, Failure: a.rec.Failure}, last)
		}
		a.event(job.EventRetryScheduled, func(e *job.Event) {
			e.Attempt = last
			e.WorkerID = rec.WorkerID
			e.Failure = a.rec.Failure
			e.NextAttemptAt = &now
			zero := job.Duration(0)
			e.Delay = &zero
			e.Message = fmt.Sprintf("%s; attempt %d starts now", a.rec.Failure.Message, a.n)
		})
	}
	if a.n > req.Retry.MaxAttempts {
		f := a.rec.Failure
		if f == nil {
			f = job.Failf(job.ClassInfrastructure, job.CodeWorkerLost, "delivered %d times without finishing", a.n-1)
		}
		return true, a.finish(ctx, &executor.Outcome{Status: job.StatusFailed, Failure: f}, a.n-1)
	}
	if v, ok := a.w.exec.(executor.Validator); ok {
		if err := v.Validate(req); err != nil {
			return true, a.finish(ctx, &executor.Outcome{Status: job.StatusFailed,
				Failure: job.Failf(job.ClassRejected, job.CodeInvalid, "%s executor cannot run it: %v", a.w.cfg.Backend, err)}, a.n)
		}
	}
	return false, nil
}

// run reserves capacity, runs the attempt and settles its outcome.
func (a *attempt) run(ctx context.Context) error {
	w, req := a.w, a.req
	if a.rec.MemoryOverride != "" {
		req.Resources.Memory = a.rec.MemoryOverride
	}
	res := Reservation{JobID: a.id, Attempt: a.n, CPUMilli: req.Resources.CPUMilli(),
		MemoryBytes: req.Resources.MemoryBytes(), GPUs: req.Resources.GPU, StartedAt: time.Now()}
	// The slot is reserved while the record is written: two round trips
	// at once, not one after the other.
	reserved := func() error { return nil }
	if c := w.cfg.Capacity; c != nil {
		done := make(chan error, 1)
		go func() { done <- c.Reserve(ctx, res) }()
		var once sync.Once
		var rerr error
		reserved = func() error { once.Do(func() { rerr = <-done }); return rerr }
		defer func() {
			_ = reserved()
			if err := c.Release(context.WithoutCancel(ctx), res); err != nil {
				a.log.Warn("capacity release failed", "err", err)
			}
		}()
	}

	// Record the attempt as running before it starts: the compare-and-set
	// fails if the record changed since it was read (a cancel, a deadline
	// the dispatcher enforced), and then the checks run again.
	for {
		err := a.begin(ctx)
		if err == nil {
			break
		}
		if !errors.Is(err, queue.ErrConflict) {
			_ = a.msg.NakWithDelay(2 * time.Second)
			return err
		}
		if err := a.refresh(ctx); err != nil {
			_ = a.msg.NakWithDelay(2 * time.Second)
			return err
		}
		if done, err := a.checkBeforeRun(ctx); done || err != nil {
			return err
		}
	}
	if err := reserved(); errors.Is(err, ErrNoCapacity) {
		return a.handBack(ctx, "not enough capacity on this worker")
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
	out, err := w.exec.Run(a.ctx, &executor.Task{JobID: a.id, Attempt: a.n, WorkerID: w.cfg.ID, Pool: w.cfg.Pool, Request: req, Report: a})
	stopProgress()

	if errors.Is(context.Cause(a.ctx), executor.ErrHandBack) && (out == nil || out.Status != job.StatusSucceeded) {
		return a.handBack(ctx, "worker "+w.cfg.ID+" is shutting down")
	}
	if err != nil {
		f, ok := err.(*job.Failure)
		if !ok {
			f = job.Failf(job.ClassInfrastructure, job.CodeExecutorError, "%v", err)
		}
		out = &executor.Outcome{Status: executor.StatusOf(f), Failure: f, StartedAt: a.started}
	}
	if out.StartedAt.IsZero() {
		out.StartedAt = a.started
	}
	if out.FinishedAt.IsZero() {
		out.FinishedAt = time.Now()
	}
	if deadlineBound && out.Status == job.StatusTimedOut {
		out.Failure = job.Failf(job.ClassTimeout, job.CodeDeadline, "the job's deadline of %s passed during attempt %d", req.Deadline, a.n)
	}
	w.m.duration.Record(ctx, out.FinishedAt.Sub(out.StartedAt).Seconds(),
		w.m.byStatus(out.Status))

	if out.Status == job.StatusFailed || out.Status == job.StatusTimedOut {
		if delay, memory, ok := a.retryPlan(out); ok {
			return a.retry(ctx, out, delay, memory)
		}
	}
	return a.finish(ctx, out, a.n)
}

// begin writes the record of a starting attempt.
func (a *attempt) begin(ctx context.Context) error {
	a.started = time.Now()
	rec := a.rec
	a.first = rec.StartedAt == nil
	rec.State, rec.Attempt, rec.WorkerID, rec.Backend = job.StateRunning, a.n, a.w.cfg.ID, a.w.cfg.Backend
	rec.NextAttemptAt, rec.UpdatedAt = nil, a.started
	if a.first {
		rec.StartedAt = &a.started
	}
	f, err := a.w.store.UpdateAsync(rec, a.rev)
	if err != nil {
		return err
	}
	rev, err := a.w.store.Wait(ctx, f)
	if err != nil {
		return err
	}
	a.rev = rev
	return nil
}

// retryPlan decides whether a failed attempt is tried again, after what
// delay, and with how much memory.
func (a *attempt) retryPlan(out *executor.Outcome) (time.Duration, string, bool) {
	p, f := a.req.Retry, out.Failure
	if f == nil || a.n >= p.MaxAttempts {
		return 0, "", false
	}
	memory := ""
	retries := p.Retries(f.Class, out.ExitCode)
	if f.Class == job.ClassOOM && p.OOMMemoryMultiplier > 1 {
		// Asking for more memory makes an oom failure worth retrying.
		cur, limit := a.req.Resources.MemoryBytes(), mustMemory(p.MaxMemory)
		next := min(int64(float64(cur)*p.OOMMemoryMultiplier), limit)
		if next > cur {
			memory, retries = job.FormatMemory(roundUpMi(next)), true
		}
	}
	if !retries {
		return 0, "", false
	}
	delay := a.w.cfg.Retry(p, a.n)
	if d := a.req.Deadline; d != nil && time.Now().Add(delay).After(a.sub.Add(d.Std())) {
		out.Status = job.StatusTimedOut
		out.Failure = job.Failf(job.ClassTimeout, job.CodeDeadline, "attempt %d failed (%s: %s) and attempt %d could not start before the job's deadline of %s",
			a.n, f.Class, f.Message, a.n+1, d)
		return 0, "", false
	}
	return delay, memory, true
}

func (a *attempt) retry(ctx context.Context, out *executor.Outcome, delay time.Duration, memory string) error {
	w := a.w
	next := time.Now().Add(delay)
	rec := a.rec
	rec.History = append(rec.History, attemptSummary(a.n, w.cfg.ID, out))
	rec.State, rec.Failure, rec.NextAttemptAt, rec.UpdatedAt = job.StateRetrying, out.Failure, &next, time.Now()
	msg := fmt.Sprintf("attempt %d of %d failed (%s): %s; attempt %d in %s",
		a.n, a.req.Retry.MaxAttempts, out.Failure.Class, out.Failure.Message, a.n+1, delay.Round(time.Millisecond))
	if memory != "" {
		rec.MemoryOverride = memory
		msg += fmt.Sprintf(" with memory raised from %s to %s", a.req.Resources.Memory, memory)
	}
	d := job.Duration(delay)
	f := a.event(job.EventRetryScheduled, func(e *job.Event) {
		e.ExitCode, e.Failure, e.NextAttemptAt, e.Delay, e.Message = out.ExitCode, out.Failure, &next, &d, msg
	})
	if err := a.save(ctx, []jetstream.PubAckFuture{f}); err != nil {
		return err
	}
	w.m.retries.Add(ctx, 1, w.m.byClass(out.Failure.Class))
	a.log.Info("attempt failed; retry scheduled", "class", out.Failure.Class, "delay", delay)
	return a.msg.NakWithDelay(delay)
}

// finish ends the job: one result, its final event and record, a dead
// letter when it failed, then the message is acknowledged or terminated.
// attempts is the number of attempts the job had.
func (a *attempt) finish(ctx context.Context, out *executor.Outcome, attempts int) error {
	w, rec := a.w, a.rec
	if out.FinishedAt.IsZero() {
		out.FinishedAt = time.Now()
	}
	res := &job.Result{
		JobID: a.id, Pool: w.cfg.Pool, Status: out.Status, Attempts: attempts, ExitCode: out.ExitCode,
		Outputs: out.Outputs, Stdout: out.Stdout, Stderr: out.Stderr, FinishedAt: out.FinishedAt,
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
	stored, err := a.publishResult(ctx, res)
	if err != nil {
		return err
	}
	return a.conclude(ctx, stored)
}

// publishResult publishes the job's one result and returns the result that
// stands: this one, or the one an earlier delivery published first.
func (a *attempt) publishResult(ctx context.Context, res *job.Result) (*job.Result, error) {
	m, err := a.w.names.ResultMsg(res)
	if err != nil {
		return nil, err
	}
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
		ack, err := a.w.js.PublishMsg(ctx, m)
		if err == nil && !ack.Duplicate {
			return res, nil
		}
		if queue.IsResultExists(err) || err == nil {
			if existing, gerr := a.existingResult(ctx); gerr == nil && existing != nil {
				return existing, nil
			}
		}
		if err := a.keepWaiting(wait, "publish result", err); err != nil {
			return nil, err
		}
	}
}

// conclude announces a stored result: the final event, a dead letter when
// the job failed, the final record; then it settles the message. Every
// step is idempotent, so a delivery that finds a result published by an
// earlier one concludes it the same way.
func (a *attempt) conclude(ctx context.Context, res *job.Result) error {
	w, rec := a.w, a.rec
	now := time.Now()
	rec.State, rec.Attempt, rec.Failure, rec.UpdatedAt, rec.NextAttemptAt = job.State(res.Status), res.Attempts, res.Failure, now, nil
	rec.FinishedAt = &res.FinishedAt
	// The final event is always a job's last, so that watchers can stop
	// there: the dead letter is announced before it.
	var futures []jetstream.PubAckFuture
	dead := res.Status == job.StatusFailed || res.Status == job.StatusTimedOut
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
		return err
	}
	w.m.finished.Add(ctx, 1, w.m.byStatus(res.Status))
	if res.Status != job.StatusSucceeded {
		a.span.SetStatus(codes.Error, string(res.Status))
	}
	a.log.Info("job finished", "status", res.Status, "attempts", res.Attempts)
	if dead {
		return a.msg.TermWithReason("dead-lettered: " + string(res.Failure.Class))
	}
	return a.msg.Ack()
}

// deadLetter copies the request to the pool's dead-letter subject with its
// last failure, and announces it.
func (a *attempt) deadLetter(f *job.Failure, attempts int) []jetstream.PubAckFuture {
	m := nats.NewMsg(a.w.names.DLQ(a.w.cfg.Pool))
	m.Data = a.msg.Data()
	m.Header.Set(queue.HeaderMsgID, a.id+"/dlq/"+strconv.Itoa(attempts))
	m.Header.Set(queue.HeaderFailureClass, string(f.Class))
	m.Header.Set(queue.HeaderFailureCode, f.Code)
	m.Header.Set(queue.HeaderFailureMessage, f.Message)
	m.Header.Set(queue.HeaderAttempts, strconv.Itoa(attempts))
	if t := a.msg.Headers().Get(queue.HeaderSubmittedAt); t != "" {
		m.Header.Set(queue.HeaderSubmittedAt, t)
	}
	var out []jetstream.PubAckFuture
	if fut, err := a.w.js.PublishMsgAsync(m); err == nil {
		out = append(out, fut)
	} else {
		a.log.Warn("dead letter not published", "err", err)
	}
	out = append(out, a.event(job.EventDeadLettered, func(e *job.Event) {
		e.Attempt, e.Failure = attempts, f
		e.Message = "request copied to " + a.w.names.DLQ(a.w.cfg.Pool)
	}))
	return out
}

// handBack returns the job to the pool without counting this delivery as
// an attempt.
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
	f := a.event(job.EventQueued, func(e *job.Event) { e.Message = "handed back: " + why })
	if err := a.save(ctx, []jetstream.PubAckFuture{f}); err != nil {
		return err
	}
	a.log.Info("job handed back", "why", why)
	return a.msg.Nak()
}

// save writes a.rec with compare-and-set, then waits for the futures.
// On a conflict (a cancel changed the record) it merges the cancel request
// into the record, stops the attempt if it runs, and writes again.
func (a *attempt) save(ctx context.Context, futures []jetstream.PubAckFuture) error {
	store := a.w.store
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
		f, err := store.UpdateAsync(a.rec, a.rev)
		if err == nil {
			var rev uint64
			rev, err = store.Wait(ctx, f)
			if err == nil {
				a.rev = rev
				break
			}
		}
		if errors.Is(err, queue.ErrConflict) {
			cur, rev, gerr := store.Get(ctx, a.id)
			if gerr == nil {
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
				continue
			}
			err = gerr
		}
		if err := a.keepWaiting(wait, "save job record", err); err != nil {
			return err
		}
	}
	for _, f := range futures {
		if f == nil {
			continue
		}
		select {
		case <-f.Ok():
		case err := <-f.Err():
			// Events are de-duplicated by id: publishing again is safe.
			if _, rerr := a.w.js.PublishMsg(ctx, f.Msg()); rerr != nil {
				return fmt.Errorf("publish %s: %w", f.Msg().Subject, errors.Join(err, rerr))
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// keepWaiting sleeps before another try of a step that must succeed,
// telling JetStream the job is still in hand. It gives up only when the
// worker is stopped hard.
func (a *attempt) keepWaiting(wait time.Duration, what string, err error) error {
	a.log.Warn("retrying: "+what, "err", err, "in", wait)
	_ = a.msg.InProgress()
	select {
	case <-time.After(wait):
		return nil
	case <-a.w.runCtx.Done():
		return fmt.Errorf("%s: %w", what, errors.Join(err, context.Cause(a.w.runCtx)))
	}
}

// existingResult returns the job's stored result, if it has one.
func (a *attempt) existingResult(ctx context.Context) (*job.Result, error) {
	return queue.LastResult(ctx, a.w.js, a.w.names, a.id)
}

// refuseMalformed terminates a job message that is not a valid request.
// Only the dispatcher publishes jobs, so this means someone published to
// the jobs subject directly; if the message names a usable id, its
// producer gets a failed result saying why.
func (a *attempt) refuseMalformed(cause error) error {
	a.log.Warn("refusing malformed job message", "subject", a.msg.Subject(), "err", cause)
	id := a.msg.Headers().Get(queue.HeaderMsgID)
	if job.ValidID(id) {
		now := time.Now()
		res := &job.Result{JobID: id, Pool: a.w.cfg.Pool, Status: job.StatusFailed, FinishedAt: now,
			Failure: job.Failf(job.ClassRejected, job.CodeInvalid, "%v", cause)}
		if m, err := a.w.names.ResultMsg(res); err == nil {
			_, _ = a.w.js.PublishMsg(context.Background(), m)
		}
	}
	return a.msg.TermWithReason("malformed request")
}

// progress tells JetStream the attempt is alive, and publishes heartbeat
// events, until the returned function is called.
func (a *attempt) progress() (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(a.w.cfg.Progress)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if err := a.msg.InProgress(); err != nil {
					a.log.Warn("progress ack failed", "err", err)
				}
				a.logMu.Lock()
				a.hbSeq++
				seq := a.hbSeq
				a.logMu.Unlock()
				a.eventSeq(job.EventHeartbeat, seq, nil)
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

// Log implements Reporter: a bounded number of log events per attempt.
func (a *attempt) Log(stream, line string) {
	a.logMu.Lock()
	a.logs++
	n := a.logs
	a.logMu.Unlock()
	max := a.w.cfg.MaxLogEvents
	switch {
	case n < max:
		a.eventSeq(job.EventLog, n, func(e *job.Event) { e.Stream, e.Line = stream, line })
	case n == max:
		a.eventSeq(job.EventLog, n, func(e *job.Event) {
			e.Stream, e.Line = stream, line
			e.Message = fmt.Sprintf("log events stop here (limit %d); the result keeps the tail of each stream", max)
		})
	}
}

// Phase implements Reporter: a heartbeat event that names the new phase.
func (a *attempt) Phase(phase, message string) {
	a.logMu.Lock()
	a.hbSeq++
	seq := a.hbSeq
	a.logMu.Unlock()
	a.eventSeq(job.EventHeartbeat, seq, func(e *job.Event) { e.Phase, e.Message = phase, message })
}

func (a *attempt) event(t job.EventType, fill func(*job.Event)) jetstream.PubAckFuture {
	return a.eventSeq(t, 0, fill)
}

// eventSeq publishes an event without waiting; the returned future may be
// nil when publishing could not even start.
func (a *attempt) eventSeq(t job.EventType, seq int, fill func(*job.Event)) jetstream.PubAckFuture {
	e := &job.Event{JobID: a.id, Attempt: a.n, Type: t, Time: time.Now(), WorkerID: a.w.cfg.ID,
		Pool: a.w.cfg.Pool, Backend: a.w.cfg.Backend, TraceID: telemetry.TraceID(a.ctx)}
	if e.TraceID == "" && a.rec != nil {
		e.TraceID = a.rec.TraceID
	}
	if fill != nil {
		fill(e)
	}
	m, err := a.w.names.EventMsg(e, seq)
	if err != nil {
		a.log.Warn("event not published", "type", t, "err", err)
		return nil
	}
	if t == job.EventLog || t == job.EventHeartbeat {
		// Many, and best effort: stored without an acknowledgement.
		if err := a.w.nc.PublishMsg(m); err != nil {
			a.log.Warn("event not published", "type", t, "err", err)
		}
		return nil
	}
	f, err := a.w.js.PublishMsgAsync(m)
	if err != nil {
		a.log.Warn("event not published", "type", t, "err", err)
		return nil
	}
	return f
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
	s := job.Attempt{Attempt: n, WorkerID: worker, ExitCode: out.ExitCode, Failure: out.Failure}
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

func mustMemory(q string) int64 {
	v, _ := job.ParseMemory(q)
	return v
}

func roundUpMi(b int64) int64 { return (b + (1<<20 - 1)) &^ (1<<20 - 1) }
