package worker

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
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
	w   *Worker
	msg jetstream.Msg
	// What the delivery's log lines carry beside the worker's attributes,
	// as it became known (see log): the job (its id and tenant) once
	// keyed, the attempt (with the trace) once logged is set, and the
	// adopted attempt once logAdopted is. Kept as fields, the attributes
	// cost nothing until a line is written.
	keyed      bool
	logged     int // the attempt
	logAdopted int
	key        queue.JobKey // the job's tenant, pool and id
	id         string
	n          int // the attempt number this delivery runs or settles, from 1
	delivered  int // deliveries of the message, this one included
	req        *job.Request
	rec        *job.Record // the record as last read or written
	rev        uint64      // and its revision
	// unrecorded: rec is the attempt's running version, held back (see
	// begin) and not stored; rev is still the version before it.
	unrecorded bool
	sub        time.Time // submission time
	span       trace.Span
	traceID    string // from the job message

	ctx    context.Context // the attempt's own: cancelled to stop it
	cancel context.CancelCauseFunc

	started time.Time
	first   bool // this is the job's first attempt to start

	logMu sync.Mutex
	logs  int

	lease *capacity.Lease // the attempt's capacity lease, while held
	// held is what the attempt counts in its tenant's share of the pool,
	// from heldAt (see Worker.hold).
	held      *capacity.Holding
	heldAt    time.Time
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
	defer w.handlers.attempts.Done()
	d := &delivery{w: w, msg: msg}
	defer d.freeSlot()
	if err := d.handle(); err != nil {
		d.log().Error("job handling failed; it will be redelivered", "err", err)
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
		d.log().Warn("job redelivered while running on this worker; ignoring the copy")
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
	if err := c.Cleanup(ctx, d.task()); err != nil {
		d.log().Warn("could not clean up after the attempt; this worker's next start, or a peer's, will", "err", err)
	}
}

// receive decodes the delivery, registers it, and reads what decide needs
// first: the record (on a first delivery, the one the message is: the
// version that queued the job, whose revision is the message's stream
// sequence). It returns nil when a copy of the job already runs here.
func (d *delivery) receive() (context.Context, *situation) {
	w := d.w
	fail := func(err error) (context.Context, *situation) {
		s := d.situation()
		s.malformed = err
		d.ctx, d.cancel = context.WithCancelCause(w.scope.settle)
		return w.scope.settle, s
	}
	meta, err := d.msg.Metadata()
	if err != nil {
		return fail(fmt.Errorf("message metadata: %w", err))
	}
	d.delivered = int(meta.NumDelivered)
	_, k, ok := w.names.ParsePoolJob(d.msg.Subject())
	if !ok || k.Pool != w.cfg.Pool || !job.ValidID(k.ID) || !job.ValidTenant(k.Tenant) {
		return fail(fmt.Errorf("%s is not the subject of a job of pool %s", d.msg.Subject(), w.cfg.Pool))
	}
	d.key, d.id = k, k.ID
	d.logJob()
	queued, err := decodeQueued(d.msg.Data(), k)
	if err == nil {
		err = w.sealer.Open(k, queued.Request, queued.Secrets)
	}
	if err == nil {
		err = queued.Request.Validate(w.cfg.Limits)
	}
	if err != nil {
		return fail(err)
	}
	req := queued.Request
	req.Normalize()
	d.req, d.sub = req, queued.SubmittedAt

	// Register before reading the record: a cancel published after the
	// dispatcher wrote the record then reaches this delivery.
	d.ctx, d.cancel = context.WithCancelCause(w.scope.run)
	if !w.runs.add(d) {
		d.cancel(nil)
		return nil, nil
	}

	ctx := telemetry.Propagator.Extract(w.scope.settle, queue.HeaderCarrier(d.msg.Headers()))
	d.traceID = cmp.Or(telemetry.TraceID(ctx), queued.TraceID)
	// On a first delivery the record is the message itself, at the
	// message's sequence: the worker's first write is a compare-and-set
	// against it, and no read is needed. Otherwise, read it.
	//
	// A read that finds no record was answered by a replica of the
	// stream that is behind (a direct get may be answered by any): the
	// message is the record's first version, and the job has at least
	// that one. Deciding on it is safe: the first write is a
	// compare-and-set against it, and if the record moved since, the
	// write is refused and the decision made again on a new read.
	if d.delivered == 1 {
		d.rec, d.rev = queued.Version(), meta.Sequence.Stream
	} else if err := d.refresh(ctx); errors.Is(err, queue.ErrNotFound) {
		d.rec, d.rev = queued.Version(), meta.Sequence.Stream
	} else if err != nil {
		d.rec = queued.Version()
		s := d.situation()
		s.unsettled = err
		return ctx, s
	}
	s := d.situation()
	d.n = s.attemptOf()
	d.logAttempt()
	ctx, d.span = telemetry.Tracer().Start(ctx, "fleet.attempt", trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("fleet.job.id", d.id), attribute.String("fleet.tenant", k.Tenant),
			attribute.String("fleet.pool", w.cfg.Pool), attribute.Int("fleet.attempt", d.n), attribute.String("fleet.worker.id", w.cfg.ID)))
	d.ctx = trace.ContextWithSpan(d.ctx, d.span)
	return ctx, s
}

// logJob gives the delivery's log lines the job's id and tenant.
func (d *delivery) logJob() { d.keyed = true }

// logAttempt gives the delivery's log lines its attempt and trace.
func (d *delivery) logAttempt() { d.logged = d.n }

// log is the worker's logger with the delivery's attributes. It builds
// one (a handler of its own) each time: call it for a line that is
// written, or see logAttrs.
func (d *delivery) log() *slog.Logger {
	if !d.keyed {
		return d.w.log
	}
	return d.w.log.With(d.logAttrs(nil)...)
}

// logAttrs appends the delivery's log attributes to args, in the order
// log lines carry them: job_id, tenant (but the default), attempt,
// trace_id (when the job has a trace), adopted_attempt.
func (d *delivery) logAttrs(args []any) []any {
	if !d.keyed {
		return args
	}
	args = append(args, "job_id", d.id)
	if d.key.Tenant != job.DefaultTenant {
		args = append(args, "tenant", d.key.Tenant)
	}
	if d.logged != 0 {
		args = append(args, "attempt", d.logged)
		if d.traceID != "" {
			args = append(args, "trace_id", d.traceID)
		}
	}
	if d.logAdopted != 0 {
		args = append(args, "adopted_attempt", d.logAdopted)
	}
	return args
}

// decodeQueued reads a job message: the version of the job's record that
// queued it, with its request. The fleet wrote it, so it is read without
// the strict decoder of submissions (the request is validated after).
func decodeQueued(data []byte, k queue.JobKey) (*job.Record, error) {
	var rec job.Record
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, fmt.Errorf("invalid job message: %w", err)
	}
	switch {
	case rec.Request == nil:
		return nil, errors.New("invalid job message: it carries no request")
	case rec.ID != k.ID || rec.Tenant != k.Tenant || rec.Pool != k.Pool:
		return nil, fmt.Errorf("invalid job message: its record names job %s/%s/%s, its subject %s/%s/%s",
			rec.Tenant, rec.Pool, rec.ID, k.Tenant, k.Pool, k.ID)
	}
	rec.Request.ID, rec.Request.Pool = k.ID, k.Pool
	return &rec, nil
}

func (d *delivery) unregister() {
	d.cancel(nil)
	d.w.runs.remove(d)
}

// situation gathers what the worker knows now, for decide: the record as
// this delivery last read or wrote it, with its revision, which the
// decision's writes are compare-and-sets against. It is the one way a
// situation is made; a caller adds what it alone knows (malformed,
// unsettled, noCapacity, outcome...).
func (d *delivery) situation() *situation {
	w := d.w
	return &situation{rec: d.rec, rev: d.rev, req: d.req, submitted: d.sub, now: time.Now(), self: w.cfg.ID,
		draining: w.Draining(), paused: w.p.Paused(), retryDelay: w.cfg.Retry, recheck: w.cfg.Queue.AckWait,
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
		runs, err := h.Holds(ctx, s.rec.WorkerID, executor.TenantKey(d.key.Tenant), d.id, s.rec.Attempt)
		if err != nil {
			// Without Redis, nobody can tell: the attempt counts as lost,
			// as it does on a fleet without capacity accounting.
			level := slog.LevelWarn
			if errors.Is(err, capacity.ErrUnavailable) {
				level = slog.LevelDebug // the ledger logged the outage once
			}
			d.log().Log(ctx, level, "cannot tell whether the job's worker still runs it", "worker", s.rec.WorkerID, "err", err)
		}
		s.ownerRuns = runs
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

// refreshPast reads the last version of the job's record after a write
// against revision rev was refused: a read answered by a replica of the
// stream that is behind may still say rev (or nothing), and deciding on
// that would only be refused again. It reads a few times, a moment apart,
// then says the record is not settled.
func (d *delivery) refreshPast(ctx context.Context, rev uint64) error {
	for try := 0; ; try++ {
		err := d.refresh(ctx)
		if err == nil && d.rev != rev {
			return nil
		}
		if err != nil && !errors.Is(err, queue.ErrNotFound) {
			return err
		}
		if try == 4 {
			if err == nil {
				err = fmt.Errorf("the record read of job %s is still the version a write against it was refused on (%d)", d.id, rev)
			}
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond << try):
		}
	}
}

// refresh reads the last version of the job's record.
func (d *delivery) refresh(ctx context.Context) error {
	rec, rev, err := d.w.journal.Record(ctx, d.key)
	switch {
	case errors.Is(err, queue.ErrNotFound):
		// The job message is the record's first version: a job has one
		// once it is delivered. The stream lost it (its retention).
		return fmt.Errorf("job %s has no record: %w", d.id, err)
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
		// The record moved (a cancel, a deadline the dispatcher enforced,
		// an earlier delivery that finished it): the next decision is made
		// on what is read now, never on the copy the refused write was
		// decided on.
		if errors.Is(err, queue.ErrConflict) {
			err = d.refreshPast(ctx, d.rev)
		}
		s := d.situation()
		s.unsettled = err
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
			wait := d.started.Sub(d.sub).Seconds()
			w.m.wait.Record(ctx, wait, w.m.poolAttrs)
			w.m.tenantWait.Record(ctx, wait, w.m.byTenant(d.key.Tenant, d.priority()))
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
	task := d.task()
	task.Request, task.Report = req, d
	if act.verb == doRun {
		// Before the clock starts: its tick may replace d.rec.
		task.Artifacts = d.openArtifacts()
	}
	stopProgress := d.progress()
	var out *executor.Outcome
	var err error
	if act.verb == doRun {
		out, err = w.exec.Run(d.ctx, task)
	} else {
		// decide adopts only with an Adopter.
		out, err = w.exec.(executor.Adopter).Adopt(d.ctx, task, act.found)
	}
	stopProgress()
	d.freeSlot()
	return d.ended(ctx, out, err, deadlineBound), true
}

// task names the attempt for the executor.
func (d *delivery) task() *executor.Task {
	w := d.w
	return &executor.Task{Tenant: d.key.Tenant, JobID: d.id, Attempt: d.n, WorkerID: w.cfg.ID, Pool: w.cfg.Pool}
}

// reserve takes the attempt's capacity lease before its record is
// written, so that no capacity costs nothing to undo. It returns the
// decision to settle instead when the worker has no room for it.
func (d *delivery) reserve(ctx context.Context, act action) (action, bool) {
	c := d.w.cfg.Capacity
	req := d.req
	if d.held == nil {
		d.held = &capacity.Holding{Slots: 1, CPUMilli: req.Resources.CPUMilli(), MemoryBytes: req.Resources.MemoryBytes(), GPUs: int64(req.Resources.GPU)}
		d.heldAt = time.Now()
		d.w.runs.hold(d.key.Tenant, *d.held, 1)
	}
	if c == nil || d.lease != nil {
		return action{}, true
	}
	l := capacity.Lease{Tenant: executor.TenantKey(d.key.Tenant), JobID: d.id, Attempt: act.attempt, CPUMilli: req.Resources.CPUMilli(),
		MemoryBytes: req.Resources.MemoryBytes(), GPUs: req.Resources.GPU, StartedAt: time.Now(), Handle: d.msg.Reply()}
	if act.found != nil && !act.found.StartedAt.IsZero() {
		l.StartedAt = act.found.StartedAt
	}
	switch err := c.Reserve(ctx, l); {
	case errors.Is(err, capacity.ErrNoCapacity):
		d.unhold()
		s := d.situation()
		s.noCapacity = err.Error()
		return decide(s), false
	case err != nil:
		d.log().Warn("capacity reservation failed; running on local accounting", "err", err)
	}
	d.lease = &l
	return action{}, true
}

// priority is the job's, from its subject's kind (q1 … q5); 3 when not.
func (d *delivery) priority() int {
	kind, _, _ := d.w.names.ParsePoolJob(d.msg.Subject())
	if len(kind) == 2 && kind[0] == 'q' && kind[1] >= '1' && kind[1] <= '5' {
		return int(kind[1] - '0')
	}
	return job.DefaultPriority
}

// unhold ends what the attempt counts in its tenant's share.
func (d *delivery) unhold() {
	if d.held == nil {
		return
	}
	d.w.runs.hold(d.key.Tenant, *d.held, -1)
	d.w.p.Ran(d.key.Tenant, time.Since(d.heldAt))
	d.held = nil
}

// releaseLease gives the attempt's capacity lease back, if it holds one.
func (d *delivery) releaseLease() {
	if d.lease == nil {
		return
	}
	l := *d.lease
	d.lease = nil
	if err := d.w.cfg.Capacity.Release(context.WithoutCancel(d.w.scope.settle), l); err != nil {
		d.log().Warn("capacity release failed", "err", err)
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
	d.unhold()
	d.releaseLease()
	d.w.p.Free()
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

// onCancel stops the attempt of a job this worker runs, when the
// dispatcher says so: it has recorded the cancel first, so that the
// record, the answer to the user and the outcome agree.
func (w *Worker) onCancel(m *nats.Msg) {
	pool, tenant, id, ok := w.names.ParseStop(m.Subject)
	if !ok || pool != w.cfg.Pool {
		return
	}
	if d := w.runs.get(tenant, id); d != nil {
		// Only what register set is read here: the delivery's key and its
		// cancel, both set before it was registered.
		w.log.Info("cancelling running job", "tenant", tenant, "job_id", id)
		d.cancel(executor.ErrCancelled)
	}
}
