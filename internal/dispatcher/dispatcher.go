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
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/fleet-dev/fleet/internal/artifact"
	"github.com/fleet-dev/fleet/internal/capacity"
	"github.com/fleet-dev/fleet/internal/lifecycle"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/internal/runs"
	"github.com/fleet-dev/fleet/internal/scheduler"
	"github.com/fleet-dev/fleet/internal/telemetry"
	"github.com/fleet-dev/fleet/job"
)

// Defaults of Config, and of the dispatcher's flags.
const (
	// DefaultAckWait is the intake consumer's ack wait: how long a stored
	// submission stays with a dispatcher that took it. A dispatcher queues
	// one in milliseconds; the wait is what a submission whose delivery
	// was lost with a NATS server costs (30 s before: the worst of a chaos
	// run's intake path).
	DefaultAckWait = 5 * time.Second
	// DefaultInFlight bounds the submissions processed at once.
	DefaultInFlight = 512
)

// Config configures a Dispatcher.
type Config struct {
	// Queue describes the streams; its AckWait is the submit consumer's
	// (DefaultAckWait when zero, not the pools' default).
	Queue queue.Config
	// Limits bound requests. Defaults to job.DefaultLimits.
	Limits job.Limits
	// InFlight bounds the submissions processed at once. Defaults to
	// DefaultInFlight (512).
	InFlight int
	// Admission checks a request against the fleet's capacity. Defaults to
	// accepting every request.
	Admission Admission
	// Capacity is the fleet's Redis, when it has one: pool show and the
	// fleet.tenant.* gauges read what each tenant runs from it.
	Capacity *capacity.Store
	// ScheduleLease is how long the dispatcher that fires the schedules
	// keeps their lease without renewing it: when it dies, another fires
	// them within this and a second. Defaults to DefaultScheduleLease (3s).
	ScheduleLease time.Duration
	// MaxRunNodes bounds the nodes of one run. Defaults to
	// job.DefaultMaxRunNodes.
	MaxRunNodes int
	// RunsPinnedTTL is how long the runs wait when the dispatcher that
	// releases their nodes dies. Defaults to runs.DefaultPinnedTTL.
	RunsPinnedTTL time.Duration
	// NoFeeds keeps the tenants' feeds (see queue.EnsureFeed) from being
	// made: their jobs' final versions are then only republished live.
	NoFeeds bool
	// Now is the schedules' clock. Defaults to time.Now; tests move it.
	Now func() time.Time
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Admission decides whether a pool can ever run a request. An error is a
// rejection reason; a non-empty warning accepts the request with a note.
type Admission interface {
	Admit(ctx context.Context, r *job.Request) (warning string, err error)
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.Queue.AckWait = cmp.Or(c.Queue.AckWait, DefaultAckWait)
	c.Queue = c.Queue.WithDefaults()
	c.Limits = c.Limits.WithDefaults()
	c.InFlight = cmp.Or(c.InFlight, DefaultInFlight)
	c.ScheduleLease = cmp.Or(c.ScheduleLease, DefaultScheduleLease)
	c.MaxRunNodes = cmp.Or(c.MaxRunNodes, job.DefaultMaxRunNodes)
	c.RunsPinnedTTL = cmp.Or(c.RunsPinnedTTL, runs.DefaultPinnedTTL)
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	if !queue.ValidPrefix(c.Queue.Prefix) {
		return fmt.Errorf("subject prefix %q: use 1 to 32 letters, digits, - and _", c.Queue.Prefix)
	}
	if c.Queue.Replicas < 1 || c.Queue.Replicas > 5 {
		return fmt.Errorf("replicas %d: use 1 to 5", c.Queue.Replicas)
	}
	if c.InFlight < 1 {
		return fmt.Errorf("in-flight %d: must be positive", c.InFlight)
	}
	if c.Queue.AckWait < time.Second {
		return fmt.Errorf("ack wait %s: at least a second", c.Queue.AckWait)
	}
	if c.ScheduleLease < time.Second {
		return fmt.Errorf("schedule lease %s: at least a second", c.ScheduleLease)
	}
	if c.Limits.MaxRequestBytes < 1024 {
		return fmt.Errorf("max request bytes %d: at least 1024", c.Limits.MaxRequestBytes)
	}
	return nil
}

// Dispatcher accepts requests and publishes jobs.
type Dispatcher struct {
	cfg   Config
	nc    *nats.Conn
	js    jetstream.JetStream
	names queue.Names
	// jobs keeps the jobs' records in their pools' streams (v2); sealer
	// seals the requests' secrets in them.
	jobs   *queue.Jobs
	sealer *queue.Sealer
	// store is the v1 jobs bucket, with V1 only.
	store *queue.Store
	log   *slog.Logger
	m     metrics

	replies *replies
	pools   sync.Map // pool → true, once its stream is ensured
	queues  sync.Map // queueOf → *poolSetup, once its consumer is ensured
	uploads sync.Map // tenant → true, once its uploads bucket is ensured
	feeder  *feeder  // keeps the tenants' feeds sourcing their pools
	// poolNames lists the pools that have a stream, as last listed.
	poolsMu     sync.Mutex
	poolNames   []string
	poolsListed time.Time
	peers       *peers
	placer      *placer
	lag         *lag
	// background holds the dispatcher's loops, stopped in reverse.
	background lifecycle.Group
	// subs are the subscriptions, dropped first at Stop.
	subs []*nats.Subscription
	// poolStates is the pools bucket: what operators set about pools.
	poolStates jetstream.KeyValue
	// schedules is the schedules bucket; sched fires them while this
	// dispatcher holds their lease.
	schedules jetstream.KeyValue
	sched     *scheduler.Scheduler
	// runs is the runs' stream; releaser queues their nodes.
	runs     *queue.Runs
	releaser *runs.Releaser
	intakes  []jetstream.MessagesContext
	// inFlight counts the submissions and requests being processed, which
	// Stop waits for.
	inFlight sync.WaitGroup
	runners  *runners
	ready    chan struct{}
}

// New returns a Dispatcher; Start starts it.
func New(nc *nats.Conn, cfg Config) (*Dispatcher, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("dispatcher config: %w", err)
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(8192), jetstream.WithPublishAsyncTimeout(queue.AsyncPublishTimeout))
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	d := &Dispatcher{
		cfg: cfg, nc: nc, js: js, names: cfg.Queue.Names,
		log:     cfg.Logger.With("component", "dispatcher"),
		runners: newRunners(cfg.InFlight),
		ready:   make(chan struct{}),
		lag:     &lag{pending: map[string]uint64{}, inFlight: map[string]int{}},
	}
	// Inputs by reference are checked against the object store first.
	d.cfg.Admission = inputCheck{s: artifact.New(js, artifact.Config{Names: cfg.Queue.Names}),
		limit: cfg.Limits.MaxInputRefBytes, next: cfg.Admission}
	d.m = newMetrics(telemetry.Meter())
	d.replies = newReplies(nc)
	d.feeder = newFeeder(d)
	return d, nil
}

// Start creates or updates the streams and the buckets, and starts taking
// submissions. It returns once the dispatcher is ready. While the NATS
// cluster elects its leaders it waits and logs why, until ctx ends; any
// number of dispatchers may start at once.
func (d *Dispatcher) Start(ctx context.Context) error {
	// A try of a write or a read sent while a stream had no leader is sent
	// again as soon as the servers say it has one (queue.Elections); the
	// placer hears the same advisories.
	elections := queue.NewElections()
	ctx = queue.WithElections(ctx, elections)
	if d.cfg.Queue.Replicas > 1 {
		d.placer = newPlacer()
	}
	sub, err := d.nc.Subscribe(leaderElected, func(m *nats.Msg) {
		elections.Elected()
		if d.placer != nil {
			d.placer.elected(m)
		}
	})
	if err != nil {
		return fmt.Errorf("subscribe to %s: %w", leaderElected, err)
	}
	d.subs = append(d.subs, sub)
	if d.placer != nil {
		sub, err := d.nc.Subscribe(consumerLeaderElected, d.placer.elected)
		if err != nil {
			return fmt.Errorf("subscribe to %s: %w", consumerLeaderElected, err)
		}
		d.subs = append(d.subs, sub)
	}
	if err := queue.Setup(ctx, d.js, d.cfg.Queue, d.log); err != nil {
		return err
	}
	d.jobs = queue.NewJobs(d.js, d.names).WithLogger(d.log)
	d.runs = queue.NewRuns(d.js, d.names)
	sealer, err := queue.OpenSealer(ctx, d.js, d.names, true, d.log)
	if err != nil {
		return err
	}
	d.sealer = sealer
	if d.poolStates, err = queue.OpenBucket(ctx, d.js, d.names.PoolsBucket(), d.log); err != nil {
		return err
	}
	if d.schedules, err = queue.OpenBucket(ctx, d.js, d.names.SchedulesBucket(), d.log); err != nil {
		return err
	}
	intake, err := queue.IntakeConsumerV2(ctx, d.js, d.cfg.Queue, d.log)
	if err != nil {
		return err
	}
	p, pinging, err := d.startPeers()
	if err != nil {
		return fmt.Errorf("announce the dispatcher: %w", err)
	}
	d.peers = p
	if err := d.background.Start(ctx, "announcing the dispatcher", pinging); err != nil {
		return err
	}
	// Submissions that wait for their answer are answered by one
	// dispatcher of the group, at once: nothing is stored before the job.
	directs := make(chan *nats.Msg, directBuffer)
	// (A submission taken at once lives until it is answered, within
	// submitDeadline, past Stop: Stop waits for it.)
	live := context.WithoutCancel(ctx)
	onDirect := func(m *nats.Msg) {
		// A runner free takes it at once; else it waits its turn.
		d.inFlight.Add(1)
		if d.runners.try(func() {
			defer d.inFlight.Done()
			d.answerDirect(live, m)
		}) {
			return
		}
		d.inFlight.Done()
		select {
		case directs <- m:
		default:
			// Full: the producer sends it again, rather than NATS dropping
			// it without a word.
			d.busy(m)
		}
	}
	subscribe := map[string]nats.MsgHandler{
		d.names.AllSubmitV2():          onDirect,
		d.names.AllRequests("cancel"):  d.onRequest,
		d.names.AllRequests("status"):  d.onRequest,
		d.names.AllRequests("history"): d.onRequest,
		d.names.AllRequests("retry"):   d.onRequest,
		d.names.AllUploadsRequests():   d.onRequest,
		d.names.AllRequests("feed"):    d.onRequest,
		d.names.AllPools():             d.onPool,
		d.names.AllScheduleRequests():  d.onSchedule,
		d.names.AllRunRequests():       d.onRunRequest,
	}
	if d.cfg.Queue.V1 {
		if err := d.startV1(ctx, subscribe, onDirect); err != nil {
			return err
		}
	}
	for subject, h := range subscribe {
		sub, err := d.nc.QueueSubscribe(subject, queueGroup, h)
		if err != nil {
			return fmt.Errorf("subscribe to %s: %w", subject, err)
		}
		d.subs = append(d.subs, sub)
	}
	msgs, err := intake.Messages(d.intakePull()...)
	if err != nil {
		return fmt.Errorf("consume %s: %w", d.names.IntakeStream(), err)
	}
	d.intakes = append(d.intakes, msgs)
	unregisterLag, unregisterTenants := d.lagGauges(), d.tenantGauges()
	unregister := func() { unregisterLag(); unregisterTenants() }
	lagLoop := lifecycle.NewEvery(lagEvery, d.refreshLag)
	type service struct {
		name string
		svc  lifecycle.Service
	}
	services := []service{
		{"the direct submissions", &goService{run: func(ctx context.Context) error { return d.serveDirect(ctx, directs) }}},
		{"the pools' lag", lifecycle.Func{StartFunc: lagLoop.Start, StopFunc: func(ctx context.Context) error {
			defer unregister()
			return lagLoop.Stop(ctx)
		}}},
	}
	for _, m := range d.intakes {
		services = append(services, service{"the intake of stored submissions", &goService{run: func(ctx context.Context) error {
			return d.consume(ctx, m)
		}}})
	}
	d.sched = scheduler.New(scheduler.Config{Dispatcher: schedulerSide{d}, Bucket: d.schedules, JetStream: d.js,
		Self: d.peers.self, Lease: d.cfg.ScheduleLease, Limits: d.cfg.Limits, Now: d.cfg.Now, Logger: d.cfg.Logger})
	services = append(services, service{"the scheduler", d.sched})
	d.releaser = runs.New(d.js, runsSide{d}, runs.Config{Queue: d.cfg.Queue, Sealer: d.sealer, Logger: d.cfg.Logger,
		PinnedTTL: d.cfg.RunsPinnedTTL})
	services = append(services, service{"the releaser of runs' nodes", d.releaser})
	if d.cfg.Queue.V1 {
		services = append(services, service{"the sweep of unanswered v1 requests", lifecycle.NewEvery(time.Second, d.replies.sweep)})
	}
	if !d.cfg.NoFeeds {
		services = append(services, service{"the feeds of the tenants", d.feeder})
	}
	if d.placer != nil {
		services = append(services, service{"the placer of the queues", &goService{run: d.runPlacer}})
		services = append(services, service{"the balancer of streams' leaders", lifecycle.NewEvery(balanceEvery, func(ctx context.Context) {
			ctx, cancel := context.WithTimeout(ctx, balanceEvery)
			defer cancel()
			if _, err := d.balance(ctx); err != nil {
				d.log.Debug("balancing the streams' leaders", "err", err)
			}
		})})
	}
	for _, s := range services {
		if err := d.background.Start(ctx, s.name, s.svc); err != nil {
			return err
		}
	}
	close(d.ready)
	d.log.Info("dispatcher started", "submit", d.names.AllSubmitV2(), "v1", d.cfg.Queue.V1)
	return nil
}

// intakePull says how the dispatchers pull stored submissions: a pull
// request lasts 2 s and the server says every half second (the shortest
// the client takes) that it still holds it, so that a pull lost with the
// consumer's leader or with the server the dispatcher was connected to is
// noticed and sent again within a second, not after the client's default
// 30 s expiry; storing a submission costs its producer that wait
// (TestChaosOnACluster: accepted 12 s after it was sent with the default;
// TestFailoverCostsOnlyTheElections: 2 s with a heartbeat a second).
func (d *Dispatcher) intakePull() []jetstream.PullMessagesOpt {
	return []jetstream.PullMessagesOpt{jetstream.PullMaxMessages(min(d.cfg.InFlight, 256)),
		jetstream.PullExpiry(2 * time.Second), jetstream.PullHeartbeat(500 * time.Millisecond)}
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
	for _, m := range d.intakes {
		m.Stop()
	}
	for _, s := range d.subs {
		_ = s.Unsubscribe()
	}
	err := d.background.Stop(ctx)
	done := make(chan struct{})
	go func() { d.inFlight.Wait(); d.runners.close(); close(done) }()
	select {
	case <-done:
		return err
	case <-ctx.Done():
		return errors.Join(err, fmt.Errorf("stop dispatcher: %w", ctx.Err()))
	}
}

// goService runs a function in the background until Stop.
type goService struct {
	lifecycle.Runner
	run func(context.Context) error
}

func (g *goService) Start(ctx context.Context) error { return g.Go(ctx, g.run) }

// JetStream returns the dispatcher's JetStream context, for the console.
func (d *Dispatcher) JetStream() jetstream.JetStream { return d.js }

// Store returns the job-state store, for the HTTP API and the reaper.
func (d *Dispatcher) Store() *queue.Store { return d.store }

// consume processes a stream of stored submissions, many at once, until
// ctx ends. A read that fails is tried again after a short backoff: the
// iterator pulls again by itself (a pull whose heartbeats stop, while the
// intake's consumer elects a leader, ends as an error here every second),
// so a longer one only holds back what it brings once the consumer is
// back. Up to 5 s, as it was, held every submission stored during an
// election 2.8 s beyond the elections (TestFailoverCostsOnlyTheElections).
func (d *Dispatcher) consume(ctx context.Context, intake jetstream.MessagesContext) error {
	wait := lifecycle.Backoff(ctx, 50*time.Millisecond, 250*time.Millisecond)
	for {
		msg, err := intake.Next()
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) || ctx.Err() != nil {
				return nil
			}
			next := wait.NextBackOff()
			if next == backoff.Stop {
				return nil
			}
			d.log.Warn("reading submissions", "err", err, "again_in", next.Round(time.Millisecond))
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(next):
			}
			continue
		}
		wait.Reset()
		d.inFlight.Add(1)
		if !d.runners.run(ctx, func() {
			defer d.inFlight.Done()
			d.intakeOne(ctx, msg)
		}) {
			d.inFlight.Done()
			return nil
		}
	}
}

// submitDeadline bounds the work on one submission, so that a NATS
// outage holds no dispatcher's slots and goroutines for longer than its
// producer waits: a producer's try waits for its answer at most 1.5 s
// (queue.Retry) before it sends the submission again, with its id, and a
// stored submission comes back after the intake's ack wait (5 s). A
// submission given up midway is taken again whole: its id makes it one
// job.
const submitDeadline = 5 * time.Second

// leaderElected is the servers' advisory that a stream elected a leader,
// consumerLeaderElected that a consumer did.
var (
	leaderElected         = queue.LeaderElected("*")
	consumerLeaderElected = "$JS.EVENT.ADVISORY.CONSUMER.LEADER_ELECTED.*.*"
)

// queueGroup is the dispatchers' queue group: one of them gets each
// direct submission and each cancel.
const queueGroup = "fleet-dispatcher"

// directBuffer is how many direct submissions wait for a dispatcher's
// goroutine; past it, they are answered busy and their producers send them
// again.
const directBuffer = 16384

// serveDirect answers the submissions of the direct subject, many at once,
// until ctx ends.
func (d *Dispatcher) serveDirect(ctx context.Context, msgs <-chan *nats.Msg) error {
	for {
		var m *nats.Msg
		select {
		case m = <-msgs:
		case <-ctx.Done():
			return nil
		}
		d.inFlight.Add(1)
		if !d.runners.run(ctx, func() {
			defer d.inFlight.Done()
			d.answerDirect(ctx, m)
		}) {
			d.inFlight.Done()
			return nil
		}
	}
}

// answerDirect processes one direct submission and answers it. When the
// fleet cannot decide now, the answer is NATS' "no responders" status, on
// which clients send the submission again at once (with its id, so that
// it is never accepted twice).
func (d *Dispatcher) answerDirect(ctx context.Context, m *nats.Msg) {
	ctx, cancel := context.WithTimeout(ctx, submitDeadline)
	defer cancel()
	pctx := telemetry.Propagator.Extract(ctx, queue.HeaderCarrier(m.Header))
	pctx = withSubmission(pctx, m.Header.Get(job.SubmissionHeader))
	reply, err := d.process(pctx, d.tenantOf(m.Subject), m.Data)
	if m.Reply == "" {
		if err != nil {
			d.log.Warn("direct submission without a reply subject not processed", "err", err)
		}
		return
	}
	if err != nil {
		d.log.Warn("submission not processed; its producer will send it again", "err", err)
		d.busy(m)
		return
	}
	data, err := json.Marshal(reply)
	if err != nil {
		return
	}
	_ = m.Respond(data)
}

// tenantOf is the tenant of a submission's subject: the v2 subject names
// it, a v1 submission is the default tenant's.
func (d *Dispatcher) tenantOf(subject string) string {
	if tenant, verb, _, ok := d.names.ParseTenantRequest(subject); ok && (verb == "submit" || verb == "intake") {
		return tenant
	}
	return job.DefaultTenant
}

// busy answers a direct submission with NATS' "no responders" status, on
// which clients send it again at once, with its id.
func (d *Dispatcher) busy(m *nats.Msg) {
	if m.Reply == "" {
		return
	}
	busy := nats.NewMsg(m.Reply)
	busy.Header.Set("Status", "503")
	_ = d.nc.PublishMsg(busy)
}

type metrics struct {
	submitted metric.Int64Counter
	runs      metric.Int64Counter
	rejected  metric.Int64Counter
	latency   metric.Float64Histogram
	// leaderMoves counts the leaders of streams the balancer moved.
	leaderMoves metric.Int64Counter
	// queueMoves counts the consumers the placer moved to their stream's
	// leader.
	queueMoves metric.Int64Counter
	// feedConsumers counts the consumers of tenants' feeds asked for.
	feedConsumers metric.Int64Counter
	// byPool are the attribute sets of the pools' submissions.
	byPool *telemetry.Options[string]
}

// countSubmitted counts a job submitted to pool.
func (x *metrics) countSubmitted(ctx context.Context, pool string) {
	x.submitted.Add(ctx, 1, x.byPool.Get(pool))
}

func newMetrics(m metric.Meter) metrics {
	x := metrics{byPool: telemetry.NewOptions(telemetry.OptionsLimit, func(pool string) metric.MeasurementOption {
		return metric.WithAttributeSet(attribute.NewSet(attribute.String("pool", pool)))
	})}
	x.submitted, _ = m.Int64Counter("fleet.dispatcher.jobs.submitted", metric.WithDescription("Requests accepted as jobs, by pool"))
	x.rejected, _ = m.Int64Counter("fleet.dispatcher.jobs.rejected", metric.WithDescription("Requests rejected, by reason"))
	x.runs, _ = m.Int64Counter("fleet.dispatcher.runs.submitted", metric.WithDescription("Runs accepted"))
	x.latency, _ = m.Float64Histogram("fleet.dispatcher.submit.duration", metric.WithUnit("s"),
		metric.WithDescription("Time to validate, record and publish one submission"),
		metric.WithExplicitBucketBoundaries(0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1))
	x.leaderMoves, _ = m.Int64Counter("fleet.dispatcher.stream_leaders.moved",
		metric.WithDescription("Stream leaders moved to another server to spread them over a NATS cluster"))
	x.queueMoves, _ = m.Int64Counter("fleet.dispatcher.queues.moved",
		metric.WithDescription("Consumers of the pools' queues and of the intake moved to the server that leads their stream, by stream"))
	x.feedConsumers, _ = m.Int64Counter("fleet.dispatcher.feed_consumers.made",
		metric.WithDescription("Consumers of tenants' feeds made (or found as asked) on their request"))
	return x
}
