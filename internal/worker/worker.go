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

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/artifact"
	"github.com/fleet-dev/fleet/internal/capacity"
	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/lifecycle"
	"github.com/fleet-dev/fleet/internal/producer"
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
	// DefaultRunningAfter is the worker command's --running-after: an
	// attempt is recorded as running once it has run this long (see
	// Config.RunningAfter).
	DefaultRunningAfter = 20 * time.Millisecond
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
	// RunningAfter is how long an attempt runs before the worker records
	// it as running: one that ends sooner writes no running version, and
	// the version that ends it records its start too (a no-op job costs
	// two writes, not three). 0, the default, records every attempt as
	// running before it starts, and so does an executor.Adopter, whose
	// attempts outlive the worker whatever this says: another worker
	// adopts an attempt by its running version.
	RunningAfter time.Duration
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
	if c.RunningAfter < 0 || c.RunningAfter >= c.Progress {
		return fmt.Errorf("running-after %s must be from 0 to less than the progress interval %s", c.RunningAfter, c.Progress)
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
	// p is the first stage: it pulls, and hands deliveries to this one
	// (internal/producer).
	p producerStage
	// journal reads and writes the jobs' records, events and results;
	// sealer opens the requests' secrets.
	journal journal
	sealer  *queue.Sealer
	m       *metrics
	// unsubscribe ends what Start subscribed to: the cancels and the pool's
	// stream's elections.
	unsubscribe []func()

	scope    scopes
	handlers handlers
	// completer is the third stage: it stores the final versions of the
	// attempts that ended well and acknowledges their messages, in
	// batches (see completer.go).
	completer completerStage
	// background holds the sweep of data directories.
	background lifecycle.Group
	stopping   stopping
	// runs are the deliveries running here.
	runs runningSet
}

// stopping is how far Stop has come: draining from its first call, and
// what it returned.
type stopping struct {
	draining atomic.Bool
	once     sync.Once
	err      error
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
		log: cfg.Logger.With("component", "worker", "worker_id", cfg.ID, "pool", cfg.Pool),
	}
	w.m = newMetrics(telemetry.Meter(), w)
	w.p = producer.New(producer.Config{
		Pool: cfg.Pool, Slots: cfg.Slots, FetchWait: cfg.FetchWait, PausePoll: cfg.PausePoll, Queue: cfg.Queue,
		Capacity: cfg.Capacity, Conn: nc, JetStream: js, Logger: w.log, Meter: telemetry.Meter(),
	}, attemptStage{w})
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
	// Every worker hears every cancel; it acts on those of jobs it runs.
	cubs, err := w.nc.Subscribe(w.names.PoolStops(w.cfg.Pool), w.onCancel)
	if err != nil {
		return fmt.Errorf("subscribe to cancels: %w", err)
	}
	w.unsubscribe = append(w.unsubscribe, func() { _ = cubs.Unsubscribe() })

	// A write or read sent while the pool's stream had no leader is sent
	// again as soon as the servers say it has one (queue.Elections).
	elections := queue.NewElections()
	stopHearing, err := queue.ListenForElections(w.nc, elections, queue.LeaderElected(w.names.PoolStreamV2(w.cfg.Pool)))
	if err != nil {
		return err
	}
	w.unsubscribe = append(w.unsubscribe, stopHearing)
	w.scope = newScopes(queue.WithElections(context.WithoutCancel(ctx), elections))
	if k, ok := w.exec.(executor.DataKeeper); ok {
		sweep := lifecycle.NewEvery(w.cfg.DataSweep, func(ctx context.Context) { w.sweepOnce(ctx, k) })
		if err := w.background.Start(ctx, "the sweep of data directories", sweep); err != nil {
			return err
		}
	}
	w.completer = newCompleter(w.journal, w.cfg.Slots, w.m)
	if err := w.completer.Start(ctx); err != nil {
		return err
	}
	w.handlers.start(w.cfg.Slots, w.handle)
	if err := w.p.Start(ctx, w.scope.run); err != nil {
		return err
	}
	w.log.Info("worker started", "slots", w.cfg.Slots, "backend", w.cfg.Backend, "ack_wait", w.cfg.Queue.AckWait)
	return nil
}

// Stop drains the worker: it stops pulling, lets running attempts finish
// until ctx ends, then stops the rest and requeues their jobs at once,
// without counting them as attempts. It returns when nothing runs: nil, or
// an error when NATS did not answer and jobs were left to come back after
// their ack wait. Stop may be called again; it returns the same.
func (w *Worker) Stop(ctx context.Context) error {
	w.stopping.once.Do(func() { w.stopping.err = w.stop(ctx) })
	return w.stopping.err
}

func (w *Worker) stop(ctx context.Context) error {
	if w.scope.stopRuns == nil {
		return nil // never started
	}
	var err error
	w.log.Info("draining", "running", w.Running())
	w.stopping.draining.Store(true)
	w.p.Halt()
	if _, ok := w.exec.(executor.Adopter); ok && w.cfg.Handoff {
		w.log.Info("handing running attempts off to the pool", "running", w.Running())
		w.scope.stopRuns(executor.ErrLeaveRunning)
	}
	done := make(chan struct{})
	// Open fetches end within FetchWait; what they still bring is handed
	// back. Only they start attempts, so attempts are waited for after.
	go func() { w.p.Wait(); w.handlers.attempts.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		w.log.Warn("drain timeout: handing back running jobs", "running", w.Running())
		w.scope.stopRuns(executor.ErrRequeue)
		select {
		case <-done:
		case <-time.After(handBackGrace):
			// NATS does not answer: what is not handed back comes back to
			// the pool after the ack wait.
			left := w.Running()
			w.log.Warn("NATS does not answer: leaving the rest for redelivery", "running", left)
			err = fmt.Errorf("stop worker: NATS did not answer; %d jobs come back to the pool after their ack wait", left)
			w.scope.giveUp()
			<-done
		}
	}
	w.handlers.close() // nothing pulls any more
	if w.completer != nil {
		if cerr := w.completer.Stop(context.WithoutCancel(ctx)); cerr != nil {
			err = errors.Join(err, cerr)
		}
	}
	for _, f := range w.unsubscribe {
		f()
	}
	if perr := w.p.Close(context.WithoutCancel(ctx)); perr != nil {
		err = errors.Join(err, perr)
	}
	w.scope.stopRuns(executor.ErrRequeue)
	if berr := w.background.Stop(context.WithoutCancel(ctx)); berr != nil {
		err = errors.Join(err, berr)
	}
	select {
	case <-w.js.PublishAsyncComplete():
	case <-time.After(5 * time.Second):
	}
	w.scope.giveUp()
	w.m.close()
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
func (w *Worker) Running() int { return w.runs.len() }

// runningAfter is how long an attempt runs before it is recorded as
// running (see Config.RunningAfter): 0, before it starts, for an
// executor whose attempts outlive the worker.
func (w *Worker) runningAfter() time.Duration {
	if _, ok := w.exec.(executor.Adopter); ok {
		return 0
	}
	return max(w.cfg.RunningAfter, 0)
}

// producerStage is the worker's first stage (producer.Producer), as the
// worker starts and stops it and the attempt stage gives back its slots.
type producerStage interface {
	Start(ctx, parent context.Context) error
	Halt()
	Wait()
	Close(ctx context.Context) error
	// Free gives back the slot of an attempt done with it; Ran counts the
	// time a tenant held it; Paused says whether the pool is paused.
	Free()
	Ran(tenant string, d time.Duration)
	Paused() bool
}

var _ producerStage = (*producer.Producer)(nil)

// attemptStage is the worker's attempt stage, as its producer sees it.
type attemptStage struct{ w *Worker }

// Deliver hands a message the producer pulled, in a slot of its own, to a
// handler.
func (a attemptStage) Deliver(msg jetstream.Msg) { a.w.handlers.deliver(msg) }

// Running is how many attempts run here.
func (a attemptStage) Running() int { return a.w.Running() }

// Holdings is what the attempts running here hold, by tenant.
func (a attemptStage) Holdings() map[string]capacity.Holding { return a.w.runs.holdings() }

// scopes are the contexts attempts run in. settle bounds what they write
// and publish to settle their jobs, and ends only when Stop gives up on
// NATS (see handBackGrace); run, under it, is each attempt's, and ends
// with a cause that says what becomes of what runs (executor.ErrRequeue,
// executor.ErrLeaveRunning).
type scopes struct {
	settle   context.Context
	giveUp   context.CancelFunc
	run      context.Context
	stopRuns context.CancelCauseFunc
}

func newScopes(parent context.Context) scopes {
	var s scopes
	s.settle, s.giveUp = context.WithCancel(parent)
	s.run, s.stopRuns = context.WithCancelCause(s.settle)
	return s
}

// handlers are the attempt stage's goroutines, one a slot, started warm
// with the stack a delivery needs rather than growing one each time: each
// takes a delivery the producer handed on, handles it, and takes the next.
type handlers struct {
	queue      chan jetstream.Msg
	attempts   sync.WaitGroup // deliveries handed on and not yet handled
	goroutines sync.WaitGroup
}

func (h *handlers) start(n int, handle func(jetstream.Msg)) {
	h.queue = make(chan jetstream.Msg, n)
	for range n {
		h.goroutines.Add(1)
		go func() {
			defer h.goroutines.Done()
			for msg := range h.queue {
				handle(msg)
			}
		}()
	}
}

func (h *handlers) deliver(msg jetstream.Msg) {
	h.attempts.Add(1)
	h.queue <- msg
}

// close ends the goroutines once nothing is handed on any more.
func (h *handlers) close() {
	if h.queue != nil {
		close(h.queue)
	}
	h.goroutines.Wait()
}

// Draining reports whether Stop has been called.
func (w *Worker) Draining() bool { return w.stopping.draining.Load() }
