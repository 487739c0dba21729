package worker

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/lifecycle"
	"github.com/fleet-dev/fleet/job"
)

// An attempt is the executor's Reporter: what the attempt says while it
// runs becomes log and heartbeat events, bounded.

// progress tells JetStream the attempt is alive, and publishes heartbeat
// events, until the returned function is called.
func (d *delivery) progress() (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	nextUsage := time.Now().Add(d.w.cfg.UsageInterval)
	go func() {
		defer wg.Done()
		lifecycle.Tick(ctx, d.w.cfg.Progress, func(context.Context) {
			if err := d.msg.InProgress(); err != nil {
				d.log().Warn("progress ack failed", "err", err)
			}
			// Every UsageInterval the heartbeat carries what the attempt
			// uses, when the executor can read it.
			var u *job.Usage
			if now := time.Now(); d.w.cfg.Usage != nil && !now.Before(nextUsage) {
				nextUsage = now.Add(d.w.cfg.UsageInterval)
				u = d.w.cfg.Usage.Of(d.ctx, executor.TenantKey(d.key.Tenant), d.id, d.n)
			}
			if u == nil {
				d.notice(job.EventHeartbeat, nil)
				return
			}
			d.notice(job.EventHeartbeat, func(e *job.Event) { e.Phase, e.Usage = job.PhaseUsage, u })
		})
	}()
	return func() { cancel(); wg.Wait() }
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
