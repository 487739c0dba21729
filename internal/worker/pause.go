package worker

import (
	"context"
	"sync"
	"time"

	"github.com/fleet-dev/fleet/internal/queue"
)

// An operator may pause a pool (fleetctl pool pause): its workers then
// start no attempt, and the jobs that arrive wait in the pool's stream.
// Each worker reads the pool's entry in the pools bucket every PausePoll;
// while the pool is paused its pull loop asks for nothing, and a delivery
// it had already taken is given back, without being counted, to come back
// after pausedRecheck.

// pausedRecheck is how long a job delivered while its pool is paused is
// left before a worker looks at it again.
const pausedRecheck = 2 * time.Second

// pauseState is whether the worker's pool is paused, as last read.
type pauseState struct {
	mu      sync.Mutex
	on      bool
	resumed chan struct{} // closed when the pool is resumed
}

func (p *pauseState) paused() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.on
}

// set records what was read and reports whether it changed.
func (p *pauseState) set(on bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on == p.on {
		return false
	}
	p.on = on
	if on {
		p.resumed = make(chan struct{})
	} else {
		close(p.resumed)
	}
	return true
}

// waitResumed waits while the pool is paused, and reports false when ctx
// ends first.
func (p *pauseState) waitResumed(ctx context.Context) bool {
	p.mu.Lock()
	on, resumed := p.on, p.resumed
	p.mu.Unlock()
	if !on {
		return ctx.Err() == nil
	}
	select {
	case <-resumed:
		return true
	case <-ctx.Done():
		return false
	}
}

// readPause reads whether the pool is paused. A fleet whose dispatchers
// predate the pools bucket has no pauses: the worker keeps trying to open
// it, quietly.
func (w *Worker) readPause(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, max(w.cfg.PausePoll, time.Second))
	defer cancel()
	if w.pools == nil {
		kv, err := w.js.KeyValue(ctx, w.names.PoolsBucket())
		if err != nil {
			return
		}
		w.pools = kv
	}
	s, err := queue.ReadPool(ctx, w.pools, w.cfg.Pool)
	if err != nil {
		w.log.Debug("cannot read whether the pool is paused; keeping what was read last", "err", err)
		return
	}
	if w.pause.set(s.Paused) {
		if s.Paused {
			w.log.Info("pool paused: starting no attempt until it is resumed", "reason", s.Reason)
		} else {
			w.log.Info("pool resumed")
		}
	}
}
