// Package dispatcher accepts execution requests and turns them into jobs:
// it validates each request, gives it an id and its defaults, refuses
// duplicates, records the job's state and publishes it to its pool's
// subject, where workers pull it.
//
// Requests arrive on the submit subject (captured by the submit stream, so
// none is lost while no dispatcher runs) and through the HTTP API. Any
// number of dispatchers may run; they share the submit stream's consumer.
package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/internal/telemetry"
	"github.com/fleet-dev/fleet/job"
)

// Config configures a Dispatcher.
type Config struct {
	Queue  queue.Config
	Limits job.Limits
	// InFlight bounds the submissions processed at once. Defaults to 512.
	InFlight int
	// Admission checks a request against the fleet's capacity. Defaults to
	// accepting every request.
	Admission Admission
	Logger    *slog.Logger
}

// Admission decides whether a pool can ever run a request. An error is a
// rejection reason; a non-empty warning accepts the request with a note.
type Admission interface {
	Admit(ctx context.Context, r *job.Request) (warning string, err error)
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.Queue = c.Queue.WithDefaults()
	if c.InFlight <= 0 {
		c.InFlight = 512
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Dispatcher accepts requests and publishes jobs.
type Dispatcher struct {
	cfg   Config
	nc    *nats.Conn
	js    jetstream.JetStream
	names queue.Names
	store *queue.Store
	log   *slog.Logger
	m     metrics

	replies *replies
	lag     *lag
	core    *nats.Subscription
	cancels *nats.Subscription
	intake  jetstream.MessagesContext
	wg      sync.WaitGroup
	sema    chan struct{}
	ready   chan struct{}
	stop    context.CancelFunc
}

// New returns a Dispatcher; Start starts it.
func New(nc *nats.Conn, cfg Config) (*Dispatcher, error) {
	cfg = cfg.WithDefaults()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(8192))
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	d := &Dispatcher{
		cfg: cfg, nc: nc, js: js, names: cfg.Queue.Names,
		log:   cfg.Logger.With("component", "dispatcher"),
		sema:  make(chan struct{}, cfg.InFlight),
		ready: make(chan struct{}),
		lag:   &lag{pending: map[string]uint64{}, inFlight: map[string]int{}},
	}
	d.m = newMetrics(telemetry.Meter())
	d.replies = newReplies(nc)
	return d, nil
}

// Start creates or updates the streams and the bucket, and starts taking
// submissions. It returns once the dispatcher is ready.
func (d *Dispatcher) Start(ctx context.Context) error {
	if err := queue.Setup(ctx, d.js, d.cfg.Queue); err != nil {
		return err
	}
	store, err := queue.NewStore(ctx, d.js, d.names)
	if err != nil {
		return err
	}
	d.store = store
	cons, err := queue.IntakeConsumer(ctx, d.js, d.cfg.Queue)
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	d.stop = cancel
	intake, err := d.js.KeyValue(ctx, d.names.IntakeBucket())
	if err != nil {
		return fmt.Errorf("open bucket %s: %w", d.names.IntakeBucket(), err)
	}
	p, err := d.startPeers(runCtx)
	if err != nil {
		return fmt.Errorf("announce the dispatcher: %w", err)
	}
	d.replies.peers, d.replies.claim = p.any, claimer(intake)
	// Every dispatcher sees the core copy of every request sent with a reply
	// subject; the one that processes its stream copy answers it.
	d.core, err = d.nc.Subscribe(d.names.Submit(), d.replies.onRequest)
	if err != nil {
		return fmt.Errorf("subscribe to %s: %w", d.names.Submit(), err)
	}
	d.cancels, err = d.nc.QueueSubscribe(d.names.AllCancels(), "fleet-dispatcher", d.onCancel)
	if err != nil {
		return fmt.Errorf("subscribe to %s: %w", d.names.AllCancels(), err)
	}
	d.intake, err = cons.Messages(jetstream.PullMaxMessages(min(d.cfg.InFlight, 256)))
	if err != nil {
		return fmt.Errorf("consume %s: %w", d.names.SubmitStream(), err)
	}
	d.wg.Add(3)
	go d.consume(runCtx)
	go func() { defer d.wg.Done(); d.replies.sweep(runCtx) }()
	go func() { defer d.wg.Done(); d.watchLag(runCtx, 5*time.Second) }()
	close(d.ready)
	d.log.Info("dispatcher started", "submit", d.names.Submit())
	return nil
}

// Ready reports whether Start has finished and NATS is connected.
func (d *Dispatcher) Ready() error {
	select {
	case <-d.ready:
	default:
		return errors.New("starting")
	}
	if !d.nc.IsConnected() {
		return errors.New("not connected to NATS")
	}
	return nil
}

// Stop stops taking submissions and waits, until ctx ends, for those in
// progress. Unfinished ones are redelivered to another dispatcher.
func (d *Dispatcher) Stop(ctx context.Context) error {
	if d.intake != nil {
		d.intake.Stop()
	}
	for _, s := range []*nats.Subscription{d.core, d.cancels} {
		if s != nil {
			_ = s.Unsubscribe()
		}
	}
	if d.stop != nil {
		d.stop()
	}
	done := make(chan struct{})
	go func() { d.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("stop dispatcher: %w", ctx.Err())
	}
}

// JetStream returns the dispatcher's JetStream context, for the console.
func (d *Dispatcher) JetStream() jetstream.JetStream { return d.js }

// Store returns the job-state store, for the HTTP API and the reaper.
func (d *Dispatcher) Store() *queue.Store { return d.store }

// consume processes the submit stream, many submissions at once.
func (d *Dispatcher) consume(ctx context.Context) {
	defer d.wg.Done()
	for {
		msg, err := d.intake.Next()
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) || ctx.Err() != nil {
				return
			}
			d.log.Warn("reading submissions", "err", err)
			continue
		}
		select {
		case d.sema <- struct{}{}:
		case <-ctx.Done():
			return
		}
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			defer func() { <-d.sema }()
			d.intakeOne(ctx, msg)
		}()
	}
}

type metrics struct {
	submitted metric.Int64Counter
	rejected  metric.Int64Counter
	latency   metric.Float64Histogram
}

func newMetrics(m metric.Meter) metrics {
	var x metrics
	x.submitted, _ = m.Int64Counter("fleet.dispatcher.jobs.submitted", metric.WithDescription("Requests accepted as jobs, by pool"))
	x.rejected, _ = m.Int64Counter("fleet.dispatcher.jobs.rejected", metric.WithDescription("Requests rejected, by reason"))
	x.latency, _ = m.Float64Histogram("fleet.dispatcher.submit.duration", metric.WithUnit("s"),
		metric.WithDescription("Time to validate, record and publish one submission"),
		metric.WithExplicitBucketBoundaries(0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1))
	return x
}
