package worker

import (
	"fmt"
	"sync"
	"time"

	"github.com/fleet-dev/fleet/job"
)

// An attempt is the executor's Reporter: what the attempt says while it
// runs becomes log and heartbeat events, bounded.

// progress tells JetStream the attempt is alive, and publishes heartbeat
// events, until the returned function is called.
func (a *attempt) progress() (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(a.w.cfg.Progress)
		defer t.Stop()
		nextUsage := time.Now().Add(a.w.cfg.UsageInterval)
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if err := a.msg.InProgress(); err != nil {
					a.log.Warn("progress ack failed", "err", err)
				}
				seq := a.nextHeartbeat()
				// Every UsageInterval the heartbeat carries what the
				// attempt uses, when the executor can read it.
				var u *job.Usage
				if now := time.Now(); a.w.cfg.Usage != nil && !now.Before(nextUsage) {
					nextUsage = now.Add(a.w.cfg.UsageInterval)
					u = a.w.cfg.Usage.Of(a.ctx, a.id, a.n)
				}
				if u == nil {
					a.eventSeq(job.EventHeartbeat, seq, nil)
					continue
				}
				a.eventSeq(job.EventHeartbeat, seq, func(e *job.Event) { e.Phase, e.Usage = job.PhaseUsage, u })
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

// Log implements Reporter: every line goes to the attempt's archived log
// (when the worker has an object store), and a bounded number of them to
// log events.
func (a *attempt) Log(stream, line string) {
	if a.arts != nil {
		a.arts.Log(stream, line)
	}
	a.logMu.Lock()
	a.logs++
	n := a.logs
	a.logMu.Unlock()
	max := a.w.cfg.MaxLogEvents
	switch {
	case n < max:
		a.eventSeq(job.EventLog, a.seqBase+n, func(e *job.Event) { e.Stream, e.Line = stream, line })
	case n == max:
		a.eventSeq(job.EventLog, a.seqBase+n, func(e *job.Event) {
			e.Stream, e.Line = stream, line
			e.Message = fmt.Sprintf("log events stop here (limit %d); the result keeps the tail of each stream", max)
		})
	}
}

// Phase implements Reporter: a heartbeat event that names the new phase.
func (a *attempt) Phase(phase, message string) {
	a.eventSeq(job.EventHeartbeat, a.nextHeartbeat(), func(e *job.Event) { e.Phase, e.Message = phase, message })
}

// nextHeartbeat numbers the attempt's next heartbeat event.
func (a *attempt) nextHeartbeat() int {
	a.logMu.Lock()
	defer a.logMu.Unlock()
	a.hbSeq++
	return a.seqBase + a.hbSeq
}
