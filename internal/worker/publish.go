package worker

import (
	"context"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/internal/telemetry"
	"github.com/fleet-dev/fleet/job"
)

// What an attempt publishes: its events, the job's result and dead letter.

// publishResult publishes the job's one result and returns the result that
// stands: this one, or the one an earlier delivery published first.
func (a *attempt) publishResult(ctx context.Context, res *job.Result) (*job.Result, error) {
	return queue.PublishResult(ctx, a.w.js, a.w.names, res)
}

// existingResult returns the job's stored result, if it has one.
func (a *attempt) existingResult(ctx context.Context) (*job.Result, error) {
	return queue.LastResult(ctx, a.w.js, a.w.names, a.id)
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
