// Command worker pulls the jobs of one pool and runs each attempt with the
// executor it is pinned to: local processes, a Docker host, or a Kubernetes
// namespace.
//
// On SIGTERM it stops pulling, lets running attempts finish for up to
// --drain-timeout, then stops the rest and hands their jobs back to the pool
// at once. A second SIGTERM hands them back without waiting.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	_ "net/http/pprof" // served only with --pprof
	"os"
	"path/filepath"
	"time"

	"github.com/fleet-dev/fleet/internal/cli"
	"github.com/fleet-dev/fleet/internal/executor/noop"
	"github.com/fleet-dev/fleet/internal/executor/process"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/internal/telemetry"
	"github.com/fleet-dev/fleet/internal/version"
	"github.com/fleet-dev/fleet/internal/worker"
	"github.com/fleet-dev/fleet/internal/workspace"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}

type flags struct {
	nats         cli.NATSFlags
	log          cli.LogFlags
	executor     string
	pool         string
	slots        int
	id           string
	prefix       string
	dataDir      string
	ackWait      time.Duration
	grace        time.Duration
	drainTimeout time.Duration
	keepFailed   bool
	metricsAddr  string
	maxOutput    int64
	pprof        bool
}

func run(args []string) error {
	var f flags
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	f.nats.Register(fs)
	f.log.Register(fs)
	fs.StringVar(&f.executor, "executor", "process", "how attempts run: process, docker, kubernetes or noop")
	fs.StringVar(&f.pool, "pool", "default", "the pool whose jobs this worker runs")
	fs.IntVar(&f.slots, "slots", 0, "attempts run at once (default: the number of CPUs)")
	fs.StringVar(&f.id, "id", "", "worker id, stable across restarts (default: the host name)")
	fs.StringVar(&f.prefix, "subject-prefix", queue.DefaultPrefix, "prefix of every subject, stream and bucket name")
	fs.StringVar(&f.dataDir, "data-dir", "./data", "folder of the attempts' workspaces")
	fs.DurationVar(&f.ackWait, "ack-wait", 30*time.Second, "the pool consumer's ack wait: how long a silent worker keeps a job")
	fs.DurationVar(&f.grace, "grace", 10*time.Second, "time between SIGTERM and SIGKILL when an attempt is stopped")
	fs.DurationVar(&f.drainTimeout, "drain-timeout", time.Minute, "on shutdown, how long running attempts may finish before they are handed back")
	fs.BoolVar(&f.keepFailed, "keep-failed", false, "keep the workspace (or container) of attempts that did not succeed")
	fs.StringVar(&f.metricsAddr, "metrics-addr", "", "address serving /metrics, /healthz and /readyz (off when empty)")
	fs.Int64Var(&f.maxOutput, "max-output-bytes", 512<<10, "largest total size of an attempt's declared outputs")
	fs.BoolVar(&f.pprof, "pprof", false, "serve Go profiles at /debug/pprof/ on the metrics address")
	fs.Usage = cli.Usage(fs, "usage: worker [flags]")
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

	tel, err := telemetry.Setup(ctx, telemetry.Config{Service: "fleet-worker", Version: version.Version})
	if err != nil {
		return err
	}
	defer func() { _ = tel.Shutdown(context.Background()) }()

	exec, err := newExecutor(&f)
	if err != nil {
		return err
	}
	cc, err := f.nats.Config("fleet-worker", log)
	if err != nil {
		return err
	}
	nc, err := queue.Connect(ctx, cc)
	if err != nil {
		return err
	}
	defer nc.Close()

	w, err := worker.New(nc, exec, worker.Config{
		ID: f.id, Pool: f.pool, Slots: f.slots, Backend: f.executor,
		Queue:  queue.Config{Names: queue.Names{Prefix: f.prefix}, AckWait: f.ackWait},
		Logger: log,
	})
	if err != nil {
		return err
	}
	setup, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := w.Start(setup); err != nil {
		return err
	}

	if f.metricsAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", tel.Metrics)
		if f.pprof {
			mux.Handle("/debug/pprof/", http.DefaultServeMux)
		}
		mux.HandleFunc("GET /healthz", func(rw http.ResponseWriter, _ *http.Request) { _, _ = rw.Write([]byte("ok\n")) })
		mux.HandleFunc("GET /readyz", func(rw http.ResponseWriter, _ *http.Request) {
			if !nc.IsConnected() || w.Draining() {
				http.Error(rw, "not ready", http.StatusServiceUnavailable)
				return
			}
			_, _ = rw.Write([]byte("ready\n"))
		})
		ln, err := net.Listen("tcp", f.metricsAddr)
		if err != nil {
			return fmt.Errorf("listen on %s: %w", f.metricsAddr, err)
		}
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, WriteTimeout: 30 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
	}

	<-ctx.Done()
	dctx, dcancel := context.WithTimeout(context.Background(), f.drainTimeout)
	defer dcancel()
	go func() {
		<-second
		log.Warn("second signal: handing back running jobs now")
		dcancel()
	}()
	_ = w.Stop(dctx)
	_ = nc.Drain()
	return nil
}

func newExecutor(f *flags) (worker.Executor, error) {
	switch f.executor {
	case "process":
		dir, err := filepath.Abs(filepath.Join(f.dataDir, "attempts"))
		if err != nil {
			return nil, err
		}
		return process.New(process.Config{Dir: dir, Grace: f.grace, KeepFailed: f.keepFailed,
			Outputs: workspace.Limits{MaxOutputBytes: f.maxOutput}})
	case "noop":
		return noop.Executor{}, nil
	case "docker", "kubernetes":
		return nil, fmt.Errorf("--executor %s is not built yet", f.executor)
	}
	return nil, fmt.Errorf("--executor %q: use process, docker, kubernetes or noop", f.executor)
}
