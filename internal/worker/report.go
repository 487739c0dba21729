package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// An attempt is the executor's Reporter: what the attempt says while it
// runs becomes log and heartbeat events, bounded.

// clock is what a running attempt does in time, on a timer rather than a
// goroutine of its own: once the attempt has run the worker's
// RunningAfter, it stores the attempt's running version that begin held
// back (recordStart); every Progress, it tells JetStream the attempt is
// alive and publishes a heartbeat event, with what the attempt uses every
// UsageInterval.
type clock struct {
	d         *delivery
	mu        sync.Mutex // held by a tick, and by stop
	t         *time.Timer
	stopped   bool
	nextUsage time.Time
}

// progress starts the attempt's clock, until the returned function is
// called, which waits for a tick under way (a running version being
// stored): what the attempt settles on is then known.
func (d *delivery) progress() (stop func()) {
	c := &clock{d: d, nextUsage: time.Now().Add(d.w.cfg.UsageInterval)}
	first := d.w.cfg.Progress
	if d.unrecorded {
		first = d.w.runningAfter()
	}
	c.mu.Lock()
	c.t = time.AfterFunc(first, c.tick)
	c.mu.Unlock()
	return c.stop
}

func (c *clock) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopped = true
	c.t.Stop()
}

func (c *clock) tick() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return
	}
	d := c.d
	if d.unrecorded {
		d.recordStart()
		if d.unrecorded {
			// Not stored yet (an election, a slow server): JetStream
			// must still hear that the attempt lives, or it delivers
			// the job again after the ack wait while it runs.
			if err := d.msg.InProgress(); err != nil {
				d.log().Warn("progress ack failed", "err", err)
			}
		}
		// The first progress is due a Progress after the start; a write
		// that did not get through is tried again then too.
		c.t.Reset(max(d.w.cfg.Progress-d.w.runningAfter(), time.Millisecond))
		return
	}
	if err := d.msg.InProgress(); err != nil {
		d.log().Warn("progress ack failed", "err", err)
	}
	c.t.Reset(d.w.cfg.Progress)
	// Every UsageInterval the heartbeat carries what the attempt uses,
	// when the executor can read it.
	var u *job.Usage
	if now := time.Now(); d.w.cfg.Usage != nil && !now.Before(c.nextUsage) {
		c.nextUsage = now.Add(d.w.cfg.UsageInterval)
		u = d.w.cfg.Usage.Of(d.ctx, executor.TenantKey(d.key.Tenant), d.id, d.n)
	}
	if u == nil {
		d.notice(job.EventHeartbeat, nil)
		return
	}
	d.notice(job.EventHeartbeat, func(e *job.Event) { e.Phase, e.Usage = job.PhaseUsage, u })
}

// recordStartFor bounds one try to store a held-back running version: the
// attempt runs meanwhile, and a write that does not get through is tried
// again at the next tick (the version that ends the attempt records its
// start until then).
const recordStartFor = 2 * time.Second

// recordStart stores the attempt's running version that begin held back,
// a compare-and-set against the version the decision to run was made on.
// Refused, the record moved: a cancel ended the job while it was queued
// (or, its answer lost, the write was stored after all): the attempt
// stops, and settles on what was read.
func (d *delivery) recordStart() {
	ctx, cancel := context.WithTimeout(d.w.scope.settle, recordStartFor)
	defer cancel()
	rec := *d.rec
	rev, err := d.w.journal.WriteRecord(ctx, &rec, d.rev)
	switch {
	case err == nil:
		d.rev, d.unrecorded = rev, false
	case errors.Is(err, queue.ErrConflict), errors.Is(err, queue.ErrFinal):
		// Read past the version the write was refused on: a replica that
		// is behind may still answer with it, and would be taken for a
		// record someone else moved (when the write, its answer lost, was
		// this attempt's own).
		held, heldRev := d.rec, d.rev
		if rerr := d.refreshPast(ctx, heldRev); rerr != nil {
			d.rec, d.rev = held, heldRev // tried again at the next tick
			d.log().Warn("the job's record moved before its attempt was recorded as running, and cannot be read", "err", rerr)
			return
		}
		cur := d.rec
		d.unrecorded = false
		mine := cur.State == job.StateRunning && cur.Attempt == d.n && cur.WorkerID == d.w.cfg.ID
		if !mine {
			d.log().Info("the job's record moved before its attempt was recorded as running; stopping it", "state", cur.State)
			d.cancel(executor.ErrCancelled)
		}
	default:
		d.log().Debug("the attempt's running version not stored yet; trying again", "err", err)
	}
}

// Log implements Reporter: every line goes to the attempt's archived log
// (when the worker has an object store), and a bounded number of them to
// log events.
func (d *delivery) Log(stream, line string) {
	if d.arts != nil {
		d.arts.Log(stream, line)
	}
	d.logMu.Lock()
	d.logs++
	n := d.logs
	d.logMu.Unlock()
	max := d.w.cfg.MaxLogEvents
	switch {
	case n < max:
		d.notice(job.EventLog, func(e *job.Event) { e.Stream, e.Line = stream, line })
	case n == max:
		d.notice(job.EventLog, func(e *job.Event) {
			e.Stream, e.Line = stream, line
			e.Message = fmt.Sprintf("log events stop here (limit %d); the result keeps the tail of each stream", max)
		})
	}
}

// Phase implements Reporter: a heartbeat event that names the new phase.
func (d *delivery) Phase(phase, message string) {
	d.notice(job.EventHeartbeat, func(e *job.Event) { e.Phase, e.Message = phase, message })
}
