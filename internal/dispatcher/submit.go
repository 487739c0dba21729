package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

// Reply is the answer to a submission, on NATS and over HTTP.
type Reply struct {
	JobID string    `json:"job_id,omitempty"`
	State job.State `json:"state,omitempty"`
	// Duplicate is set when a job with this id already exists; the request
	// was not run again.
	Duplicate bool   `json:"duplicate,omitempty"`
	Warning   string `json:"warning,omitempty"`
	Error     string `json:"error,omitempty"`
	// Stream and Seq make the answer to a JetStream publish a valid
	// publish acknowledgement, so js.Publish works as a producer too.
	Stream string `json:"stream,omitempty"`
	Seq    uint64 `json:"seq,omitempty"`
}

// Rejected reports whether the submission was refused.
func (r *Reply) Rejected() bool { return r.Error != "" }

// errTransient marks a failure of the fleet, not of the request: the
// submission may succeed if tried again.
type errTransient struct{ err error }

func (e errTransient) Error() string { return e.err.Error() }
func (e errTransient) Unwrap() error { return e.err }

// Submit validates a request and, if it is acceptable and new, records and
// publishes its job. A rejection is a Reply with Error set; an error means
// the fleet could not decide (NATS unavailable) and the caller may retry.
func (d *Dispatcher) Submit(ctx context.Context, data []byte) (*Reply, error) {
	start := now()
	ctx, span := telemetry.Tracer().Start(ctx, "fleet.submit", trace.WithSpanKind(trace.SpanKindServer))
	defer span.End()

	reply, err := d.submit(ctx, data, start)
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

func (d *Dispatcher) submit(ctx context.Context, data []byte, at time.Time) (*Reply, error) {
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

	// A job id is run once: an existing record, other than a rejection,
	// answers the request.
	rec, rev, err := d.store.Get(ctx, req.ID)
	switch {
	case err == nil && rec.State != job.StateRejected:
		return &Reply{JobID: req.ID, State: rec.State, Duplicate: true}, nil
	case err != nil && !errors.Is(err, queue.ErrNotFound):
		return nil, errTransient{err}
	}

	trace.SpanFromContext(ctx).SetAttributes(attribute.String("fleet.job.id", req.ID), attribute.String("fleet.pool", req.Pool))
	traceID := telemetry.TraceID(ctx)
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encode job: %w", err)
	}
	m := nats.NewMsg(d.names.Jobs(req.Pool))
	m.Data = body
	m.Header.Set(queue.HeaderMsgID, req.ID)
	m.Header.Set(queue.HeaderSubmittedAt, at.UTC().Format(time.RFC3339Nano))
	if warning != "" {
		m.Header.Set(queue.HeaderWarning, warning)
	}
	telemetry.Propagator.Inject(ctx, queue.HeaderCarrier(m.Header))

	// The queued event goes out before the job, so that it comes before
	// anything a worker says about the job.
	queued, err := d.publishEvent(&job.Event{JobID: req.ID, Type: job.EventQueued, Time: at, Pool: req.Pool,
		TraceID: traceID, Message: warning})
	if err != nil {
		return nil, errTransient{err}
	}
	ack, err := d.js.PublishMsg(ctx, m)
	if err != nil {
		return nil, errTransient{fmt.Errorf("publish job %s: %w", req.ID, err)}
	}
	if ack.Duplicate {
		// A concurrent submission of the same id published it first.
		return &Reply{JobID: req.ID, State: job.StateQueued, Duplicate: true}, nil
	}
	newRec := &job.Record{ID: req.ID, Pool: req.Pool, State: job.StateQueued, MaxAttempts: req.Retry.MaxAttempts,
		SubmittedAt: at, UpdatedAt: at, TraceID: traceID, RunID: req.RunID, NodeID: req.NodeID, Labels: req.Labels}
	if rec != nil {
		_, err = d.store.Update(ctx, newRec, rev)
	} else {
		_, err = d.store.Create(ctx, newRec)
	}
	// Exists or a conflict: a worker already took the job and wrote its
	// state, or a concurrent duplicate did; the job message is published
	// once either way (its id de-duplicates it).
	if err != nil && !errors.Is(err, queue.ErrExists) && !errors.Is(err, queue.ErrConflict) {
		return nil, errTransient{err}
	}
	if err := waitFuture(ctx, queued); err != nil {
		return nil, errTransient{err}
	}
	d.m.submitted.Add(ctx, 1, metric.WithAttributes(attribute.String("pool", req.Pool)))
	return &Reply{JobID: req.ID, State: job.StateQueued, Warning: warning}, nil
}

// reject answers a refused request. When the request names a usable id, a
// rejected event and record say why to whoever watches that id.
func (d *Dispatcher) reject(ctx context.Context, id, pool string, cause error) (*Reply, error) {
	reason := cause.Error()
	d.log.Debug("request rejected", "job_id", id, "reason", reason)
	if id == "" {
		id = job.NewID()
	}
	if pool == "" {
		pool = job.DefaultPool
	}
	t := now()
	f := job.Failf(job.ClassRejected, job.CodeInvalid, "%s", reason)
	if fut, err := d.publishEvent(&job.Event{JobID: id, Type: job.EventRejected, Time: t, Pool: pool,
		Failure: f, Message: reason, TraceID: telemetry.TraceID(ctx)}); err == nil {
		_ = waitFuture(ctx, fut)
	}
	rec := &job.Record{ID: id, Pool: pool, State: job.StateRejected, SubmittedAt: t, UpdatedAt: t, Failure: f}
	if _, err := d.store.Create(ctx, rec); errors.Is(err, queue.ErrExists) {
		// Keep a job that exists; replace only an earlier rejection.
		if old, rev, err := d.store.Get(ctx, id); err == nil && old.State == job.StateRejected {
			_, _ = d.store.Update(ctx, rec, rev)
		}
	}
	return &Reply{JobID: id, State: job.StateRejected, Error: reason}, nil
}

func (d *Dispatcher) publishEvent(e *job.Event) (jetstream.PubAckFuture, error) {
	m, err := d.names.EventMsg(e, 0)
	if err != nil {
		return nil, err
	}
	return d.js.PublishMsgAsync(m)
}

func waitFuture(ctx context.Context, f jetstream.PubAckFuture) error {
	select {
	case <-f.Ok():
		return nil
	case err := <-f.Err():
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
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
