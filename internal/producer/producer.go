// Package producer is the first of a worker's stages. It owns the worker's
// slots and its pool's queues: it binds to them, hears of new ones, plans
// which to pull from (the sharing policy, share.go), holds off while the
// pool is paused (pause.go), and hands each message it pulls, a slot taken
// for it, to the attempt stage (Attempts), which gives the slot back (Free)
// as soon as the executor is done with it.
//
// It knows nothing of the worker but Config and Attempts; the worker
// (internal/worker) knows nothing of it but the methods of Producer.
package producer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/fleet-dev/fleet/internal/capacity"
	"github.com/fleet-dev/fleet/internal/lifecycle"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// Attempts is what the producer needs of the attempt stage.
type Attempts interface {
	// Deliver hands on a message pulled in a slot of its own.
	Deliver(msg jetstream.Msg)
	// Running is how many attempts run.
	Running() int
	// Holdings is what the attempts hold, by tenant.
	Holdings() map[string]capacity.Holding
}

// Config is what a producer is built from: the worker's pool and slots,
// and its connections. Every field but Logger and Meter is needed.
type Config struct {
	Pool  string
	Slots int
	// FetchWait is how long one pull request waits for messages;
	// PausePoll how often the pool's state and queues are read again.
	FetchWait time.Duration
	PausePoll time.Duration
	// Queue is the fleet's streams and consumers.
	Queue queue.Config
	// Capacity is the worker's slot accounting: the plan reads the pool's
	// shares from it if it is a capacity.Sharer, and pulls no more than
	// its room if it is a capacity.Room.
	Capacity  capacity.Capacity
	Conn      *nats.Conn
	JetStream jetstream.JetStream
	Logger    *slog.Logger
	Meter     metric.Meter
}

// Producer is the worker's first stage.
type Producer struct {
	cfg   *Config
	nc    *nats.Conn
	js    jetstream.JetStream
	names queue.Names
	log   *slog.Logger
	m     *metrics
	run   Attempts
	src   source // the pool's queues

	slots *slots
	ended signal // fires when a slot is given back

	// qs are the pool's queues; policy its sharing policy, as last read;
	// usage what each tenant ran here, decayed (see share.go).
	qs     *queueSet
	policy atomic.Pointer[job.PoolPolicy]
	usage  usage
	// pause is whether the pool is paused, as last read; pools the pools
	// bucket, once opened.
	pause   pauseState
	pools   jetstream.KeyValue
	poolsMu sync.Mutex

	qsub *nats.Subscription // the dispatchers' words: new queues of the pool
	// wsub puts the same words in words, which catchUp applies (see
	// pause.go).
	wsub    *nats.Subscription
	words   chan *nats.Msg
	wordsMu sync.Mutex

	// ctx ends the pull (cancel); pulling counts the pull loop and its
	// open fetches. background holds the reading and the watch of the
	// pool's state.
	ctx        context.Context
	cancel     context.CancelFunc
	pulling    sync.WaitGroup
	background lifecycle.Group
	watcher    lifecycle.Runner
}

// New returns the producer of cfg's pool, handing what it pulls to run;
// Start starts it.
func New(cfg Config, run Attempts) *Producer {
	if cfg.Meter == nil {
		cfg.Meter = noop.NewMeterProvider().Meter("")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	p := &Producer{
		cfg: &cfg, nc: cfg.Conn, js: cfg.JetStream, names: cfg.Queue.Names, log: cfg.Logger, run: run,
		src:   streamSource{js: cfg.JetStream, cfg: cfg.Queue, pool: cfg.Pool},
		slots: newSlots(cfg.Slots), qs: &queueSet{queues: newQueues()},
	}
	p.m = newMetrics(cfg.Meter, cfg.Pool, p.Paused)
	return p
}

// Start binds to the pool's queues, reads its state, and starts pulling;
// the pull ends with parent, or at Halt. ctx bounds the setup.
func (p *Producer) Start(ctx, parent context.Context) error {
	if err := p.bindQueues(ctx); err != nil {
		return err
	}
	p.ctx, p.cancel = context.WithCancel(parent)
	var err error
	p.words = make(chan *nats.Msg, wordsKept)
	if p.wsub, err = p.nc.ChanSubscribe(p.names.PoolQueues(p.cfg.Pool), p.words); err != nil {
		return fmt.Errorf("subscribe to the pool's state: %w", err)
	}
	if p.qsub, err = p.nc.Subscribe(p.names.PoolQueues(p.cfg.Pool), p.onNewQueue); err != nil {
		return fmt.Errorf("subscribe to new queues: %w", err)
	}
	p.readPause(ctx)
	// The pool's state is watched, and read again every PausePoll with its
	// queues (the first read is above).
	poll := &lifecycle.Every{Interval: p.cfg.PausePoll, Fn: func(ctx context.Context) {
		p.readPause(ctx)
		p.refreshQueues(ctx)
	}, Later: true}
	if err := p.background.Start(ctx, "the reading of the pool's state and queues", poll); err != nil {
		return err
	}
	if err := p.background.Start(ctx, "the watch of the pool's state", lifecycle.Func{StartFunc: func(ctx context.Context) error { return p.watcher.Go(ctx, p.watchPool) }, StopFunc: p.watcher.Stop}); err != nil {
		return err
	}
	p.pulling.Add(1)
	go p.pull()
	return nil
}

// Halt stops the pull: no fetch starts from now on, and the open ones end
// within FetchWait (Wait waits for them).
func (p *Producer) Halt() {
	if p.cancel != nil {
		p.cancel()
	}
}

// Wait waits for the pull to end, and its open fetches, after Halt or the
// end of Start's parent.
func (p *Producer) Wait() { p.pulling.Wait() }

// Close ends what Start subscribed to and started, once the pull has
// ended.
func (p *Producer) Close(ctx context.Context) error {
	for _, s := range []*nats.Subscription{p.qsub, p.wsub} {
		if s != nil {
			_ = s.Unsubscribe()
		}
	}
	p.unlisten()
	p.m.close()
	return p.background.Stop(ctx)
}

// Free gives a slot back, when its attempt no longer needs it.
func (p *Producer) Free() {
	p.slots.release(1)
	p.ended.fire()
}

// Ran counts a slot that tenant held for d, ended now, in its usage,
// unless the worker's capacity keeps the pool's (the ledger, in Redis):
// then the plan reads it there (see tenantView), and a tenant's usage is
// kept once.
func (p *Producer) Ran(tenant string, d time.Duration) {
	if _, ok := p.cfg.Capacity.(capacity.Sharer); ok {
		return
	}
	p.usage.add(tenant, d, p.policy.Load().HalfLifeOr(), time.Now())
}

// Paused reports whether the pool is paused, as last read.
func (p *Producer) Paused() bool { return p.pause.paused() }

// pull asks the pool's queues for as many messages as there are free
// slots, and starts an attempt for each message as it arrives. With one
// queue, several fetches may be open at once, waiting for jobs; together
// they never ask for more messages than the worker has free slots. With
// several, the plan of share.go says how many to take from which, and the
// loop waits to hear of work when none waits.
func (p *Producer) pull() {
	defer p.pulling.Done()
	maxBatch := min(p.cfg.Slots, 256)
	wait := lifecycle.Backoff(p.ctx, 100*time.Millisecond, 5*time.Second)
	// At most two pull requests are open at once: an open request takes
	// every message that arrives until it has its count, so more would
	// only keep the server busy with requests that wait and expire.
	fetches := make(chan struct{}, 2)
	// failing counts pull requests in a row that the server ended with an
	// error before any message (no responders while the consumer's leader
	// moves): the next ones wait longer, instead of asking again at once.
	var failing atomic.Int32
	for {
		if !p.pause.waitResumed(p.ctx) {
			return
		}
		select {
		case fetches <- struct{}{}:
		case <-p.ctx.Done():
			return
		}
		n, err := p.slots.acquireAll(p.ctx, maxBatch)
		if err != nil {
			return
		}
		// Paused while the loop waited for slots: it asks for nothing
		// until the pool is resumed (the wait above).
		if p.pause.paused() {
			p.slots.release(n)
			<-fetches
			continue
		}
		// Under load slots come back one at a time; wait a moment to ask
		// for several in one pull request.
		if n < maxBatch/4 {
			time.Sleep(200 * time.Microsecond)
			if more, _ := p.slots.tryAcquire(maxBatch - n); more > 0 {
				n += more
			}
		}
		// Resources may be shorter than slots: ask only for what fits.
		if r, ok := p.cfg.Capacity.(capacity.Room); ok {
			if room := r.Room(); room < n {
				ended := p.ended.wait()
				p.slots.release(n - room)
				if n = room; n == 0 {
					<-fetches
					select {
					case <-ended:
					case <-p.ctx.Done():
						return
					}
					continue
				}
			}
		}
		only := p.qs.only()
		if only == nil {
			// Several queues, or none yet: pull in the plan's order, or
			// wait to hear of work.
			if p.pullPlanned(n, func() { <-fetches }) {
				continue
			}
			<-fetches
			p.slots.release(n)
			select {
			case <-p.qs.wake:
			case <-p.ended.wait():
			case <-time.After(p.cfg.PausePoll):
			case <-p.ctx.Done():
				return
			}
			continue
		}
		// A queue of a higher priority is heard of and being bound: its
		// jobs go first, and the only queue bound waits (see held).
		if h := p.qs.held(); h != 0 && h < only.key.Priority {
			<-fetches
			p.slots.release(n)
			select {
			case <-p.qs.wake: // bound, or given up
			case <-time.After(100 * time.Millisecond):
			case <-p.ctx.Done():
				return
			}
			continue
		}
		// The queue's consumer was found gone and is being made again: a
		// pull request to the old one would hold the slots until it
		// expires (or, as the server answers a pull to a consumer gone,
		// find no responders); the next goes to the new one.
		if only.rebinding.Load() {
			<-fetches
			p.slots.release(n)
			select {
			case <-p.qs.wake: // the queue made again
			case <-time.After(100 * time.Millisecond): // or it could not be yet
			case <-p.ctx.Done():
				return
			}
			continue
		}
		// A pull request waiting on the only queue holds its slots and its
		// place among the open fetches until it expires, unless the pool
		// gets another queue meanwhile (see waiting): noted before the
		// queues are looked at again, so that a queue bound from now on
		// cuts its wait.
		req := p.qs.wait(n, p.cfg.FetchWait, func() { <-fetches })
		if p.qs.only() != only {
			p.slots.release(p.qs.waited(req))
			req.free()
			continue
		}
		batch, err := only.cons.Fetch(n, p.fetchOpts()...)
		if err != nil {
			p.slots.release(p.qs.waited(req))
			req.free()
			if p.ctx.Err() != nil {
				return
			}
			next := wait.NextBackOff()
			p.log.Warn("fetch failed", "err", err, "again_in", next.Round(time.Millisecond))
			if gone(err) {
				// The queue's consumer or the pool's stream was deleted (an
				// operator moving the pool to a stream of its own): make it
				// again.
				p.rebind(only)
			}
			if next == backoff.Stop {
				return
			}
			select {
			case <-p.ctx.Done():
				return
			case <-time.After(next):
			}
			continue
		}
		wait.Reset()
		p.pulling.Add(1)
		go func() {
			defer p.pulling.Done()
			used := 0
			for msg := range batch.Messages() {
				used++
				if !req.take() {
					// Its wait was cut and its slots went back: the message
					// takes one that is free, or goes back to its queue.
					if got, _ := p.slots.tryAcquire(1); got == 0 {
						p.handBack(only, req, msg)
						continue
					}
				}
				p.catchUp()
				p.run.Deliver(msg)
			}
			if used > 0 {
				only.told.Store(0) // what a dispatcher said was on its way came
			}
			p.slots.release(p.qs.waited(req))
			err := batch.Error()
			switch {
			case gone(err):
				// Deleted while the request waited, even after it brought
				// messages: that answer is the only one the fetches get.
				p.rebind(only)
			case errors.Is(err, nats.ErrNoResponders):
				p.unanswered(only)
			}
			if used > 0 || err == nil || errors.Is(err, nats.ErrTimeout) || p.ctx.Err() != nil {
				failing.Store(0)
				req.free()
				return
			}
			k := min(failing.Add(1), 7)
			pause := min(10*time.Millisecond<<k, time.Second)
			p.log.Debug("fetch ended", "err", err, "again_in", pause)
			select {
			case <-time.After(pause):
			case <-p.ctx.Done():
			}
			req.free()
		}()
	}
}

// fetchOpts are a waiting pull's: it lasts FetchWait, and the server says
// every quarter of it that it still holds it, so that a pull lost (with the
// server the worker was connected to, or as its queue's leadership moves)
// ends after half of FetchWait, its slots free for the next, rather than at
// its end.
func (p *Producer) fetchOpts() []jetstream.FetchOpt {
	opts := []jetstream.FetchOpt{jetstream.FetchMaxWait(p.cfg.FetchWait)}
	if hb := p.cfg.FetchWait / 4; hb >= 50*time.Millisecond {
		opts = append(opts, jetstream.FetchHeartbeat(hb))
	}
	return opts
}

// gone reports a fetch that failed because the consumer or its stream no
// longer exists.
func gone(err error) bool {
	return errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) ||
		errors.Is(err, jetstream.ErrStreamNotFound)
}
