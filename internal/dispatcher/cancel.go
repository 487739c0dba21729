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

// Cancel stops a job in whatever state it is. A queued job, or one waiting
// for its next attempt, is finished here with a cancelled result and is
// never started; a running job's worker is told to stop it. Cancelling a
// finished job, or twice, changes nothing and says so.
func (d *Dispatcher) Cancel(ctx context.Context, id string) (*job.CancelReply, error) {
	for {
		s, rev, err := d.store.Status(ctx, id)
		if err != nil {
			return nil, err
		}
		rec := s.Job
		r := &job.CancelReply{JobID: id, State: rec.State}
		switch {
		case rec.State.Final() || rec.State == job.StateRejected:
			r.Message = fmt.Sprintf("nothing to cancel: the job already ended (%s)", rec.State)
			return r, nil
		case rec.CancelRequested:
			r.Message = "a cancel is already in progress"
			return r, nil
		}

		rec.CancelRequested, rec.UpdatedAt = true, time.Now()
		running := rec.State == job.StateRunning
		if !running {
			if err := d.finishCancelled(ctx, rec); err != nil {
				return nil, err
			}
			if rec.State != job.StateCancelled {
				r.State = rec.State
				r.Message = fmt.Sprintf("nothing to cancel: the job already ended (%s)", rec.State)
				return r, nil
			}
		}
		if _, err := d.store.Update(ctx, rec, rev); errors.Is(err, queue.ErrConflict) {
			continue // a worker moved it meanwhile: look again
		} else if err != nil {
			return nil, err
		}
		// Tell any worker holding it, including one that took it from the
		// queue a moment ago.
		notice := nats.NewMsg(d.names.Cancel(id))
		notice.Header.Set(queue.HeaderCancelNotice, "dispatcher")
		if err := d.nc.PublishMsg(notice); err != nil {
			return nil, fmt.Errorf("publish cancel: %w", err)
		}
		r.Cancelled, r.State = true, rec.State
		if running {
			r.Message = fmt.Sprintf("worker %s was told to stop attempt %d", rec.WorkerID, rec.Attempt)
		} else {
			r.Message = "cancelled before it ran"
		}
		d.log.Info("job cancelled", "job_id", id, "state", rec.State)
		return r, nil
	}
}

// finishCancelled publishes the cancelled result and event of a job that
// is not running, and marks rec final. If the job got a result first (a
// worker finished it a moment ago), rec takes that one instead.
func (d *Dispatcher) finishCancelled(ctx context.Context, rec *job.Record) error {
	t := time.Now()
	f := job.Failf(job.ClassCancelled, job.CodeCancelled, "cancelled while %s", rec.State)
	res := &job.Result{JobID: rec.ID, Pool: rec.Pool, Status: job.StatusCancelled, Attempts: rec.Attempt,
		FinishedAt: t, Failure: f, TraceID: rec.TraceID, RunID: rec.RunID, NodeID: rec.NodeID, History: rec.History}
	stood, err := queue.PublishResult(ctx, d.js, d.names, res)
	if err != nil {
		return err
	}
	if stood != res {
		job.NewStatusReply(rec, stood)
		return nil
	}
	if err := d.publishEvent(ctx, &job.Event{JobID: rec.ID, Attempt: rec.Attempt, Type: job.EventCancelled, Time: t,
		Pool: rec.Pool, Failure: f, Message: f.Message, TraceID: rec.TraceID}); err != nil {
		return err
	}
	rec.State, rec.Failure, rec.FinishedAt, rec.NextAttemptAt = job.StateCancelled, f, &t, nil
	return nil
}

// Status returns what the fleet knows of a job.
func (d *Dispatcher) Status(ctx context.Context, id string) (*job.StatusReply, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, _, err := d.store.Status(ctx, id)
	return s, err
}

// onCancel serves cancel requests sent on <prefix>.cancel.<id>. Workers hear
// the same message and stop a running attempt at once; the dispatcher
// records the cancel and finishes a job that is not running. Its own
// notices to workers carry a header and are ignored here.
func (d *Dispatcher) onCancel(m *nats.Msg) {
	if m.Header.Get(queue.HeaderCancelNotice) != "" {
		return
	}
	d.answer(m, func(ctx context.Context) ([]byte, error) {
		r, err := d.Cancel(ctx, d.names.JobID(m.Subject))
		switch {
		case errors.Is(err, queue.ErrNotFound):
			return json.Marshal(&job.ErrorReply{Error: err.Error(), NotFound: true})
		case err != nil:
			d.log.Warn("cancel failed", "subject", m.Subject, "err", err)
			return json.Marshal(&job.ErrorReply{Error: "cancel failed; try again"})
		}
		return json.Marshal(r)
	})
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
