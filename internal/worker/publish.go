package worker

import (
	"time"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/internal/telemetry"
	"github.com/fleet-dev/fleet/job"
)

// What a delivery publishes: its events and the job's dead letter, through
// the worker's journal.

// deadLetter copies the request to the pool's dead-letter subject with its
// last failure, and announces it.
func (d *delivery) deadLetter(f *job.Failure, attempts int) []pending {
	var out []pending
	p, err := d.w.journal.DeadLetter(d.id, d.w.cfg.Pool, d.msg.Data(), d.msg.Headers().Get(queue.HeaderSubmittedAt), f, attempts)
	if err != nil {
		d.log.Warn("dead letter not published", "err", err)
	} else {
		out = append(out, p)
	}
	return append(out, d.event(job.EventDeadLettered, func(e *job.Event) {
		e.Attempt, e.Failure = attempts, f
		e.Message = "request copied to " + d.w.names.DLQ(d.w.cfg.Pool)
	}))
}

func (d *delivery) event(t job.EventType, fill func(*job.Event)) pending {
	return d.eventSeq(t, 0, fill)
}

// eventSeq publishes an event without waiting; the returned pending is nil
// for log and heartbeat events, and when publishing could not even start.
func (d *delivery) eventSeq(t job.EventType, seq int, fill func(*job.Event)) pending {
	e := &job.Event{JobID: d.id, Attempt: d.n, Type: t, Time: time.Now(), WorkerID: d.w.cfg.ID,
		Pool: d.w.cfg.Pool, Backend: d.w.cfg.Backend, TraceID: d.traceIDOr()}
	if fill != nil {
		fill(e)
	}
	p, err := d.w.journal.Event(e, seq)
	if err != nil {
		d.log.Warn("event not published", "type", t, "err", err)
		return nil
	}
	return p
}

// traceIDOr is the attempt's trace id, or the job's when the attempt has
// none.
func (d *delivery) traceIDOr() string {
	if id := telemetry.TraceID(d.ctx); id != "" {
		return id
	}
	if d.rec != nil {
		return d.rec.TraceID
	}
	return ""
}
