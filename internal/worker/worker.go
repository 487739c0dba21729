// Package worker pulls jobs of one pool from JetStream and runs each attempt
// with an Executor (package executor), publishing lifecycle events and the
// final result back.
//
// A worker holds no job state of its own beyond the attempts it is running:
// JetStream redelivers whatever it took and did not finish, so the process
// may be killed at any time without losing a job.
package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/artifact"
	"github.com/fleet-dev/fleet/internal/capacity"
	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/lifecycle"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/internal/telemetry"
	"github.com/fleet-dev/fleet/job"
)

// Defaults of Config, and of the worker's flags.
const (
	DefaultFetchWait = time.Second
	// DefaultPausePoll is how often a worker reads whether its pool is
	// paused.
	DefaultPausePoll    = time.Second
	DefaultMaxLogEvents = 1000
	// DefaultDrainTimeout is how long a stopping worker lets running
	// attempts finish before it hands their jobs back.
	DefaultDrainTimeout = time.Minute
)

// Config configures a Worker.
type Config struct {
	// ID names the worker in events, results and heartbeats. It should stay
	// the same across restarts of one worker, so that it finds what its
	// previous life left behind. Defaults to the host name.
	ID string
	// Pool is the pool whose jobs the worker runs. Defaults to "default".
	Pool string
	// Slots is how many attempts run at once. Defaults to the number of CPUs.
	Slots int
	// Backend names the executor in events and results ("process", ...).
	Backend string
	// Queue describes the streams; its AckWait is the pool consumer's.
	Queue queue.Config
	// Limits are the request limits, checked again when a job is decoded.
	Limits job.Limits
	// FetchWait is how long one pull request waits for messages, and so
	// how long a stopping worker waits for its open requests.
	// Defaults to DefaultFetchWait (1 second).
	FetchWait time.Duration
	// PausePoll is how often the worker reads whether its pool is paused.
	// Defaults to DefaultPausePoll.
	PausePoll time.Duration
	// Progress is how often a running attempt tells JetStream it is alive
	// and publishes a heartbeat event. Defaults to a third of the ack wait.
	Progress time.Duration
	// MaxLogEvents bounds the log events of one attempt. Defaults to
	// DefaultMaxLogEvents (1000).
	MaxLogEvents int
	// Capacity, when set, accounts slots and resources outside the worker
	// (see package capacity). Defaults to local accounting only.
	Capacity capacity.Capacity
	// Artifacts, when set, is the fleet's object store: attempts fetch
	// their inputs by reference from it, store there the outputs that do
	// not fit in the result, and archive every line of their output in it.
	// Without it, none of those: inputs by reference fail, and outputs must
	// fit in the result.
	Artifacts *artifact.Store
	// ArtifactLimits bound what an attempt stores (see artifact.Limits).
	ArtifactLimits artifact.Limits
	// Retry computes the delay before the next attempt. Defaults to
	// BackoffDelay.
	Retry RetryDelayFunc
	// AdoptWait bounds how long a job waits for the worker that started
	// its running attempt, when only that worker can reach the attempt (a
	// Docker host): then the attempt is lost and the job runs again.
	// Defaults to DefaultAdoptWait.
	AdoptWait time.Duration
	// Handoff makes Stop leave the attempts of an executor.Adopter running
	// in their backend, at once, for other workers to adopt, instead of
	// letting them finish and stopping the rest.
	Handoff bool
	// Usage reads what running attempts use, for the heartbeat events that
	// carry it every UsageInterval. Defaults to a sampler of the executor
	// when it is an executor.UsageReader.
	Usage *executor.UsageSampler
	// UsageInterval is how often a running attempt publishes a heartbeat
	// event with its usage. Defaults to DefaultUsageInterval.
	UsageInterval time.Duration
	// DataSweep and DataRetention govern the removal of the data
	// directories of jobs that ended (see data.go). Default to
	// DefaultDataSweep and DefaultDataRetention.
	DataSweep     time.Duration
	DataRetention time.Duration
	Logger        *slog.Logger
}

// DefaultAdoptWait is how long a job waits for the worker that started its
// attempt to come back, when only that worker can reach it.
const DefaultAdoptWait = 10 * time.Minute

// DefaultUsageInterval is how often a running attempt's heartbeat events
// carry its usage.
const DefaultUsageInterval = 10 * time.Second

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.ID == "" {
		host, _ := os.Hostname()
		c.ID = host
	}
	if c.Pool == "" {
		c.Pool = job.DefaultPool
	}
	if c.Slots <= 0 {
		c.Slots = runtime.NumCPU()
	}
	c.Queue = c.Queue.WithDefaults()
	c.Limits = c.Limits.WithDefaults()
	if c.FetchWait <= 0 {
		c.FetchWait = DefaultFetchWait
	}
	if c.PausePoll <= 0 {
		c.PausePoll = DefaultPausePoll
	}
	if c.Progress <= 0 {
		c.Progress = c.Queue.AckWait / 3
	}
	if c.MaxLogEvents <= 0 {
		c.MaxLogEvents = DefaultMaxLogEvents
	}
	if c.Retry == nil {
		c.Retry = BackoffDelay
	}
	if c.AdoptWait <= 0 {
		c.AdoptWait = DefaultAdoptWait
	}
	if c.UsageInterval <= 0 {
		c.UsageInterval = DefaultUsageInterval
	}
	if c.DataSweep <= 0 {
		c.DataSweep = DefaultDataSweep
	}
	if c.DataRetention <= 0 {
		c.DataRetention = DefaultDataRetention
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	if !job.ValidPool(c.Pool) {
		return fmt.Errorf("pool %q must be 1 to 64 characters of [A-Za-z0-9_-]", c.Pool)
	}
	if !queue.ValidPrefix(c.Queue.Prefix) {
		return fmt.Errorf("subject prefix %q: use 1 to 32 letters, digits, - and _", c.Queue.Prefix)
	}
	if c.Queue.AckWait < time.Second {
		return fmt.Errorf("ack wait %s: at least a second", c.Queue.AckWait)
	}
	if c.ID == "" || len(c.ID) > 128 {
		return errors.New("worker id must be 1 to 128 characters")
	}
	if c.Progress >= c.Queue.AckWait {
		return fmt.Errorf("progress interval %s must be shorter than the ack wait %s", c.Progress, c.Queue.AckWait)
	}
	return nil
}

// Worker runs the jobs of one pool.
type Worker struct {
	cfg   Config
	nc    *nats.Conn
	js    jetstream.JetStream
	exec  executor.Executor
	names queue.Names
	log   *slog.Logger
	slots *slots
	ended signal // fires when an attempt ends
	// journal reads and writes the jobs' records, events and results;
	// sealer opens the requests' secrets.
	journal journal
	sealer  *queue.Sealer
	cubs    *nats.Subscription
	qsub    *nats.Subscription // the dispatchers' words: new queues of the pool
	// wsub puts the same words in words, which catchUp applies (see
	// pause.go).
	wsub    *nats.Subscription
	words   chan *nats.Msg
	wordsMu sync.Mutex
	// stopHearing ends the subscription to the pool's stream's elections.
	stopHearing func()
	m           *metrics

	pullCtx  context.Context
	stopPull context.CancelFunc
	pulling  sync.WaitGroup // the pull loop and its open fetches
	runCtx   context.Context
	stopRuns context.CancelCauseFunc
	// settling bounds what attempts write and publish to settle their
	// jobs; it ends only when Stop gives up on NATS (see handBackGrace).
	settling context.Context
	giveUp   context.CancelFunc
	attempts sync.WaitGroup
	// deliveries go to the handlers, one goroutine per slot; closed once
	// the pull has stopped.
	deliveries chan jetstream.Msg
	handlers   sync.WaitGroup
	// background holds the loops beside the pull: the pool's pause state,
	// the sweep of data directories.
	background lifecycle.Group
	stopOnce   sync.Once
	stopErr    error
	mu         sync.Mutex
	running    map[string]*delivery
	// byTenant is what the attempts running here hold, by tenant.
	byTenant map[string]capacity.Holding
	// qs are the pool's queues; policy its sharing policy, as last read;
	// usage what each tenant ran here, decayed (see share.go).
	qs     *queueSet
	policy atomic.Pointer[job.PoolPolicy]
	usage  usage
	// watcher runs watchPool.
	watcher  lifecycle.Runner
	draining atomic.Bool
	// pause is whether the pool is paused, as last read.
	pause   pauseState
	pools   jetstream.KeyValue // the pools bucket, once opened
	poolsMu sync.Mutex
}

// New returns a Worker; Start starts it.
func New(nc *nats.Conn, exec executor.Executor, cfg Config) (*Worker, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("worker config: %w", err)
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096), jetstream.WithPublishAsyncTimeout(queue.AsyncPublishTimeout))
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	w := &Worker{
		cfg: cfg, nc: nc, js: js, exec: exec, names: cfg.Queue.Names,
		log:     cfg.Logger.With("component", "worker", "worker_id", cfg.ID, "pool", cfg.Pool),
		slots:   newSlots(cfg.Slots),
		running: map[string]*delivery{}, byTenant: map[string]capacity.Holding{},
		qs: &queueSet{queues: newQueues()},
	}
	w.m = newMetrics(telemetry.Meter(), w)
	if r, ok := exec.(executor.UsageReader); ok && w.cfg.Usage == nil {
		w.cfg.Usage = executor.NewUsageSampler(r, time.Second)
	}
	return w, nil
}

// Start binds to the pool's consumer and starts pulling. It returns once the
// worker is pulling; ctx bounds only the setup. Until a dispatcher has
// created the streams, and while the NATS cluster elects its leaders, it
// waits and logs why.
func (w *Worker) Start(ctx context.Context) error {
	sealer, err := queue.OpenSealer(ctx, w.js, w.names, false, w.log)
	if err != nil {
		return err
	}
	w.sealer = sealer
	w.journal = &jsJournal{nc: w.nc, js: w.js, jobs: queue.NewJobs(w.js, w.names).WithLogger(w.log), names: w.names}
	if err := w.recover(ctx); err != nil {
		return fmt.Errorf("recover what an earlier worker %s left: %w", w.cfg.ID, err)
	}
	if err := queue.WorkerPoolStream(ctx, w.js, w.cfg.Queue, w.cfg.Pool, w.log); err != nil {
		return err
	}
	if err := w.bindQueues(ctx); err != nil {
		return err
	}
	// Every worker hears every cancel; it acts on those of jobs it runs.
	w.cubs, err = w.nc.Subscribe(w.names.PoolStops(w.cfg.Pool), w.onCancel)
	if err != nil {
		return fmt.Errorf("subscribe to cancels: %w", err)
	}

	// A write or read sent while the pool's stream had no leader is sent
	// again as soon as the servers say it has one (queue.Elections).
	elections := queue.NewElections()
	stopHearing, err := queue.ListenForElections(w.nc, elections, queue.LeaderElected(w.names.PoolStreamV2(w.cfg.Pool)))
	if err != nil {
		return err
	}
	w.stopHearing = stopHearing
	w.settling, w.giveUp = context.WithCancel(queue.WithElections(context.WithoutCancel(ctx), elections))
	w.runCtx, w.stopRuns = context.WithCancelCause(w.settling)
	w.pullCtx, w.stopPull = context.WithCancel(w.runCtx)
	w.words = make(chan *nats.Msg, wordsKept)
	if w.wsub, err = w.nc.ChanSubscribe(w.names.PoolQueues(w.cfg.Pool), w.words); err != nil {
		return fmt.Errorf("subscribe to the pool's state: %w", err)
	}
	if w.qsub, err = w.nc.Subscribe(w.names.PoolQueues(w.cfg.Pool), w.onNewQueue); err != nil {
		return fmt.Errorf("subscribe to new queues: %w", err)
	}
	w.readPause(ctx)
	// The pool's state is watched, and read again every PausePoll with its
	// queues (the first read is above).
	poll := &lifecycle.Every{Interval: w.cfg.PausePoll, Fn: func(ctx context.Context) {
		w.readPause(ctx)
		w.refreshQueues(ctx)
	}, Later: true}
	if err := w.background.Start(ctx, "the reading of the pool's state and queues", poll); err != nil {
		return err
	}
	if err := w.background.Start(ctx, "the watch of the pool's state", lifecycle.Func{StartFunc: func(ctx context.Context) error { return w.watcher.Go(ctx, w.watchPool) }, StopFunc: w.watcher.Stop}); err != nil {
		return err
	}
	if k, ok := w.exec.(executor.DataKeeper); ok {
		sweep := lifecycle.NewEvery(w.cfg.DataSweep, func(ctx context.Context) { w.sweepOnce(ctx, k) })
		if err := w.background.Start(ctx, "the sweep of data directories", sweep); err != nil {
			return err
		}
	}
	// One goroutine per slot handles deliveries: they start warm, with
	// the stack a delivery needs, rather than growing one each time.
	w.deliveries = make(chan jetstream.Msg, w.cfg.Slots)
	for range w.cfg.Slots {
		w.handlers.Add(1)
		go func() {
			defer w.handlers.Done()
			for msg := range w.deliveries {
				w.handle(msg)
			}
		}()
	}
	w.pulling.Add(1)
	go w.pull()
	w.log.Info("worker started", "slots", w.cfg.Slots, "backend", w.cfg.Backend, "ack_wait", w.cfg.Queue.AckWait)
	return nil
}

// Stop drains the worker: it stops pulling, lets running attempts finish
// until ctx ends, then stops the rest and requeues their jobs at once,
// without counting them as attempts. It returns when nothing runs: nil, or
// an error when NATS did not answer and jobs were left to come back after
// their ack wait. Stop may be called again; it returns the same.
func (w *Worker) Stop(ctx context.Context) error {
	w.stopOnce.Do(func() { w.stopErr = w.stop(ctx) })
	return w.stopErr
}

func (w *Worker) stop(ctx context.Context) error {
	if w.stopPull == nil {
		return nil // never started
	}
	var err error
	w.log.Info("draining", "running", w.Running())
	w.draining.Store(true)
	w.stopPull()
	if _, ok := w.exec.(executor.Adopter); ok && w.cfg.Handoff {
		w.log.Info("handing running attempts off to the pool", "running", w.Running())
		w.stopRuns(executor.ErrLeaveRunning)
	}
	done := make(chan struct{})
	// Open fetches end within FetchWait; what they still bring is handed
	// back. Only they start attempts, so attempts are waited for after.
	go func() { w.pulling.Wait(); w.attempts.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		w.log.Warn("drain timeout: handing back running jobs", "running", w.Running())
		w.stopRuns(executor.ErrRequeue)
		select {
		case <-done:
		case <-time.After(handBackGrace):
			// NATS does not answer: what is not handed back comes back to
			// the pool after the ack wait.
			left := w.Running()
			w.log.Warn("NATS does not answer: leaving the rest for redelivery", "running", left)
			err = fmt.Errorf("stop worker: NATS did not answer; %d jobs come back to the pool after their ack wait", left)
			w.giveUp()
			<-done
		}
	}
	close(w.deliveries) // nothing pulls any more
	w.handlers.Wait()
	if w.cubs != nil {
		_ = w.cubs.Unsubscribe()
	}
	if w.qsub != nil {
		_ = w.qsub.Unsubscribe()
	}
	if w.stopHearing != nil {
		w.stopHearing()
	}
	if w.wsub != nil {
		_ = w.wsub.Unsubscribe()
	}
	w.unlisten()
	w.stopRuns(executor.ErrRequeue)
	if berr := w.background.Stop(context.WithoutCancel(ctx)); berr != nil {
		err = errors.Join(err, berr)
	}
	select {
	case <-w.js.PublishAsyncComplete():
	case <-time.After(5 * time.Second):
	}
	w.giveUp()
	w.log.Info("worker stopped")
	return err
}

// handBackGrace is how long a stopping worker tries to hand its jobs back
// after the drain timeout.
const handBackGrace = 10 * time.Second

// recover settles what an earlier life of this worker left in the backend:
// everything, but the attempts that can still be adopted.
func (w *Worker) recover(ctx context.Context) error {
	if a, ok := w.exec.(executor.Adopter); ok {
		return a.RecoverAdoptable(ctx, w.cfg.ID, w.adoptable(ctx))
	}
	if r, ok := w.exec.(executor.Recoverer); ok {
		return r.Recover(ctx, w.cfg.ID)
	}
	return nil
}

// Running returns how many attempts are running.
func (w *Worker) Running() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.running)
}

// hold counts h in what tenant runs here (sign 1), or no longer (-1).
func (w *Worker) hold(tenant string, h capacity.Holding, sign int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.byTenant == nil {
		w.byTenant = map[string]capacity.Holding{}
	}
	o := w.byTenant[tenant]
	o = o.Add(capacity.Holding{Slots: sign * h.Slots, CPUMilli: sign * h.CPUMilli, MemoryBytes: sign * h.MemoryBytes, GPUs: sign * h.GPUs})
	if o.Slots <= 0 {
		delete(w.byTenant, tenant)
		return
	}
	w.byTenant[tenant] = o
}

// Draining reports whether Stop has been called.
func (w *Worker) Draining() bool { return w.draining.Load() }

// pull asks the pool's queues for as many messages as there are free
// slots, and starts an attempt for each message as it arrives. With one
// queue, several fetches may be open at once, waiting for jobs; together
// they never ask for more messages than the worker has free slots. With
// several, the plan of share.go says how many to take from which, and the
// loop waits to hear of work when none waits.
func (w *Worker) pull() {
	defer w.pulling.Done()
	maxBatch := min(w.cfg.Slots, 256)
	wait := lifecycle.Backoff(w.pullCtx, 100*time.Millisecond, 5*time.Second)
	// At most two pull requests are open at once: an open request takes
	// every message that arrives until it has its count, so more would
	// only keep the server busy with requests that wait and expire.
	fetches := make(chan struct{}, 2)
	// failing counts pull requests in a row that the server ended with an
	// error before any message (no responders while the consumer's leader
	// moves): the next ones wait longer, instead of asking again at once.
	var failing atomic.Int32
	for {
		if !w.pause.waitResumed(w.pullCtx) {
			return
		}
		select {
		case fetches <- struct{}{}:
		case <-w.pullCtx.Done():
			return
		}
		n, err := w.slots.acquireAll(w.pullCtx, maxBatch)
		if err != nil {
			return
		}
		// Under load slots come back one at a time; wait a moment to ask
		// for several in one pull request.
		if n < maxBatch/4 {
			time.Sleep(200 * time.Microsecond)
			if more, _ := w.slots.tryAcquire(maxBatch - n); more > 0 {
				n += more
			}
		}
		// Resources may be shorter than slots: ask only for what fits.
		if r, ok := w.cfg.Capacity.(capacity.Room); ok {
			if room := r.Room(); room < n {
				ended := w.ended.wait()
				w.slots.release(n - room)
				if n = room; n == 0 {
					<-fetches
					select {
					case <-ended:
					case <-w.pullCtx.Done():
						return
					}
					continue
				}
			}
		}
		only := w.qs.only()
		if only == nil {
			// Several queues, or none yet: pull in the plan's order, or
			// wait to hear of work.
			if w.pullPlanned(n, func() { <-fetches }) {
				continue
			}
			<-fetches
			w.slots.release(n)
			select {
			case <-w.qs.wake:
			case <-w.ended.wait():
			case <-time.After(w.cfg.PausePoll):
			case <-w.pullCtx.Done():
				return
			}
			continue
		}
		// A pull request waiting on the only queue holds its slots and its
		// place among the open fetches until it expires, unless the pool
		// gets another queue meanwhile (see waiting): noted before the
		// queues are looked at again, so that a queue bound from now on
		// cuts its wait.
		req := w.qs.wait(n, w.cfg.FetchWait, func() { <-fetches })
		if w.qs.only() != only {
			w.slots.release(w.qs.waited(req))
			req.free()
			continue
		}
		batch, err := only.cons.Fetch(n, w.fetchOpts()...)
		if err != nil {
			w.slots.release(w.qs.waited(req))
			req.free()
			if w.pullCtx.Err() != nil {
				return
			}
			next := wait.NextBackOff()
			w.log.Warn("fetch failed", "err", err, "again_in", next.Round(time.Millisecond))
			if gone(err) {
				// The queue's consumer or the pool's stream was deleted (an
				// operator moving the pool to a stream of its own): make it
				// again.
				w.rebind(only)
			}
			if next == backoff.Stop {
				return
			}
			select {
			case <-w.pullCtx.Done():
				return
			case <-time.After(next):
			}
			continue
		}
		wait.Reset()
		w.pulling.Add(1)
		go func() {
			defer w.pulling.Done()
			used := 0
			for msg := range batch.Messages() {
				used++
				if !req.take() {
					// Its wait was cut and its slots went back: the message
					// takes one that is free, or goes back to its queue.
					if got, _ := w.slots.tryAcquire(1); got == 0 {
						w.handBack(only, req, msg)
						continue
					}
				}
				w.catchUp()
				w.attempts.Add(1)
				w.deliveries <- msg
			}
			if used > 0 {
				only.told.Store(0) // what a dispatcher said was on its way came
			}
			w.slots.release(w.qs.waited(req))
			err := batch.Error()
			switch {
			case gone(err):
				// Deleted while the request waited, even after it brought
				// messages: that answer is the only one the fetches get.
				w.rebind(only)
			case errors.Is(err, nats.ErrNoResponders):
				w.unanswered(only)
			}
			if used > 0 || err == nil || errors.Is(err, nats.ErrTimeout) || w.pullCtx.Err() != nil {
				failing.Store(0)
				req.free()
				return
			}
			k := min(failing.Add(1), 7)
			pause := min(10*time.Millisecond<<k, time.Second)
			w.log.Debug("fetch ended", "err", err, "again_in", pause)
			select {
			case <-time.After(pause):
			case <-w.pullCtx.Done():
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
func (w *Worker) fetchOpts() []jetstream.FetchOpt {
	opts := []jetstream.FetchOpt{jetstream.FetchMaxWait(w.cfg.FetchWait)}
	if hb := w.cfg.FetchWait / 4; hb >= 50*time.Millisecond {
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
