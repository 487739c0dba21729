package worker

import (
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
	"go.opentelemetry.io/otel/trace"

	"github.com/fleet-dev/fleet/internal/artifact"
	"github.com/fleet-dev/fleet/internal/capacity"
	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/internal/telemetry"
	"github.com/fleet-dev/fleet/job"
)

// delivery is one delivery of a job message to this worker, from the
// moment it arrives until it is acknowledged, handed back or scheduled
// again. It runs one pipeline (handle): what it learns goes into a
// situation, decide says what to do, and settle does it. settle is the one
// place that writes the record, publishes events and results, and
// acknowledges, naks or terminates the message.
type delivery struct {
	w         *Worker
	msg       jetstream.Msg
	log       *slog.Logger
	id        string
	n         int // the attempt number this delivery runs or settles, from 1
	delivered int // deliveries of the message, this one included
	req       *job.Request
	rec       *job.Record // the record as last read or written
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

	lease     *capacity.Lease // the attempt's capacity lease, while held
	slotFreed bool

	arts *artifact.Attempt // its files in the object store; nil without one
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
	d := &delivery{w: w, msg: msg, log: w.log}
	defer d.freeSlot()
	if err := d.handle(); err != nil {
		d.log.Error("job handling failed; it will be redelivered", "err", err)
	}
}

// handle is the pipeline of a delivery: receive it, decide, and either
// settle at once or start the attempt (run it, or adopt it), and settle how
// it ended.
func (d *delivery) handle() error {
	ctx, s := d.receive()
	if s == nil {
		// Redelivered while still running here (progress acks were lost):
		// the running attempt settles the message.
		d.log.Warn("job redelivered while running on this worker; ignoring the copy")
		return nil
	}
	defer d.unregister()
	if d.span != nil {
		defer d.span.End()
	}
	act := d.decide(ctx, s)
	ran := false
	if act.verb == doRun || act.verb == doAdopt {
		act, ran = d.attempt(ctx, act)
	}
	if err := d.settle(ctx, act); err != nil {
		return err
	}
	if ran && act.verb != doLeaveRunning {
		d.cleanup(ctx)
	}
	return nil
}

// cleanupTimeout bounds an executor's Cleanup.
const cleanupTimeout = 30 * time.Second

// cleanup removes what an ended attempt left in its backend (a Kubernetes
// Job), once the attempt is settled: after the result, so that nobody waits
// for it. What a worker killed before this leaves behind, the recovery of
// its next start, or of a peer's, removes.
func (d *delivery) cleanup(ctx context.Context) {
	c, ok := d.w.exec.(executor.Cleaner)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	w := d.w
	if err := c.Cleanup(ctx, &executor.Task{JobID: d.id, Attempt: d.n, WorkerID: w.cfg.ID, Pool: w.cfg.Pool}); err != nil {
		d.log.Warn("could not clean up after the attempt; this worker's next start, or a peer's, will", "err", err)
	}
}

// receive decodes the delivery, registers it, and reads what decide needs
// first: the record (or, on a first delivery, the revision the message
// names). It returns nil when a copy of the job already runs here.
func (d *delivery) receive() (context.Context, *situation) {
	w := d.w
	s := &situation{now: time.Now(), retryDelay: w.cfg.Retry}
	if meta, err := d.msg.Metadata(); err != nil {
		s.malformed = fmt.Errorf("message metadata: %w", err)
	} else {
		d.delivered = int(meta.NumDelivered)
	}
	req, err := job.DecodeJob(d.msg.Data())
	if err == nil {
		err = req.Validate(w.cfg.Limits)
	}
	if err == nil && req.ID == "" {
		err = errors.New("invalid request: id is missing")
	}
	if err != nil || s.malformed != nil {
		s.malformed = cmpErr(s.malformed, err)
		ctx, cancel := context.WithCancelCause(w.settling)
		d.ctx, d.cancel = ctx, cancel
		return w.settling, s
	}
	req.Normalize()
	d.req, d.id = req, req.ID
	d.log = w.log.With("job_id", d.id)
	d.sub = submittedAt(d.msg.Headers())

	// Register before reading the record: a cancel published after the
	// dispatcher wrote the record then reaches this delivery.
	d.ctx, d.cancel = context.WithCancelCause(w.runCtx)
	if !w.register(d) {
		d.cancel(nil)
		return nil, nil
	}

	ctx := telemetry.Propagator.Extract(w.settling, queue.HeaderCarrier(d.msg.Headers()))
	d.traceID = telemetry.TraceID(ctx)
	// On a first delivery the record is the one the dispatcher created, at
	// the revision the message names: the worker's first write is a
	// compare-and-set against it, and no read is needed. Otherwise, read it.
	rev, _ := strconv.ParseUint(d.msg.Headers().Get(queue.HeaderRecordRev), 10, 64)
	if d.delivered == 1 && rev > 0 {
		d.rec, d.rev = d.newRecord(), rev
	} else if err := d.refresh(ctx); err != nil {
		d.rec = d.newRecord()
		s = d.situation()
		s.unsettled = err
		return ctx, s
	}
	s = d.situation()
	d.n = s.attemptOf()
	d.log = d.log.With("attempt", d.n)
	if d.traceID != "" {
		d.log = d.log.With("trace_id", d.traceID)
	}
	ctx, d.span = telemetry.Tracer().Start(ctx, "fleet.attempt", trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("fleet.job.id", d.id), attribute.String("fleet.pool", w.cfg.Pool),
			attribute.Int("fleet.attempt", d.n), attribute.String("fleet.worker.id", w.cfg.ID)))
	d.ctx = trace.ContextWithSpan(d.ctx, d.span)
	return ctx, s
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

func (d *delivery) unregister() {
	d.cancel(nil)
	d.w.unregister(d)
}

// situation gathers what the worker knows now, for decide.
func (d *delivery) situation() *situation {
	w := d.w
	return &situation{rec: d.rec, req: d.req, submitted: d.sub, now: time.Now(), self: w.cfg.ID,
		draining: w.Draining(), paused: w.pause.paused(), retryDelay: w.cfg.Retry, recheck: w.cfg.Queue.AckWait,
		adoptWait: w.cfg.AdoptWait}
}

// decide completes s with what it needs from outside (the stored result,
// whether another worker still runs the job, where the backend's attempt
// stands, the executor's judgement of the request), then decides. What
// cannot be read goes into s as unsettled, and decide leaves the job for
// later.
func (d *delivery) decide(ctx context.Context, s *situation) action {
	if s.malformed != nil || s.unsettled != nil {
		return decide(s)
	}
	if h, ok := d.w.cfg.Capacity.(capacity.Holder); ok && s.needsOwner() {
		runs, err := h.Holds(ctx, s.rec.WorkerID, d.id, s.rec.Attempt)
		if err != nil {
			// Without Redis, nobody can tell: the attempt counts as lost,
			// as it does on a fleet without capacity accounting.
			level := slog.LevelWarn
			if errors.Is(err, capacity.ErrUnavailable) {
				level = slog.LevelDebug // the ledger logged the outage once
			}
			d.log.Log(ctx, level, "cannot tell whether the job's worker still runs it", "worker", s.rec.WorkerID, "err", err)
		}
		s.ownerRuns = runs
	}
	if s.needsResult() {
		res, err := d.w.journal.StoredResult(ctx, d.id)
		if err != nil {
			s.unsettled = fmt.Errorf("read the job's result: %w", err)
			return decide(s)
		}
		s.result = res
	}
	if err := d.lookup(ctx, s); err != nil {
		s.unsettled = err
		return decide(s)
	}
	if v, ok := d.w.exec.(executor.Validator); ok && s.outcome == nil {
		if err := v.Validate(d.req); err != nil {
			s.refused = fmt.Errorf("%s executor cannot run it: %w", d.w.cfg.Backend, err)
		}
	}
	if f, ok := d.w.exec.(executor.Fitter); ok && s.outcome == nil && s.refused == nil {
		s.misfit = f.Fits(d.req)
	}
	d.preferPeer(ctx, s)
	return decide(s)
}

// refresh reads the job's record; a job the dispatcher has not recorded
// (only the dispatcher publishes jobs, so this is rare) gets a fresh one.
func (d *delivery) refresh(ctx context.Context) error {
	rec, rev, err := d.w.journal.Record(ctx, d.id)
	switch {
	case errors.Is(err, queue.ErrNotFound):
		d.rec, d.rev = d.newRecord(), 0
	case err != nil:
		return err
	default:
		d.rec, d.rev = rec, rev
	}
	return nil
}

// attempt starts the attempt act names (doRun runs it, doAdopt takes over
// the one a lost worker left running), follows it to its end, and returns
// the decision on how it ended, and whether the attempt ran (the executor
// was called). One preparation serves both: the memory an
// OOM retry raised, the capacity lease, and the record's compare-and-set,
// after which the decision is made again if the record moved. Anything
// that keeps the attempt from starting is a decision too, returned as it
// is.
func (d *delivery) attempt(ctx context.Context, act action) (action, bool) {
	for {
		d.n = act.attempt
		if d.rec.MemoryOverride != "" {
			d.req.Resources.Memory = d.rec.MemoryOverride
		}
		if next, ok := d.reserve(ctx, act); !ok {
			return next, false
		}
		err := d.settle(ctx, act) // the record says this worker runs it
		if err == nil {
			break
		}
		s := d.situation()
		if !errors.Is(err, queue.ErrConflict) {
			s.unsettled = err
		} else if err := d.refresh(ctx); err != nil {
			s.unsettled = err
		}
		d.releaseLease()
		next := d.decide(ctx, s)
		if next.verb != doRun && next.verb != doAdopt {
			return next, false
		}
		act = next
	}

	w, req := d.w, d.req
	if act.verb == doRun {
		w.m.started.Add(ctx, 1, w.m.poolAttrs)
		if d.first && !d.sub.IsZero() {
			w.m.wait.Record(ctx, d.started.Sub(d.sub).Seconds(), w.m.poolAttrs)
		}
	} else {
		w.m.adopted.Add(ctx, 1, w.m.poolAttrs)
		if d.rec.CancelRequested {
			d.cancel(executor.ErrCancelled)
		}
	}
	// An attempt may not outlive the job's deadline; the executor counts
	// its timeout from the attempt's start.
	deadlineBound := false
	if dl := req.Deadline; dl != nil && !d.sub.IsZero() {
		if left := d.sub.Add(dl.Std()).Sub(d.started); left < req.Timeout.Std() {
			bounded := job.Duration(max(left, time.Millisecond))
			req.Timeout, deadlineBound = &bounded, true
		}
	}
	task := &executor.Task{JobID: d.id, Attempt: d.n, WorkerID: w.cfg.ID, Pool: w.cfg.Pool, Request: req, Report: d}
	stopProgress := d.progress()
	var out *executor.Outcome
	var err error
	if act.verb == doRun {
		task.Artifacts = d.openArtifacts()
		out, err = w.exec.Run(d.ctx, task)
	} else {
		// decide adopts only with an Adopter.
		out, err = w.exec.(executor.Adopter).Adopt(d.ctx, task, act.found)
	}
	stopProgress()
	d.freeSlot()
	return d.ended(ctx, out, err, deadlineBound), true
}

// reserve takes the attempt's capacity lease before its record is
// written, so that no capacity costs nothing to undo. It returns the
// decision to settle instead when the worker has no room for it.
func (d *delivery) reserve(ctx context.Context, act action) (action, bool) {
	c := d.w.cfg.Capacity
	if c == nil || d.lease != nil {
		return action{}, true
	}
	req := d.req
	l := capacity.Lease{JobID: d.id, Attempt: act.attempt, CPUMilli: req.Resources.CPUMilli(),
		MemoryBytes: req.Resources.MemoryBytes(), GPUs: req.Resources.GPU, StartedAt: time.Now(), Handle: d.msg.Reply()}
	if act.found != nil && !act.found.StartedAt.IsZero() {
		l.StartedAt = act.found.StartedAt
	}
	switch err := c.Reserve(ctx, l); {
	case errors.Is(err, capacity.ErrNoCapacity):
		s := d.situation()
		s.noCapacity = err.Error()
		return decide(s), false
	case err != nil:
		d.log.Warn("capacity reservation failed; running on local accounting", "err", err)
	}
	d.lease = &l
	return action{}, true
}

// releaseLease gives the attempt's capacity lease back, if it holds one.
func (d *delivery) releaseLease() {
	if d.lease == nil {
		return
	}
	l := *d.lease
	d.lease = nil
	if err := d.w.cfg.Capacity.Release(context.WithoutCancel(d.w.settling), l); err != nil {
		d.log.Warn("capacity release failed", "err", err)
	}
}

// freeSlot gives the delivery's slot and capacity lease back to the worker,
// once: as soon as the executor is done with the attempt, so that what is
// left to settle (writes that may wait for a NATS election) does not hold
// the worker's capacity.
func (d *delivery) freeSlot() {
	if d.slotFreed {
		return
	}
	d.slotFreed = true
	d.releaseLease()
	d.w.slots.release(1)
	d.w.ended.fire()
}

// ended turns how an attempt that ran, or was adopted, ended (its outcome
// or the executor's error) into the decision that settles it.
func (d *delivery) ended(ctx context.Context, out *executor.Outcome, err error, deadlineBound bool) action {
	w := d.w
	leftRunning := errors.Is(err, executor.ErrLeftRunning)
	if leftRunning {
		err = nil
		out = executor.CancelledOutcome(d.ctx, time.Time{})
	}
	if err != nil {
		var f *job.Failure
		if !errors.As(err, &f) {
			f = job.Failf(job.ClassInfrastructure, job.CodeExecutorError, "%v", err)
		}
		out = &executor.Outcome{Status: executor.StatusOf(f), Failure: f}
	}
	if out.StartedAt.IsZero() {
		out.StartedAt = d.started
	}
	if out.FinishedAt.IsZero() {
		out.FinishedAt = time.Now()
	}
	w.m.duration.Record(ctx, out.FinishedAt.Sub(out.StartedAt).Seconds(), w.m.byStatus(out.Status))

	s := d.situation()
	s.outcome, s.deadlineBound, s.leftRunning = out, deadlineBound, leftRunning
	cause := context.Cause(d.ctx)
	s.requeued = errors.Is(cause, executor.ErrRequeue) || errors.Is(cause, executor.ErrLeaveRunning)
	d.closeArtifacts(ctx, out, s.requeued || s.leftRunning)
	return decide(s)
}

func (d *delivery) newRecord() *job.Record {
	now := time.Now()
	sub := d.sub
	if sub.IsZero() {
		sub = now
	}
	return &job.Record{ID: d.id, Pool: d.w.cfg.Pool, State: job.StateQueued, MaxAttempts: d.req.Retry.MaxAttempts,
		SubmittedAt: sub, UpdatedAt: now, RunID: d.req.RunID, NodeID: d.req.NodeID, Labels: d.req.Labels,
		TraceID: d.traceID}
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
