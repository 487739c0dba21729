// Package console is the fleet's web console, served by the dispatcher on
// its HTTP address under /ui/: an overview of the pools, the jobs with
// filters, each job's detail with its live log, the workers, the dead
// letters and the schedules, every page kept live over server-sent events.
//
// Everything a page counts comes from memory: an index of the jobs (see
// Index), fed by the pools' streams (see feed.go), which it replays when
// it starts and then follows version by version, so that every dispatcher
// shows the same; the live workers, read from Redis once a second whatever
// the number of open consoles; and the dead letters, followed on their
// stream. A job's page reads the job's history through the dispatcher when
// it opens, then follows the job's subjects. The schedules are read
// through the dispatcher, at most once a second while pages show them. A
// run is read through the dispatcher when a page first shows it, and
// again when a message changes its round or state; its nodes' states come
// from the index (see runs.go).
//
// Pages, templates and assets are embedded in the binary. Pages carry no
// inline script and a strict Content-Security-Policy; every action is a
// form POST with a CSRF token; see auth.go for who may see what.
package console

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric"

	"github.com/fleet-dev/fleet/internal/capacity"
	"github.com/fleet-dev/fleet/internal/lifecycle"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/internal/telemetry"
	"github.com/fleet-dev/fleet/job"
)

// Config configures a Console.
type Config struct {
	JS    jetstream.JetStream
	Queue queue.Config
	// Capacity reads the workers' heartbeats and the lost workers.
	// Optional: without it the workers page says capacity is off.
	Capacity *capacity.Store
	// History returns every version of a tenant's job's record, and its
	// notices (the dispatcher's History), for the job's page. Required.
	History func(ctx context.Context, tenant, id string) (*job.HistoryReply, error)
	// Status returns the last version of a tenant's job's record (the
	// dispatcher's Status), to find the pool of a job the index does not
	// hold. Optional.
	Status func(ctx context.Context, tenant, id string) (*job.StatusReply, error)
	// Cancel cancels a tenant's job (the dispatcher's Cancel).
	Cancel func(ctx context.Context, tenant, id string) (*job.CancelReply, error)
	// Retry submits a tenant's dead-lettered job again (the dispatcher's
	// RetryDeadLetter).
	Retry func(ctx context.Context, tenant, id string) (*job.SubmitReply, error)
	// Schedules returns every tenant's schedules with their recent firings
	// (the dispatcher's AllSchedules), for the schedules page. Optional:
	// without it the page says schedules are off.
	Schedules func(ctx context.Context) (*job.ScheduleList, error)
	// Pools returns every pool's state and how its tenants fare (the
	// dispatcher's AllPools), for the pools page. Optional.
	Pools func(ctx context.Context) ([]*job.PoolState, error)
	// PauseSchedule pauses, or with paused false resumes, a tenant's
	// schedule (the dispatcher's PauseSchedule).
	PauseSchedule func(ctx context.Context, tenant, name string, paused bool) (*job.ScheduleInfo, error)
	// RunStatus returns a tenant's run as it stands (the dispatcher's
	// RunStatus), for the runs pages. Optional: without it, or without
	// ListRuns, the runs page says runs are off.
	RunStatus func(ctx context.Context, tenant, id string) (*job.RunView, error)
	// ListRuns lists a tenant's runs, oldest first (the dispatcher's
	// ListRuns), for the runs page. Optional.
	ListRuns func(ctx context.Context, tenant string) (*job.RunList, error)
	// CancelRun cancels a tenant's run (the dispatcher's CancelRun), and
	// RetryRun starts its next round (the dispatcher's RetryRun).
	// Optional: without them a run's page offers neither.
	CancelRun func(ctx context.Context, tenant, id string) (*job.RunReply, error)
	RetryRun  func(ctx context.Context, tenant, id string) (*job.RunReply, error)
	// Lag returns each pool's consumer lag. Optional.
	Lag func() map[string]queue.Lag
	// Auth decides who may use the console; nil leaves it open, which the
	// dispatcher allows only on loopback.
	Auth Auth
	// AnyHost lets an open console (no Auth) answer requests for any host
	// name, not only loopback ones (the dispatcher's --insecure-http).
	AnyHost bool
	// ReadOnly hides and refuses cancel, retry, pause and resume.
	ReadOnly bool
	// TraceURL links trace ids: {trace_id} is replaced by the id.
	TraceURL string
	// MaxJobs bounds the jobs the index keeps. Defaults to 500,000.
	MaxJobs int
	// WorkersEvery is how often the live workers are read. Defaults to
	// half a second.
	WorkersEvery time.Duration
	// HeartbeatInterval is the workers' heartbeat interval, to tell how
	// long a silent worker stays listed. Defaults to 3 seconds.
	HeartbeatInterval time.Duration
	Version           string
	Logger            *slog.Logger
}

// Console serves the web console. Start it before serving.
type Console struct {
	cfg   Config
	names queue.Names
	log   *slog.Logger
	index *Index
	feed  *feed
	work  *workers
	dead  *deadLetters
	sched *snapshot[*job.ScheduleList]
	pools *snapshot[[]*job.PoolState]
	runs  *runBook
	mux   *http.ServeMux
	pages *pages
	m     consoleMetrics

	// background holds the feeds of the index, the workers and the dead
	// letters.
	background lifecycle.Group

	closing   chan struct{} // closed when open streams must end
	closeOnce sync.Once
}

// New returns a Console; Start starts following the fleet.
func New(cfg Config) (*Console, error) {
	if cfg.JS == nil {
		return nil, errors.New("console: no JetStream")
	}
	if cfg.History == nil {
		return nil, errors.New("console: no History")
	}
	cfg.Queue = cfg.Queue.WithDefaults()
	cfg.MaxJobs = cmp.Or(cfg.MaxJobs, 500_000)
	cfg.WorkersEvery = cmp.Or(cfg.WorkersEvery, 500*time.Millisecond)
	cfg.HeartbeatInterval = cmp.Or(cfg.HeartbeatInterval, 3*time.Second)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	p, err := loadPages()
	if err != nil {
		return nil, err
	}
	c := &Console{cfg: cfg, names: cfg.Queue.Names, log: cfg.Logger.With("component", "console"),
		index: NewIndex(cfg.Queue.Retention, cfg.MaxJobs), pages: p, closing: make(chan struct{})}
	c.feed = newFeed(cfg.JS, c.names, c.index, c.log)
	c.work = &workers{caps: cfg.Capacity, every: cfg.WorkersEvery, log: c.log}
	c.dead = &deadLetters{max: 5000}
	c.sched = &snapshot[*job.ScheduleList]{what: "the schedules", read: cfg.Schedules}
	c.pools = &snapshot[[]*job.PoolState]{what: "the pools", read: cfg.Pools}
	c.runs = newRunBook(cfg)
	c.m = newConsoleMetrics(c)
	c.routes()
	return c, nil
}

// Index returns the console's index of jobs.
func (c *Console) Index() *Index { return c.index }

// Start starts following the pools' streams, the workers, the dead
// letters and the messages that change runs. It does not wait for the
// index to be complete: pages say so until it is.
func (c *Console) Start(ctx context.Context) error {
	feeds := []struct {
		name string
		svc  lifecycle.Service
	}{
		{"the index's feed", loop(func(ctx context.Context) {
			lifecycle.Again(ctx, c.log, "following the pools' streams", time.Second, 10*time.Second, c.feed.run)
		})},
		{"the index's sweep", &lifecycle.Every{Interval: time.Minute, Fn: func(context.Context) { c.index.Sweep(time.Now()) }, Later: true}},
		{"the workers' feed", c.work.service()},
		{"the dead letters' feed", loop(c.followDeadLetters)},
		{"the runs' feed", lifecycle.Func{
			StartFunc: func(context.Context) error { return c.runs.follow(c.cfg.JS.Conn(), c.names) },
			StopFunc:  func(context.Context) error { c.runs.stop(); return nil },
		}},
	}
	for _, f := range feeds {
		if err := c.background.Start(ctx, f.name, f.svc); err != nil {
			return fmt.Errorf("console: %w", err)
		}
	}
	return nil
}

// EndStreams ends the open pages' streams, which would otherwise keep an
// HTTP server's graceful shutdown waiting (see http.Server.RegisterOnShutdown).
// Their pages reconnect to another dispatcher, or when this one is back.
func (c *Console) EndStreams() { c.closeOnce.Do(func() { close(c.closing) }) }

// Stop stops following the fleet; open pages' streams end.
func (c *Console) Stop(ctx context.Context) error {
	c.EndStreams()
	c.m.unregister()
	if err := c.background.Stop(ctx); err != nil {
		return fmt.Errorf("stop console: %w", err)
	}
	return nil
}

// loop is a Service running fn until Stop.
func loop(fn func(context.Context)) lifecycle.Service {
	return &loopRunner{fn: fn}
}

type loopRunner struct {
	lifecycle.Runner
	fn func(context.Context)
}

func (l *loopRunner) Start(ctx context.Context) error {
	return l.Go(ctx, func(ctx context.Context) error { l.fn(ctx); return nil })
}

type consoleMetrics struct {
	streams    metric.Int64UpDownCounter
	actions    metric.Int64Counter
	unregister func()
}

func newConsoleMetrics(c *Console) consoleMetrics {
	m := telemetry.Meter()
	var x consoleMetrics
	x.streams, _ = m.Int64UpDownCounter("fleet.console.streams", metric.WithDescription("Console pages open with a live stream"))
	x.actions, _ = m.Int64Counter("fleet.console.actions", metric.WithDescription("Cancels, retries, pauses and resumes asked from the console, by action"))
	jobs, _ := m.Int64ObservableGauge("fleet.console.index.jobs", metric.WithDescription("Jobs in the console's index"))
	applied, _ := m.Int64ObservableCounter("fleet.console.index.updates", metric.WithDescription("Job records the console's index has applied"))
	reg, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveInt64(jobs, int64(c.index.Len()))
		o.ObserveInt64(applied, int64(c.index.applied.Load()))
		return nil
	}, jobs, applied)
	x.unregister = func() {}
	if err == nil {
		x.unregister = func() { _ = reg.Unregister() }
	}
	return x
}
