package worker

import (
	"time"

	"github.com/fleet-dev/fleet/internal/telemetry"
	"github.com/fleet-dev/fleet/job"
)

// What a delivery publishes besides its job's record: the dead letter of
// a job that failed, and a running attempt's heartbeat and log events.

// deadLetter copies the job's message to its pool's dead letters with its
// last failure.
func (d *delivery) deadLetter(f *job.Failure, attempts int) pending {
	p, err := d.w.journal.DeadLetter(d.key, d.msg.Data(), f, attempts)
	if err != nil {
		d.log().Warn("dead letter not published", "err", err)
		return nil
	}
	return p
}

// notice sends a heartbeat or log event of the attempt, best effort.
func (d *delivery) notice(t job.EventType, fill func(*job.Event)) {
	e := &job.Event{JobID: d.id, Tenant: d.key.Tenant, Attempt: d.n, Type: t, Time: time.Now(), WorkerID: d.w.cfg.ID,
		Pool: d.w.cfg.Pool, Backend: d.w.cfg.Backend, TraceID: d.traceIDOr()}
	if fill != nil {
		fill(e)
	}
	if err := d.w.journal.Notice(e); err != nil {
		d.log().Warn("event not published", "type", t, "err", err)
	}
}

// traceIDOr is the attempt's trace id, or the job's when the attempt has
// none.
func (d *delivery) traceIDOr() string {
	if id := telemetry.TraceID(d.ctx); id != "" {
		return id
	}
	return d.traceID
}
