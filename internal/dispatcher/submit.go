package dispatcher

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/internal/telemetry"
	"github.com/fleet-dev/fleet/job"
)

// errTransient marks a failure of the fleet, not of the request: the
// submission may succeed if tried again.
type errTransient struct{ err error }

func (e errTransient) Error() string { return e.err.Error() }
func (e errTransient) Unwrap() error { return e.err }

// Submit processes a request of tenant in this dispatcher, as one on the
// tenant's submit subject would be, and returns the answer. A rejection is
// a reply with Error set; an error means the fleet could not decide now
// (NATS unavailable) and the caller may try again with the same id.
func (d *Dispatcher) Submit(ctx context.Context, tenant string, data []byte) (*job.SubmitReply, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
	}
	reply, err := d.process(ctx, tenant, data)
	if err != nil {
		return nil, fmt.Errorf("submit: %w", err)
	}
	return reply, nil
}

// submitValid is Submit of a request of tenant already decoded and
// validated (job.DecodeRequest, Request.Validate), such as a schedule's
// firing prepared before its time: what is left is its admission and its
// queue write. req is the caller's no more.
func (d *Dispatcher) submitValid(ctx context.Context, tenant string, req *job.Request) (*job.SubmitReply, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
	}
	reply, err := d.run(ctx, tenant, func(ctx context.Context, start time.Time) (*job.SubmitReply, error) {
		if !job.ValidTenant(tenant) {
			return d.accept(ctx, tenant, nil, start)
		}
		return d.admit(ctx, tenant, req, start)
	})
	if err != nil {
		return nil, fmt.Errorf("submit: %w", err)
	}
	return reply, nil
}

// process validates one submission of tenant and, if it is acceptable and
// new, queues its job.
func (d *Dispatcher) process(ctx context.Context, tenant string, data []byte) (*job.SubmitReply, error) {
	return d.run(ctx, tenant, func(ctx context.Context, start time.Time) (*job.SubmitReply, error) {
		return d.accept(ctx, tenant, data, start)
	})
}

// run makes a submission of tenant with accept, in its span and its
// metrics; accept is given the submission's time.
func (d *Dispatcher) run(ctx context.Context, tenant string,
	accept func(context.Context, time.Time) (*job.SubmitReply, error)) (*job.SubmitReply, error) {
	start := time.Now()
	ctx, span := telemetry.Tracer().Start(ctx, "fleet.submit", trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("fleet.tenant", tenant)))
	defer span.End()

	reply, err := accept(ctx, start)
	switch {
	case err != nil:
		span.RecordError(err)
		span.SetStatus(codes.Error, "submission failed")
	case reply.Rejected():
		span.SetStatus(codes.Error, "rejected")
		d.m.rejected.Add(ctx, 1)
	default:
		span.SetAttributes(attribute.String("fleet.job.id", reply.JobID), attribute.Bool("fleet.duplicate", reply.Duplicate))
	}
	d.m.latency.Record(ctx, time.Since(start).Seconds())
	return reply, err
}

// accept turns a request into a job: one write, the first version of the
// job's record, which holds the request (its secrets sealed) and queues
// the job in its pool's stream. That write is a compare-and-set on "the job
// has no record yet", and so the gate that runs a tenant's id once in a
// pool: a request whose id has a record is a duplicate, unless the record
// is a rejection, which a valid request replaces.
func (d *Dispatcher) accept(ctx context.Context, tenant string, data []byte, at time.Time) (*job.SubmitReply, error) {
	if !job.ValidTenant(tenant) {
		return &job.SubmitReply{Error: fmt.Sprintf("tenant %q must be 1 to 64 characters of [A-Za-z0-9_-]", tenant)}, nil
	}
	req, err := job.DecodeRequest(data, d.cfg.Limits)
	if err == nil {
		err = req.Validate(d.cfg.Limits)
	}
	if err == nil && !job.ValidSubmittedID(req.ID) && req.ID != "" {
		// (Valid otherwise: the id of a run's node.)
		err = fmt.Errorf("id %q: an id with a colon is a run's node's job, which the fleet queues from its run: submit the run on runs.submit, or give the job another id", req.ID)
	}
	if err != nil {
		return d.reject(ctx, tenant, lenientID(data), lenientPool(data), err)
	}
	return d.admit(ctx, tenant, req, at)
}

// admit queues the job of a valid request of tenant, if the admission
// accepts it and its id is new; at is its submission's time.
func (d *Dispatcher) admit(ctx context.Context, tenant string, req *job.Request, at time.Time) (*job.SubmitReply, error) {
	q, refused, err := d.admitted(ctx, tenant, req, at)
	if err != nil || refused != nil {
		return refused, err
	}
	_, err = d.jobs.Queue(ctx, q.rec, 0, q.hdr)
	return d.queued(ctx, q, err)
}

// queueing is a request admitted, its job ready to be queued: the first
// version of its record, the headers of that write, and the answer the
// request gets once it is written.
type queueing struct {
	rec   *job.Record
	hdr   nats.Header
	reply *job.SubmitReply
}

// admitted admits a valid request of tenant and makes its job's first
// version ready to be written; the answer instead when the request is
// refused.
func (d *Dispatcher) admitted(ctx context.Context, tenant string, req *job.Request, at time.Time) (*queueing, *job.SubmitReply, error) {
	var err error
	if req.ID == "" {
		req.ID = job.NewID()
	}
	if req.Pool == "" {
		req.Pool = job.DefaultPool
	}
	if req.Priority == 0 {
		req.Priority = job.DefaultPriority
	}
	// The record keeps the request as submitted, whose defaults the
	// worker fills in again: a smaller message to write and to read. (A
	// copy of the top level: defaults that Normalize fills into a part the
	// request gave, its retry policy say, show in both.)
	submitted := *req
	req.Normalize()
	var warning string
	if d.cfg.Admission != nil && !admissionSkipped(ctx) {
		w, err := d.cfg.Admission.Admit(withTenant(ctx, tenant), req)
		if err != nil {
			var te errTransient
			if errors.As(err, &te) {
				return nil, nil, err
			}
			refused, err := d.reject(ctx, tenant, req.ID, req.Pool, err)
			return nil, refused, err
		}
		warning = w
	}
	trace.SpanFromContext(ctx).SetAttributes(attribute.String("fleet.job.id", req.ID), attribute.String("fleet.pool", req.Pool))

	rec := &job.Record{ID: req.ID, Tenant: tenant, Pool: req.Pool, Priority: req.Priority, State: job.StateQueued,
		Event: job.EventQueued, MaxAttempts: req.Retry.MaxAttempts, SubmittedAt: at, UpdatedAt: at,
		TraceID: telemetry.TraceID(ctx), RunID: req.RunID, NodeID: req.NodeID, Labels: req.Labels, Message: warning}
	if nb := req.NotBefore; nb != nil && nb.After(at) {
		// The job waits for its first attempt as it would for a retry.
		rec.NextAttemptAt = nb
		rec.Message = strings.TrimPrefix(warning+"; starts not before "+nb.UTC().Format(time.RFC3339), "; ")
	}
	k := queue.Key(rec)
	if rec.Secrets, err = d.sealer.Seal(k, &submitted); err != nil {
		return nil, nil, fmt.Errorf("seal the request's secrets: %w", err)
	}
	rec.Request = &submitted
	if err := d.ensurePool(ctx, req.Pool); err != nil {
		return nil, nil, errTransient{err}
	}
	d.ensureFeed(tenant, req.Pool)
	if err := d.ensureQueue(ctx, req.Pool, queue.QueueKey{Priority: req.Priority, Tenant: tenant}); err != nil {
		return nil, nil, errTransient{err}
	}
	reply := &job.SubmitReply{JobID: req.ID, Tenant: tenant, Pool: req.Pool, Priority: req.Priority,
		State: job.StateQueued, Warning: warning}
	hdr := nats.Header{}
	telemetry.Propagator.Inject(ctx, queue.HeaderCarrier(hdr))
	if submission := submissionFrom(ctx); submission != "" {
		hdr.Set(job.SubmissionHeader, submission)
	}
	return &queueing{rec: rec, hdr: hdr, reply: reply}, nil, nil
}

// queued answers a request whose job's first version was written, or
// not: err is that write's. The id taken is a duplicate, unless its
// record is a rejection, which is replaced, or the job was queued by
// this very submission (a copy of it, or its own write whose answer was
// lost).
func (d *Dispatcher) queued(ctx context.Context, q *queueing, err error) (*job.SubmitReply, error) {
	rec, hdr, reply := q.rec, q.hdr, q.reply
	k := queue.Key(rec)
	submission := hdr.Get(job.SubmissionHeader)
	if errors.Is(err, queue.ErrExists) {
		old, oldRev, gerr := d.jobs.Latest(ctx, k)
		switch {
		case errors.Is(gerr, queue.ErrNotFound) && oldRev != 0, gerr == nil && old.State == job.StateRejected:
			// Replace a rejection, or versions none of which is the
			// fleet's (their bodies name another job: see queue.Jobs.Latest).
			_, err = d.jobs.Queue(ctx, rec, oldRev, hdr)
		case gerr != nil:
			return nil, errTransient{gerr}
		case submission != "" && d.sameSubmission(ctx, k, old, submission):
			// A copy of the submission that queued the job, sent again
			// while the first waited for its answer: answered as the
			// first would have been.
			reply.State = old.State
			return reply, nil
		default:
			reply.State, reply.Duplicate, reply.Warning = old.State, true, ""
			return reply, nil
		}
	}
	if errors.Is(err, queue.ErrExists) {
		return nil, errTransient{errors.New("the job's record changed while it was queued; try again")}
	}
	if err != nil {
		return nil, errTransient{err}
	}
	d.m.countSubmitted(ctx, rec.Pool)
	return reply, nil
}

// sameSubmission reports whether job k, whose latest version is old, was
// queued by the submission its producer named token. A read that fails
// says no: the answer is then "duplicate", which is true of the job.
func (d *Dispatcher) sameSubmission(ctx context.Context, k queue.JobKey, old *job.Record, token string) bool {
	queued, err := d.jobs.Submission(ctx, k, cmp.Or(old.Priority, job.DefaultPriority))
	return err == nil && queued == token
}

// reject answers a refused request. When the request names a usable id
// and pool, a rejected record says why to whoever watches that id.
func (d *Dispatcher) reject(ctx context.Context, tenant, id, pool string, cause error) (*job.SubmitReply, error) {
	reason := cause.Error()
	d.log.Debug("request rejected", "tenant", tenant, "job_id", id, "reason", reason)
	reply := &job.SubmitReply{JobID: id, Tenant: tenant, Pool: pool, State: job.StateRejected, Error: reason}
	if id == "" || pool == "" {
		return reply, nil
	}
	t := time.Now()
	f := job.Failf(job.ClassRejected, job.CodeInvalid, "%s", reason)
	rec := &job.Record{ID: id, Tenant: tenant, Pool: pool, State: job.StateRejected, Event: job.EventRejected,
		SubmittedAt: t, UpdatedAt: t, Failure: f, Message: reason, TraceID: telemetry.TraceID(ctx)}
	if err := d.ensurePool(ctx, pool); err != nil {
		d.log.Warn("rejected record not written", "job_id", id, "err", err)
		return reply, nil
	}
	d.ensureFeed(tenant, pool)
	// Keep a job that exists; replace only an earlier rejection, and only
	// one for another reason: the same request refused again, a producer's
	// copy sent while the first waited for its answer say, says nothing
	// new, and its job keeps one rejection.
	k := queue.Key(rec)
	rev := uint64(0)
	if old, oldRev, err := d.jobs.Latest(ctx, k); err == nil || errors.Is(err, queue.ErrNotFound) {
		if old != nil && (old.State != job.StateRejected || old.Message == reason) {
			return reply, nil
		}
		rev = oldRev
	}
	if _, err := d.jobs.Write(ctx, rec, rev); err != nil && !errors.Is(err, queue.ErrConflict) {
		d.log.Warn("rejected record not written", "job_id", id, "err", err)
	}
	return reply, nil
}

// lenientPool digs a usable pool out of a request that failed to decode;
// the default pool when it names none.
func lenientPool(data []byte) string {
	var v struct {
		Pool any `json:"pool"`
	}
	if json.Unmarshal(data, &v) != nil {
		return ""
	}
	switch p := v.Pool.(type) {
	case nil:
		return job.DefaultPool
	case string:
		if job.ValidPool(p) {
			return p
		}
	}
	return ""
}

// lenientID digs a usable id out of a request that failed to decode, so the
// rejection can be announced on that job's subject.
func lenientID(data []byte) string {
	var v struct {
		ID any `json:"id"`
	}
	if json.Unmarshal(data, &v) != nil {
		return ""
	}
	if s, ok := v.ID.(string); ok && job.ValidSubmittedID(s) {
		return s
	}
	return ""
}

// Announce publishes a heartbeat event about a job (the reaper's, for the
// jobs of lost workers), best effort.
func (d *Dispatcher) Announce(ctx context.Context, e *job.Event) error {
	m, err := d.names.NoticeMsg(e)
	if err != nil {
		return err
	}
	return d.nc.PublishMsg(m)
}

// ensurePool makes sure a stream holds the jobs of pool before its first
// job is published, once per pool in this dispatcher's life.
// The first submissions of a pool, arriving together, wait for one
// set-up rather than each making its own.
func (d *Dispatcher) ensurePool(ctx context.Context, pool string) error {
	v, _ := d.pools.LoadOrStore(pool, &poolSetup{})
	p := v.(*poolSetup)
	if p.done.Load() {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done.Load() {
		return nil
	}
	if _, err := queue.EnsurePoolStream(ctx, d.js, d.cfg.Queue, pool, d.log); err != nil {
		return err
	}
	p.done.Store(true)
	return nil
}

// ensureQueue makes sure a pool's queue of a tenant and priority has its
// consumer before its first job is queued, once per queue in this
// dispatcher's life.
func (d *Dispatcher) ensureQueue(ctx context.Context, pool string, q queue.QueueKey) error {
	k := queueOf{pool, q}
	if v, ok := d.queues.Load(k); ok && v.(*poolSetup).done.Load() {
		return nil
	}
	v, _ := d.queues.LoadOrStore(k, &poolSetup{})
	p := v.(*poolSetup)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done.Load() {
		return nil
	}
	if err := queue.EnsureQueue(ctx, d.js, d.cfg.Queue, pool, q); err != nil {
		return err
	}
	// The pool's workers bind to it at once (and find it in their next
	// listing if this word is lost); those bound already ignore it.
	_ = d.nc.Publish(d.names.PoolQueues(pool), []byte(d.names.QueueConsumer(q.Priority, q.Tenant)))
	p.done.Store(true)
	return nil
}

// queueOf names a queue of a pool.
type queueOf struct {
	pool string
	q    queue.QueueKey
}

// poolSetup is whether a pool's stream was set up in this dispatcher's life.
type poolSetup struct {
	mu   sync.Mutex
	done atomic.Bool
}

// Requeue gives a job back to its pool at once through the ack subject of
// its message (a lease's handle): the reaper calls it for the jobs of a
// worker that died. Only an ack subject of the jobs stream is accepted: a
// handle comes from Redis, where any worker writes.
func (d *Dispatcher) Requeue(ctx context.Context, handle string) error {
	if !d.isJobAck(handle) || strings.ContainsAny(handle, " *>\t\r\n") {
		return fmt.Errorf("%q is not the ack subject of a job message", handle)
	}
	return d.nc.Publish(handle, []byte("-NAK"))
}

// isJobAck reports whether subject is an ack subject of a pool's jobs:
// $JS.ACK.<stream>.<consumer>.… with the pool's stream and one of its
// queues' consumers (or jobs-<pool>, the single consumer of before).
func (d *Dispatcher) isJobAck(subject string) bool {
	rest, ok := strings.CutPrefix(subject, "$JS.ACK.")
	if !ok {
		return false
	}
	stream, rest, _ := strings.Cut(rest, ".")
	consumer, _, _ := strings.Cut(rest, ".")
	pool, ok := strings.CutPrefix(stream, d.names.PoolStreamV2(""))
	if !ok || !job.ValidPool(pool) {
		return false
	}
	_, _, queue := d.names.ParseQueueConsumer(consumer)
	return queue || consumer == d.names.PoolConsumer(pool)
}

// batched is one request of a batch (see submitBatch), and its answer.
type batched struct {
	ctx    context.Context
	tenant string
	req    *job.Request
	reply  *job.SubmitReply
	err    error

	// index is its place in the batch.
	index int
	q     *queueing
	fut   jetstream.PubAckFuture
	start time.Time
	span  trace.Span
}

// batchAdmitters bounds the admissions of a batch made side by side: an
// admission that waits (for a pool's first worker, say) holds only its
// own.
const batchAdmitters = 8

// submitBatch is submitValid of many requests at once: each is admitted
// as it would be alone and its job's first version sent without waiting
// for its answer, while the answers are read as they come, so that the
// writes share the connection's and the stream's. A write not answered
// within firstBatchWrite of its sending, or that failed, is made again
// alone, as submitValid makes it: each request gets the answer submitValid
// would give it, handed to answered (called from one goroutine, in the
// order the requests were sent) before submitBatch returns. Each request
// carries a submission token of its own, so that a write stored whose
// answer was lost is known as its own.
func (d *Dispatcher) submitBatch(subs []*batched, answered func(*batched)) {
	sent := make(chan *batched, len(subs))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(batchAdmitters, len(subs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1) - 1; i < int64(len(subs)); i = next.Add(1) - 1 {
				subs[i].index = int(i)
				d.sendBatched(subs[i])
				sent <- subs[i]
			}
		}()
	}
	go func() {
		wg.Wait()
		close(sent)
	}()
	t := time.NewTimer(firstBatchWrite)
	t.Stop()
	for b := range sent {
		if b.fut != nil {
			err := d.awaitBatched(b, t)
			if err != nil && b.ctx.Err() == nil {
				// Made again alone, with its retries.
				_, err = d.jobs.Queue(b.ctx, b.q.rec, 0, b.q.hdr)
			}
			b.reply, b.err = d.queued(b.ctx, b.q, err)
			d.endBatched(b)
		}
		answered(b)
	}
}

// awaitBatched waits for the answer of a batched write, until
// firstBatchWrite after it was sent; t is the batch's timer, stopped.
func (d *Dispatcher) awaitBatched(b *batched, t *time.Timer) error {
	select {
	case <-b.fut.Ok():
		return nil
	case err := <-b.fut.Err():
		return err
	default:
	}
	t.Reset(time.Until(b.start.Add(firstBatchWrite)))
	defer t.Stop()
	select {
	case <-b.fut.Ok():
		return nil
	case err := <-b.fut.Err():
		return err
	case <-t.C:
		return jetstream.ErrAsyncPublishTimeout
	case <-b.ctx.Done():
		return b.ctx.Err()
	}
}

// firstBatchWrite is how long a batch waits for the answers of its writes
// before it makes the ones not answered again alone: as long as the first
// try of a write alone waits for its own.
const firstBatchWrite = 500 * time.Millisecond

// sendBatched admits one request of a batch and sends its job's first
// version; a request refused, or whose write could not be sent, has its
// answer at once.
func (d *Dispatcher) sendBatched(b *batched) {
	b.start = time.Now()
	b.ctx, b.span = telemetry.Tracer().Start(b.ctx, "fleet.submit", trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("fleet.tenant", b.tenant)))
	ctx := withSubmission(b.ctx, job.NewID())
	if !job.ValidTenant(b.tenant) {
		b.reply, b.err = d.accept(ctx, b.tenant, nil, b.start)
		d.endBatched(b)
		return
	}
	var refused *job.SubmitReply
	b.q, refused, b.err = d.admitted(ctx, b.tenant, b.req, b.start)
	if b.err != nil || refused != nil {
		b.reply = refused
		d.endBatched(b)
		return
	}
	if b.fut, b.err = d.jobs.QueueAsync(b.q.rec, b.q.hdr); b.err != nil {
		b.fut, b.err = nil, nil
		_, err := d.jobs.Queue(ctx, b.q.rec, 0, b.q.hdr)
		b.reply, b.err = d.queued(ctx, b.q, err)
		d.endBatched(b)
	}
}

// endBatched ends a batched request's span and counts it, as run does.
func (d *Dispatcher) endBatched(b *batched) {
	if b.err != nil {
		b.err = fmt.Errorf("submit: %w", b.err)
	}
	switch {
	case b.err != nil:
		b.span.RecordError(b.err)
		b.span.SetStatus(codes.Error, "submission failed")
	case b.reply.Rejected():
		b.span.SetStatus(codes.Error, "rejected")
		d.m.rejected.Add(b.ctx, 1)
	default:
		b.span.SetAttributes(attribute.String("fleet.job.id", b.reply.JobID), attribute.Bool("fleet.duplicate", b.reply.Duplicate))
	}
	d.m.latency.Record(b.ctx, time.Since(b.start).Seconds())
	b.span.End()
}
