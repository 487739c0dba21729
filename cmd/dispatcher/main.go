// Command dispatcher accepts execution requests on NATS and over HTTP,
// validates them and publishes them as jobs for the workers of their pool.
//
// With --embedded it also runs the services a fleet needs (a NATS server
// with JetStream, a Redis-protocol store) in the same process, so that one
// dispatcher and one worker make a whole fleet on one machine.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	_ "net/http/pprof" // served only with --pprof
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleet-dev/fleet/internal/capacity"
	"github.com/fleet-dev/fleet/internal/capacity/monitor"
	"github.com/fleet-dev/fleet/internal/cli"
	"github.com/fleet-dev/fleet/internal/console"
	"github.com/fleet-dev/fleet/internal/dispatcher"
	"github.com/fleet-dev/fleet/internal/embedded"
	"github.com/fleet-dev/fleet/internal/lifecycle"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/internal/telemetry"
	"github.com/fleet-dev/fleet/internal/version"
	"github.com/fleet-dev/fleet/job"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "dispatcher:", err)
		os.Exit(1)
	}
}

type flags struct {
	nats        cli.NATSFlags
	log         cli.LogFlags
	httpAddr    string
	prefix      string
	dataDir     string
	embedded    bool
	natsConfig  string
	replicas    int
	retention   time.Duration
	ackWait     time.Duration
	maxRequest  int
	memoryStore bool
	v1          bool
	feeds       bool
	pprof       bool
	redis       cli.RedisFlags
	admission   string
	maxInputRef int64
	maxRunNodes int
	heartbeat   time.Duration
	tokenFile   string
	insecure    bool
	tlsCert     string
	tlsKey      string
	tlsClientCA string
	console     bool
	readOnly    bool
	traceURL    string
	schedLease  time.Duration
}

func run(args []string) error {
	var f flags
	fs := flag.NewFlagSet("dispatcher", flag.ContinueOnError)
	f.nats.Register(fs)
	f.log.Register(fs)
	fs.StringVar(&f.httpAddr, "http-addr", "127.0.0.1:8080", "address of the HTTP API")
	fs.StringVar(&f.prefix, "subject-prefix", queue.DefaultPrefix, "prefix of every subject, stream and bucket name")
	fs.StringVar(&f.dataDir, "data-dir", "./data", "folder of the embedded services' data")
	fs.BoolVar(&f.embedded, "embedded", false, "run NATS (at --nats-url) and a Redis-protocol store (at --redis-url) in this process")
	fs.StringVar(&f.natsConfig, "nats-server-config", "", "with --embedded: a NATS server configuration file (accounts, TLS)")
	fs.IntVar(&f.replicas, "replicas", queue.DefaultReplicas, "replicas of each stream (3 on a NATS cluster)")
	fs.DurationVar(&f.retention, "retention", queue.DefaultRetention, "how long events, results and job states are kept")
	fs.DurationVar(&f.ackWait, "ack-wait", dispatcher.DefaultAckWait, "how long the submit consumer waits for a dispatcher's ack")
	fs.IntVar(&f.maxRequest, "max-request-bytes", job.DefaultLimits.MaxRequestBytes, "largest request accepted")
	fs.Int64Var(&f.maxInputRef, "max-input-ref-bytes", job.DefaultMaxInputRefBytes, "largest total size of a request's inputs by reference (give workers the same)")
	fs.IntVar(&f.maxRunNodes, "max-run-nodes", job.DefaultMaxRunNodes, "most nodes of one run; a larger run is refused whole")
	fs.BoolVar(&f.feeds, "feeds", true, "keep each tenant's feed: a stream of the final version and rejection of each of its jobs, "+
		"which the tenant reads with a consumer the dispatchers make on its request (see docs/contract.md, \"The feed\")")
	fs.BoolVar(&f.v1, "v1", true, "keep contract v1 working beside v2 for its producers and consumers: "+
		"fleet.submit[.direct], fleet.cancel.<id>, fleet.events.<id>, fleet.results.<id> and the jobs bucket, "+
		"for the default tenant (off in the production profiles; see docs/contract.md on moving to v2)")
	fs.BoolVar(&f.memoryStore, "memory-storage", false, "keep streams in memory (tests and benchmarks only: nothing survives a restart)")
	f.redis.Register(fs, "Redis holding the workers' heartbeats and slot leases")
	fs.StringVar(&f.admission, "admission", monitor.AdmitReject,
		"a request no live worker of its pool could ever run: reject, queue (with a warning; for pools that scale from zero) or off")
	fs.DurationVar(&f.heartbeat, "heartbeat-interval", capacity.DefaultHeartbeatInterval, "the workers' heartbeat interval; the reaper looks this often")
	fs.StringVar(&f.tokenFile, "api-token-file", "", "file of bearer tokens for the HTTP API, one per line")
	fs.BoolVar(&f.insecure, "insecure-http", false, "serve the HTTP API on a non-loopback address without tokens or client certificates")
	fs.StringVar(&f.tlsCert, "tls-cert", "", "certificate of the HTTP API (serves HTTPS)")
	fs.StringVar(&f.tlsKey, "tls-key", "", "key of --tls-cert")
	fs.StringVar(&f.tlsClientCA, "tls-client-ca", "", "CA of client certificates: with it, clients must present one (mutual TLS)")
	fs.BoolVar(&f.console, "console", true, "serve the web console at /ui/ on the HTTP address")
	fs.BoolVar(&f.readOnly, "console-read-only", false, "the console shows everything but offers and accepts no cancel, retry, pause or resume")
	fs.StringVar(&f.traceURL, "trace-url", "", "link trace ids in the console: a URL template with {trace_id}, e.g. https://jaeger.example/trace/{trace_id}")
	fs.DurationVar(&f.schedLease, "schedule-lease", dispatcher.DefaultScheduleLease,
		"how long the dispatcher that fires the schedules holds their lease unrenewed: when it dies, another fires them within this and a second")
	fs.BoolVar(&f.pprof, "pprof", false, "serve Go profiles at /debug/pprof/ on the HTTP address")
	fs.Usage = cli.Usage(fs, "usage: dispatcher [flags]")
	if err := cli.Parse(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	log, err := f.log.Logger(os.Stderr)
	if err != nil {
		return err
	}
	ctx, second, stop := cli.SignalContext()
	defer stop()

	tel, err := telemetry.Setup(ctx, telemetry.Config{Service: "fleet-dispatcher", Version: version.Version})
	if err != nil {
		return err
	}
	defer func() { _ = tel.Shutdown(context.Background()) }()

	if f.embedded {
		dir, err := filepath.Abs(f.dataDir)
		if err != nil {
			return err
		}
		ns, err := embedded.StartNATS(embedded.NATSConfig{URL: f.nats.URL, DataDir: dir, ConfigFile: f.natsConfig})
		if err != nil {
			return err
		}
		defer ns.Shutdown()
		log.Info("embedded NATS server started", "url", ns.ClientURL(), "store", filepath.Join(dir, "jetstream"))
		if f.redis.URL != "" {
			if scheme, _, _ := strings.Cut(f.redis.URL, "://"); strings.Contains(scheme, "+") {
				return errors.New("--embedded runs one Redis-protocol store: --redis-url must be redis://host:port/db, not a Sentinel or Cluster URL")
			}
			rs, err := embedded.StartRedis(f.redis.URL)
			if err != nil {
				return err
			}
			defer rs.Close()
			log.Info("embedded Redis-protocol store started", "addr", rs.Addr())
		}
	}

	// What runs in the background starts in order and stops in the
	// reverse order: the API and the reaper before the dispatcher they
	// use, the dispatcher before the admission view it asks and before
	// the connections go.
	var running lifecycle.Group
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		go func() {
			select {
			case <-second:
				log.Warn("second signal: stopping now")
				cancel()
			case <-sctx.Done():
			}
		}()
		if err := running.Stop(sctx); err != nil {
			log.Warn("stopping", "err", err)
		}
	}()

	var caps *capacity.Store
	var admission *monitor.Admission
	if f.redis.URL != "" {
		// go-redis' global logger: its lines go to debug, since admission
		// and the reaper report an outage themselves (set here, not by the
		// package).
		redis.SetLogger(capacity.LibraryLogger(log))
		if caps, err = f.redis.Open(f.prefix, log); err != nil {
			return err
		}
		_ = running.Start(ctx, "the Redis connection", lifecycle.Closer(caps.Close))
		if admission, err = monitor.NewAdmission(caps, f.admission, log); err != nil {
			return err
		}
		// Workers seen before an outage count for three of their
		// heartbeats after it, while they report again.
		admission.Settle = 3 * f.heartbeat
		if err := running.Start(ctx, "admission", admission); err != nil {
			return err
		}
	}

	cc, err := f.nats.Config("fleet-dispatcher", log)
	if err != nil {
		return err
	}
	nc, err := queue.Connect(ctx, cc)
	if err != nil {
		return err
	}
	_ = running.Start(ctx, "the NATS connection", lifecycle.Closer(nc.Drain))

	cfg := dispatcher.Config{
		Queue: queue.Config{Names: queue.Names{Prefix: f.prefix}, Replicas: f.replicas, Retention: f.retention,
			AckWait: f.ackWait, MemoryStorage: f.memoryStore, V1: f.v1},
		Limits:        job.Limits{MaxRequestBytes: f.maxRequest, MaxInputRefBytes: f.maxInputRef},
		MaxRunNodes:   f.maxRunNodes,
		ScheduleLease: f.schedLease,
		NoFeeds:       !f.feeds,
		Logger:        log,
	}
	if admission != nil {
		cfg.Admission = admission
		cfg.Capacity = caps
	}
	d, err := dispatcher.New(nc, cfg)
	if err != nil {
		return err
	}
	// Start waits for as long as NATS needs (a cluster electing its leaders,
	// a node restarting), logging why; a signal ends the wait.
	if err := running.Start(ctx, "the dispatcher", d); err != nil {
		if ctx.Err() != nil {
			log.Info("stopped while starting", "err", err)
			return nil
		}
		return err
	}

	handler, auth, tlsConfig, err := guard(&f)
	if err != nil {
		return err
	}
	api := dispatcher.NewAPI(d)
	api.Handle("GET /metrics", tel.Metrics)
	var cons *console.Console
	if f.console {
		ccfg := console.Config{JS: d.JetStream(), Queue: cfg.Queue, Capacity: caps, History: d.History, Status: d.Status,
			Cancel: d.Cancel, Retry: d.RetryDeadLetter, Lag: d.Lag, Schedules: d.AllSchedules, PauseSchedule: d.PauseSchedule, Pools: d.AllPools,
			RunStatus: d.RunStatus, ListRuns: d.ListRuns, CancelRun: d.CancelRun, RetryRun: d.RetryRun,
			AnyHost: f.insecure, ReadOnly: f.readOnly, TraceURL: f.traceURL, HeartbeatInterval: f.heartbeat,
			Version: version.Version, Logger: log}
		if auth != nil {
			ccfg.Auth = auth
		}
		if cons, err = console.New(ccfg); err != nil {
			return err
		}
		if err := running.Start(ctx, "the console", cons); err != nil {
			return err
		}
		api.Handle("/ui/", cons)
		api.Handle("GET /{$}", http.RedirectHandler("/ui/", http.StatusSeeOther))
	}
	if caps != nil {
		api.ServeCapacity(caps)
		reaper := monitor.NewReaper(caps, monitor.ReaperConfig{Interval: f.heartbeat, Announce: d.Announce,
			Requeue: d.Requeue, Logger: log})
		if err := running.Start(ctx, "the reaper", reaper); err != nil {
			return err
		}
	}
	if f.pprof {
		api.Handle("/debug/pprof/", http.DefaultServeMux)
	}
	srv := &server{Server: &http.Server{Handler: handler(api), TLSConfig: tlsConfig, ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10},
		addr: f.httpAddr, cert: f.tlsCert, key: f.tlsKey, log: log}
	if cons != nil {
		srv.RegisterOnShutdown(cons.EndStreams) // open console pages would hold the shutdown
	}
	if err := running.Start(ctx, "the HTTP API", srv); err != nil {
		return err
	}
	log.Info("dispatcher ready", "http", srv.ln.Addr().String(), "nats", nc.ConnectedUrlRedacted(), "version", version.Version)

	select {
	case <-ctx.Done():
		log.Info("shutting down")
		return nil
	case err := <-srv.failed:
		return err
	}
}

// server serves the HTTP API.
type server struct {
	*http.Server
	addr, cert, key string
	log             *slog.Logger
	ln              net.Listener
	failed          chan error
}

func (s *server) Start(context.Context) error {
	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", s.addr, err)
	}
	s.ln, s.failed = ln, make(chan error, 1)
	go func() {
		serve := func() error { return s.Serve(ln) }
		if s.TLSConfig != nil {
			serve = func() error { return s.ServeTLS(ln, s.cert, s.key) }
		}
		if err := serve(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.failed <- fmt.Errorf("HTTP server: %w", err)
		}
	}()
	return nil
}

func (s *server) Stop(ctx context.Context) error { return s.Shutdown(ctx) }

// guard decides how the HTTP API is protected: tokens, client certificates,
// or nothing, which is allowed only on loopback or with --insecure-http.
func guard(f *flags) (func(http.Handler) http.Handler, *dispatcher.Auth, *tls.Config, error) {
	wrap := func(h http.Handler) http.Handler { return h }
	var tc *tls.Config
	if (f.tlsCert == "") != (f.tlsKey == "") {
		return nil, nil, nil, errors.New("--tls-cert and --tls-key go together")
	}
	if f.tlsCert != "" {
		tc = &tls.Config{MinVersion: tls.VersionTLS12}
		if f.tlsClientCA != "" {
			pem, err := os.ReadFile(f.tlsClientCA)
			if err != nil {
				return nil, nil, nil, fmt.Errorf("--tls-client-ca: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, nil, nil, fmt.Errorf("--tls-client-ca: no certificate in %s", f.tlsClientCA)
			}
			// Verified when given, required on /v1/ only: probes of
			// /healthz and /readyz carry no certificate.
			tc.ClientCAs, tc.ClientAuth = pool, tls.VerifyClientCertIfGiven
		}
	} else if f.tlsClientCA != "" {
		return nil, nil, nil, errors.New("--tls-client-ca needs --tls-cert and --tls-key")
	}
	var auth *dispatcher.Auth
	if f.tokenFile != "" || f.tlsClientCA != "" {
		auth = &dispatcher.Auth{Certs: f.tlsClientCA != ""}
		if f.tokenFile != "" {
			if err := auth.LoadTokens(f.tokenFile); err != nil {
				return nil, nil, nil, err
			}
		}
		wrap = auth.Wrap
	}
	open := f.tokenFile == "" && f.tlsClientCA == ""
	if open && !f.insecure && !dispatcher.Loopback(f.httpAddr) {
		return nil, nil, nil, fmt.Errorf("the HTTP API on %s would be open to the network: give --api-token-file or "+
			"--tls-client-ca, listen on loopback, or pass --insecure-http", f.httpAddr)
	}
	return wrap, auth, tc, nil
}
