package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
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

// Submit processes a request in this dispatcher, as one on the direct
// subject would be, and returns the answer. A rejection is a reply with
// Error set; an error means the fleet could not decide now (NATS
// unavailable) and the caller may try again with the same id.
func (d *Dispatcher) Submit(ctx context.Context, data []byte) (*job.SubmitReply, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
	}
	reply, err := d.process(ctx, data, 0)
	if err != nil {
		return nil, fmt.Errorf("submit: %w", err)
	}
	return reply, nil
}

// process validates one submission and, if it is acceptable and new,
// records and publishes its job. seq is its sequence in the submit stream,
// 0 for a submission that came directly.
func (d *Dispatcher) process(ctx context.Context, data []byte, seq uint64) (*job.SubmitReply, error) {
	start := time.Now()
	ctx, span := telemetry.Tracer().Start(ctx, "fleet.submit", trace.WithSpanKind(trace.SpanKindConsumer))
	defer span.End()

	reply, err := d.accept(ctx, data, seq, start)
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

// accept turns a request into a job. The job's record is created first and
// is the gate that runs an id once: a request whose id has a record is a
// duplicate, unless the record is a rejection (replaced) or was created by
// an earlier delivery of this same submission (which then finishes here).
func (d *Dispatcher) accept(ctx context.Context, data []byte, seq uint64, at time.Time) (*job.SubmitReply, error) {
	req, err := job.DecodeRequest(data, d.cfg.Limits)
	if err == nil {
		err = req.Validate(d.cfg.Limits)
	}
	if err != nil {
		return d.reject(ctx, lenientID(data), "", err)
	}
	if req.ID == "" {
		req.ID = job.NewID()
	}
	req.Normalize()
	var warning string
	if d.cfg.Admission != nil {
		w, err := d.cfg.Admission.Admit(ctx, req)
		if err != nil {
			var te errTransient
			if errors.As(err, &te) {
				return nil, err
			}
			return d.reject(ctx, req.ID, req.Pool, err)
		}
		warning = w
	}
	trace.SpanFromContext(ctx).SetAttributes(attribute.String("fleet.job.id", req.ID), attribute.String("fleet.pool", req.Pool))
	traceID := telemetry.TraceID(ctx)

	rec := &job.Record{ID: req.ID, Pool: req.Pool, State: job.StateQueued, MaxAttempts: req.Retry.MaxAttempts,
		SubmittedAt: at, UpdatedAt: at, TraceID: traceID, RunID: req.RunID, NodeID: req.NodeID, Labels: req.Labels,
		SubmitSeq: seq}
	queuedMsg := warning
	if nb := req.NotBefore; nb != nil && nb.After(at) {
		// The job waits for its first attempt as it would for a retry.
		rec.NextAttemptAt = nb
		queuedMsg = strings.TrimPrefix(warning+"; starts not before "+nb.UTC().Format(time.RFC3339), "; ")
	}
	rev, err := d.store.Create(ctx, rec)
	duplicate := false
	if errors.Is(err, queue.ErrExists) {
		old, oldRev, gerr := d.store.Get(ctx, req.ID)
		switch {
		case gerr != nil:
			return nil, errTransient{gerr}
		case old.State == job.StateRejected:
			rev, err = d.store.Update(ctx, rec, oldRev)
		case old.State == job.StateQueued && old.Attempt == 0 && (seq == 0 || old.SubmitSeq == seq):
			// This submission sent or delivered again: the dispatcher that
			// recorded it may have died before it published the job, so it
			// is published again. The job's message id makes a copy that
			// JetStream has a duplicate it drops (within its window; a
			// later copy is settled by the record, and never runs twice).
			rec, rev, err = old, oldRev, nil
			duplicate = seq == 0 || old.SubmitSeq != seq
		default:
			return &job.SubmitReply{JobID: req.ID, State: old.State, Duplicate: true}, nil
		}
	}
	if err != nil {
		return nil, errTransient{err}
	}

	if err := d.ensurePool(ctx, req.Pool); err != nil {
		return nil, errTransient{err}
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encode job: %w", err)
	}
	m := nats.NewMsg(d.names.Jobs(req.Pool))
	m.Data = body
	m.Header.Set(queue.HeaderMsgID, req.ID)
	m.Header.Set(queue.HeaderSubmittedAt, rec.SubmittedAt.UTC().Format(time.RFC3339Nano))
	m.Header.Set(queue.HeaderRecordRev, strconv.FormatUint(rev, 10))
	telemetry.Propagator.Inject(ctx, queue.HeaderCarrier(m.Header))

	// The queued event goes out before the job, on the same connection, so
	// that it comes before anything a worker says about the job.
	queued, err := d.publishEventAsync(&job.Event{JobID: req.ID, Type: job.EventQueued, Time: at, Pool: req.Pool,
		TraceID: traceID, Message: queuedMsg})
	if err != nil {
		return nil, errTransient{err}
	}
	published, err := d.js.PublishMsgAsync(m)
	if err != nil {
		return nil, errTransient{fmt.Errorf("publish job %s: %w", req.ID, err)}
	}
	for _, f := range []jetstream.PubAckFuture{queued, published} {
		if _, err := queue.Await(ctx, d.js, f); err != nil {
			return nil, errTransient{err}
		}
	}
	if duplicate {
		return &job.SubmitReply{JobID: req.ID, State: job.StateQueued, Duplicate: true}, nil
	}
	d.m.submitted.Add(ctx, 1, metric.WithAttributeSet(attribute.NewSet(attribute.String("pool", req.Pool))))
	return &job.SubmitReply{JobID: req.ID, State: job.StateQueued, Warning: warning}, nil
}

// reject answers a refused request. When the request names a usable id, a
// rejected event and record say why to whoever watches that id.
func (d *Dispatcher) reject(ctx context.Context, id, pool string, cause error) (*job.SubmitReply, error) {
	reason := cause.Error()
	d.log.Debug("request rejected", "job_id", id, "reason", reason)
	if id == "" {
		id = job.NewID()
	}
	if pool == "" {
		pool = job.DefaultPool
	}
	t := time.Now()
	f := job.Failf(job.ClassRejected, job.CodeInvalid, "%s", reason)
	if err := d.publishEvent(ctx, &job.Event{JobID: id, Type: job.EventRejected, Time: t, Pool: pool,
		Failure: f, Message: reason, TraceID: telemetry.TraceID(ctx)}); err != nil {
		d.log.Warn("rejected event not published", "job_id", id, "err", err)
	}
	rec := &job.Record{ID: id, Pool: pool, State: job.StateRejected, SubmittedAt: t, UpdatedAt: t, Failure: f}
	if _, err := d.store.Create(ctx, rec); errors.Is(err, queue.ErrExists) {
		// Keep a job that exists; replace only an earlier rejection.
		if old, rev, err := d.store.Get(ctx, id); err == nil && old.State == job.StateRejected {
			_, _ = d.store.Update(ctx, rec, rev)
		}
	}
	return &job.SubmitReply{JobID: id, State: job.StateRejected, Error: reason}, nil
}

// publishEventAsync starts publishing an event; wait for it with
// queue.Await.
func (d *Dispatcher) publishEventAsync(e *job.Event) (jetstream.PubAckFuture, error) {
	m, err := d.names.EventMsg(e, 0)
	if err != nil {
		return nil, err
	}
	return d.js.PublishMsgAsync(m)
}

// publishEvent publishes an event and waits until it is stored.
func (d *Dispatcher) publishEvent(ctx context.Context, e *job.Event) error {
	m, err := d.names.EventMsg(e, 0)
	if err != nil {
		return err
	}
	_, err = queue.Publish(ctx, d.js, m)
	return err
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
	if s, ok := v.ID.(string); ok && job.ValidID(s) {
		return s
	}
	return ""
}

// Announce publishes an event about a job on its events subject and waits
// until it is stored; the reaper uses it for jobs of lost workers.
func (d *Dispatcher) Announce(ctx context.Context, e *job.Event) error {
	m, err := d.names.EventMsg(e, 0)
	if err != nil {
		return err
	}
	m.Header.Set(queue.HeaderMsgID, fmt.Sprintf("%s/%d/%s", e.JobID, e.Attempt, e.Phase))
	_, err = queue.Publish(ctx, d.js, m)
	return err
}

// ensurePool makes sure a stream holds the jobs of pool before its first
// job is published, once per pool in this dispatcher's life.
func (d *Dispatcher) ensurePool(ctx context.Context, pool string) error {
	if _, ok := d.pools.Load(pool); ok {
		return nil
	}
	stream, err := queue.PoolStream(ctx, d.js, d.cfg.Queue, pool, d.log)
	if err != nil {
		return err
	}
	d.pools.Store(pool, stream)
	return nil
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

// isJobAck reports whether subject is an ack subject of a jobs stream:
// $JS.ACK.<stream>.jobs-<pool>.… with the pool's stream, or the shared one.
func (d *Dispatcher) isJobAck(subject string) bool {
	rest, ok := strings.CutPrefix(subject, "$JS.ACK.")
	if !ok {
		return false
	}
	stream, rest, _ := strings.Cut(rest, ".")
	consumer, _, _ := strings.Cut(rest, ".")
	pool, ok := strings.CutPrefix(consumer, "jobs-")
	return ok && job.ValidPool(pool) && (stream == d.names.JobsStream(pool) || stream == d.names.SharedJobsStream())
}
