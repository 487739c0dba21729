package producer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/capacity"
	"github.com/fleet-dev/fleet/internal/lifecycle"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// An operator may pause a pool (fleetctl pool pause): its workers then
// start no attempt, and the jobs that arrive wait in the pool's stream.
// Each worker watches the pool's entry in the pools bucket, and reads it
// again every PausePoll; while the pool is paused its pull loop asks for
// nothing, and the attempt stage gives back a delivery it had already
// taken, without counting it, to come back a moment later.
//
// The watch alone would not make a pause hold for the jobs submitted once
// it is answered: the server feeds it on its own time, and a job can reach
// the worker first. So the dispatcher that writes the pool's state also
// says it on the pool's word subject before it answers, and the worker
// applies every word it has before it hands on a delivery (catchUp): the
// word came in on the worker's connection before the delivery, so it is in
// the channel of its subscription by then. The states read, watched and
// told carry the entry's revision, and an older one than the worker knows
// is ignored.

// pauseState is whether the worker's pool is paused, as last read.
type pauseState struct {
	mu      sync.Mutex
	on      bool
	resumed chan struct{} // closed when the pool is resumed
	rev     uint64        // the pools bucket's revision of what was read
}

func (p *pauseState) paused() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.on
}

// setLocked records what was read and reports whether it changed; p.mu
// is held.
func (p *pauseState) setLocked(on bool) bool {
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

// readPause reads the pool's state: whether it is paused, and its
// sharing policy. A fleet whose dispatchers predate the pools bucket has
// no pauses: the worker keeps trying to open it, quietly.
func (p *Producer) readPause(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, max(p.cfg.PausePoll, time.Second))
	defer cancel()
	kv, err := p.poolsBucket(ctx)
	if err != nil {
		return
	}
	s, rev, err := queue.ReadPoolAt(ctx, kv, p.cfg.Pool)
	if err != nil {
		p.log.Debug("cannot read whether the pool is paused; keeping what was read last", "err", err)
		return
	}
	p.setPool(s, rev)
}

func (p *Producer) poolsBucket(ctx context.Context) (jetstream.KeyValue, error) {
	p.poolsMu.Lock()
	defer p.poolsMu.Unlock()
	if p.pools == nil {
		kv, err := p.js.KeyValue(ctx, p.names.PoolsBucket())
		if err != nil {
			return nil, err
		}
		p.pools = kv
	}
	return p.pools, nil
}

// setPool applies what was read of the pool's state, the bucket's entry
// at revision rev, unless the worker knows a later one.
func (p *Producer) setPool(s *job.PoolState, rev uint64) {
	p.pause.mu.Lock()
	defer p.pause.mu.Unlock()
	if rev < p.pause.rev {
		return
	}
	p.pause.rev = rev
	p.policy.Store(s.Policy)
	if sh, ok := p.cfg.Capacity.(capacity.Sharer); ok {
		sh.SetPolicy(s.Policy)
	}
	if p.pause.setLocked(s.Paused) {
		if s.Paused {
			p.log.Info("pool paused: starting no attempt until it is resumed", "reason", s.Reason)
		} else {
			p.log.Info("pool resumed")
		}
	}
}

// watchPool follows the pool's entry in the pools bucket, so that a pause
// or a new policy holds here as soon as it is stored (the reads every
// PausePoll stay, for a watch that broke off).
func (p *Producer) watchPool(ctx context.Context) error {
	lifecycle.Again(ctx, p.log, "the watch of the pool's state", 100*time.Millisecond, 5*time.Second, func(ctx context.Context) error {
		kv, err := p.poolsBucket(ctx)
		if err != nil {
			return err
		}
		// The watch's own context ends only once it is stopped here: a
		// watch given ctx stops itself in a goroutine of its own when ctx
		// ends, and the worker's Stop would return before the watch's
		// consumer is deleted.
		wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		defer cancel()
		watch, err := kv.Watch(wctx, p.cfg.Pool)
		if err != nil {
			return fmt.Errorf("watch pool %s: %w", p.cfg.Pool, err)
		}
		defer func() { _ = watch.Stop() }()
		for {
			select {
			case <-ctx.Done():
				return nil
			case e, ok := <-watch.Updates():
				if !ok {
					return errors.New("the watch of the pool's state ended")
				}
				if e == nil {
					continue // the current state was read
				}
				if e.Operation() != jetstream.KeyValuePut {
					p.setPool(&job.PoolState{Pool: p.cfg.Pool}, e.Revision())
					continue
				}
				var s job.PoolState
				if err := json.Unmarshal(e.Value(), &s); err != nil {
					p.log.Warn("the pool's state cannot be read; keeping what was read last", "err", err)
					continue
				}
				s.Pool = p.cfg.Pool
				p.setPool(&s, e.Revision())
			}
		}
	})
	return nil
}

// wordsKept bounds the dispatchers' words a worker keeps until it applies
// them: it applies them at each delivery and as each word is heard.
const wordsKept = 256

// catchUp applies the pool's states that dispatchers told and the worker
// has not applied yet. Called with a delivery in hand, before it is handed
// on: a state told before the delivery came is in p.words by then, since
// the connection's reader puts each message in its subscription's channel
// in the order they came.
func (p *Producer) catchUp() {
	p.wordsMu.Lock()
	defer p.wordsMu.Unlock()
	for {
		select {
		case m := <-p.words:
			p.told(m)
		default:
			return
		}
	}
}

// told applies a dispatcher's word that carries the pool's state; other
// words (a new queue) are onNewQueue's.
func (p *Producer) told(m *nats.Msg) {
	h := m.Header.Get(queue.HeaderPoolRevision)
	if h == "" {
		return
	}
	rev, err := strconv.ParseUint(h, 10, 64)
	var s job.PoolState
	if err == nil {
		err = json.Unmarshal(m.Data, &s)
	}
	if err != nil {
		p.log.Warn("a dispatcher's word on the pool's state cannot be read; the watch says it", "err", err)
		return
	}
	s.Pool = p.cfg.Pool
	p.setPool(&s, rev)
}
