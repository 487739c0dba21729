package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// Cancel stops a job of tenant in whatever state it is. A queued job, or
// one waiting for its next attempt, is finished here with a cancelled
// result and is never started; a running job's record says a cancel was
// asked for, and its pool's workers are told to stop it. Cancelling a
// finished job, or twice, changes nothing and says so.
func (d *Dispatcher) Cancel(ctx context.Context, tenant, id string) (*job.CancelReply, error) {
	for {
		rec, rev, err := d.find(ctx, tenant, id)
		if err != nil {
			return nil, err
		}
		r := &job.CancelReply{JobID: id, State: rec.State}
		switch {
		case rec.State.Final() || rec.State == job.StateRejected:
			// A run's node's end is written again: the dispatcher that
			// ended it may have died before it wrote it.
			if err := d.nodeEnded(ctx, rec); err != nil {
				return nil, err
			}
			r.Message = fmt.Sprintf("nothing to cancel: the job already ended (%s)", rec.State)
			return r, nil
		case rec.CancelRequested:
			r.Message = "a cancel is already in progress"
			return r, nil
		}
		now := time.Now()
		next := rec.Version()
		next.CancelRequested, next.UpdatedAt = true, now
		running := rec.State == job.StateRunning
		if running {
			next.Event, next.Phase = job.EventHeartbeat, job.PhaseCancelRequested
			next.Message = fmt.Sprintf("cancel requested; worker %s is told to stop attempt %d", rec.WorkerID, rec.Attempt)
		} else {
			f := job.Failf(job.ClassCancelled, job.CodeCancelled, "cancelled while %s", rec.State)
			next.State, next.Event, next.Failure, next.Message = job.StateCancelled, job.EventCancelled, f, f.Message
			next.FinishedAt, next.NextAttemptAt = &now, nil
			next.Result = &job.Result{JobID: id, Pool: rec.Pool, Status: job.StatusCancelled, Attempts: rec.Attempt,
				FinishedAt: now, Failure: f, TraceID: rec.TraceID, RunID: rec.RunID, NodeID: rec.NodeID, History: rec.History}
		}
		if _, err := d.jobs.Write(ctx, next, rev); errors.Is(err, queue.ErrConflict) || errors.Is(err, queue.ErrFinal) {
			continue // a worker moved it meanwhile: look again
		} else if err != nil {
			return nil, err
		}
		// Tell the pool's workers, including one that took it from the
		// queue a moment ago.
		if err := d.nc.Publish(d.names.Stop(rec.Pool, tenant, id), nil); err != nil {
			return nil, fmt.Errorf("publish cancel: %w", err)
		}
		// A run's node ended here takes the nodes after it on.
		if err := d.nodeEnded(ctx, next); err != nil {
			return nil, err
		}
		r.Cancelled, r.State = true, next.State
		if running {
			r.Message = fmt.Sprintf("worker %s was told to stop attempt %d", rec.WorkerID, rec.Attempt)
		} else {
			r.Message = "cancelled before it ran"
		}
		d.log.Info("job cancelled", "tenant", tenant, "job_id", id, "state", rec.State)
		return r, nil
	}
}

// Status returns what the fleet knows of a job of tenant.
func (d *Dispatcher) Status(ctx context.Context, tenant, id string) (*job.StatusReply, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rec, _, err := d.find(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	return job.StatusOf(rec), nil
}

// History returns every version of the record of a job of tenant, oldest
// first, without the request's secrets.
func (d *Dispatcher) History(ctx context.Context, tenant, id string) (*job.HistoryReply, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rec, _, err := d.find(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	recs, seqs, err := d.jobs.History(ctx, queue.Key(rec))
	if err != nil {
		return nil, err
	}
	for _, r := range recs {
		r.Secrets = ""
	}
	notices, err := queue.Notices(ctx, d.js, d.names, queue.Key(rec))
	if err != nil {
		d.log.Debug("the history of a job without its notices", "job_id", id, "err", err)
	}
	return &job.HistoryReply{Records: recs, Seqs: seqs, Notices: notices}, nil
}

// RetryDeadLetter submits a tenant's dead-lettered job again, as a new job
// (see queue.RetryDeadLetter).
func (d *Dispatcher) RetryDeadLetter(ctx context.Context, tenant, id string) (*job.SubmitReply, error) {
	return queue.RetryDeadLetter(ctx, d.js, d.names, d.sealer, tenant, id,
		func(ctx context.Context, data []byte) (*job.SubmitReply, error) { return d.process(ctx, tenant, data) })
}

// find returns the last record version of a tenant's job, in the pool a
// dispatcher queued it in (see queue.Jobs.Find): status, cancel, history,
// outputs and logs all read the job through it.
func (d *Dispatcher) find(ctx context.Context, tenant, id string) (*job.Record, uint64, error) {
	if !job.ValidID(id) {
		return nil, 0, fmt.Errorf("%w: %q is not a job id", queue.ErrNotFound, id)
	}
	if !job.ValidTenant(tenant) {
		return nil, 0, fmt.Errorf("%w: %q is not a tenant", errInvalid, tenant)
	}
	pools, err := d.poolList(ctx, false)
	if err != nil {
		return nil, 0, err
	}
	rec, rev, err := d.jobs.Find(ctx, tenant, id, pools)
	if errors.Is(err, queue.ErrNotFound) {
		// A pool another dispatcher made a moment ago: look again.
		if fresh, lerr := d.poolList(ctx, true); lerr == nil && len(fresh) != len(pools) {
			return d.jobs.Find(ctx, tenant, id, fresh)
		}
	}
	return rec, rev, err
}

// poolList returns the pools that have a stream, listed at most once a
// second unless refresh.
func (d *Dispatcher) poolList(ctx context.Context, refresh bool) ([]string, error) {
	d.poolsMu.Lock()
	defer d.poolsMu.Unlock()
	if !refresh && d.poolsListed.After(time.Now().Add(-time.Second)) {
		return d.poolNames, nil
	}
	pools, err := d.jobs.Pools(ctx)
	if err != nil {
		if d.poolNames != nil {
			return d.poolNames, nil
		}
		return nil, err
	}
	d.poolNames, d.poolsListed = pools, time.Now()
	return pools, nil
}

// onRequest serves the tenants' requests about jobs,
// <prefix>.t.<tenant>.{cancel,status,history}.<id>; the tenant comes from
// the subject, which the NATS permissions of an authenticated fleet
// confine to the producer's own.
func (d *Dispatcher) onRequest(m *nats.Msg) {
	tenant, verb, id, ok := d.names.ParseTenantRequest(m.Subject)
	if !ok {
		return
	}
	d.answer(m, func(ctx context.Context) ([]byte, error) {
		var v any
		var err error
		switch verb {
		case "cancel":
			v, err = d.Cancel(ctx, tenant, id)
		case "status":
			v, err = d.Status(ctx, tenant, id)
		case "history":
			v, err = d.History(ctx, tenant, id)
		case "retry":
			v, err = d.RetryDeadLetter(ctx, tenant, id)
		case "uploads":
			v, err = d.Uploads(ctx, tenant)
		case "feed":
			v, err = d.FeedConsumer(ctx, tenant, id, m.Data)
		default:
			return json.Marshal(&job.ErrorReply{Error: "unknown request " + verb})
		}
		return d.replyOf(v, err, verb, m.Subject)
	})
}

// replyOf encodes the answer to a request: v, or the error's reply.
func (d *Dispatcher) replyOf(v any, err error, verb, subject string) ([]byte, error) {
	switch {
	case errors.Is(err, queue.ErrNotFound):
		return json.Marshal(&job.ErrorReply{Error: err.Error(), NotFound: true})
	case isInvalid(err):
		return json.Marshal(&job.ErrorReply{Error: err.Error(), Invalid: true})
	case err != nil:
		d.log.Warn(verb+" failed", "subject", subject, "err", err)
		return json.Marshal(&job.ErrorReply{Error: verb + " failed; try again", Retry: true})
	}
	return json.Marshal(v)
}

// answer carries out a request off the connection's goroutine, within ten
// seconds, and sends the answer when the request has a reply subject.
func (d *Dispatcher) answer(m *nats.Msg, do func(context.Context) ([]byte, error)) {
	d.inFlight.Add(1)
	go func() {
		defer d.inFlight.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		data, err := do(ctx)
		if m.Reply != "" && err == nil {
			_ = m.Respond(data)
		}
	}()
}
