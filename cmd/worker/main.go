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
	"log/slog"
	"net"
	"net/http"
	_ "net/http/pprof" // served only with --pprof
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/fleet-dev/fleet/internal/artifact"
	"github.com/fleet-dev/fleet/internal/capacity"
	"github.com/fleet-dev/fleet/internal/capacity/ledger"
	"github.com/fleet-dev/fleet/internal/cli"
	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/executor/docker"
	"github.com/fleet-dev/fleet/internal/executor/kube"
	"github.com/fleet-dev/fleet/internal/executor/noop"
	"github.com/fleet-dev/fleet/internal/executor/process"
	"github.com/fleet-dev/fleet/internal/lifecycle"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/internal/telemetry"
	"github.com/fleet-dev/fleet/internal/version"
	"github.com/fleet-dev/fleet/internal/worker"
	"github.com/fleet-dev/fleet/internal/workspace"
	"github.com/fleet-dev/fleet/job"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
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
	artifacts    bool
	maxArtifact  int64
	maxJobArts   int64
	maxLog       int64
	archiveLogs  bool
	maxInputRef  int64
	pprof        bool
	runningAfter time.Duration
	redis        cli.RedisFlags
	heartbeat    time.Duration
	cpu, memory  string
	gpus         int
	labels       string
	// docker
	allowedImages string
	dockerHost    string
	dockerNetwork string
	dockerUser    string
	// kubernetes
	kubeconfig       string
	namespace        string
	cpuLimitRatio    float64
	memoryLimitRatio float64
	imagePullWait    time.Duration
	pendingWait      time.Duration
	jobTTL           time.Duration
	sharedPVC        string
	sharedDir        string
	podTemplate      string
	// adoption, placement, data
	handoff       bool
	adoptWait     time.Duration
	placementKeys string
	dockerConfig  string
	nvidiaSMI     string
	dataRetention time.Duration
}

func run(args []string) error {
	var f flags
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	f.nats.Register(fs)
	f.log.Register(fs)
	fs.StringVar(&f.executor, "executor", "process", "how attempts run: process, docker, kubernetes or noop")
	fs.StringVar(&f.pool, "pool", job.DefaultPool, "the pool whose jobs this worker runs")
	fs.IntVar(&f.slots, "slots", 0, "attempts run at once (default: the number of CPUs)")
	fs.StringVar(&f.id, "id", "", "worker id, stable across restarts (default: the host name)")
	fs.StringVar(&f.prefix, "subject-prefix", queue.DefaultPrefix, "prefix of every subject, stream and bucket name")
	fs.StringVar(&f.dataDir, "data-dir", "./data", "folder of the attempts' workspaces")
	fs.DurationVar(&f.ackWait, "ack-wait", queue.DefaultAckWait, "the pool consumer's ack wait: how long a silent worker keeps a job")
	fs.DurationVar(&f.grace, "grace", executor.DefaultGrace, "time between SIGTERM and SIGKILL when an attempt is stopped")
	fs.DurationVar(&f.runningAfter, "running-after", worker.DefaultRunningAfter, "record an attempt as running once it has run this long; one that ends sooner goes from queued to its end in one write (0: before it starts; docker and kubernetes attempts, which outlive their worker, always are)")
	fs.DurationVar(&f.drainTimeout, "drain-timeout", worker.DefaultDrainTimeout, "on shutdown, how long running attempts may finish before they are handed back")
	fs.BoolVar(&f.keepFailed, "keep-failed", false, "keep the workspace (or container) of attempts that did not succeed")
	fs.StringVar(&f.metricsAddr, "metrics-addr", "", "address serving /metrics, /healthz and /readyz (off when empty)")
	fs.Int64Var(&f.maxOutput, "max-output-bytes", workspace.DefaultMaxOutputBytes, "declared outputs carried in the result as text, together; larger or binary outputs are stored as objects")
	fs.BoolVar(&f.artifacts, "artifacts", true, "use the fleet's object store: inputs by reference, outputs stored as objects, archived logs")
	fs.Int64Var(&f.maxArtifact, "max-artifact-bytes", artifact.DefaultMaxOutputBytes, "largest output stored as an object")
	fs.Int64Var(&f.maxJobArts, "max-job-artifact-bytes", artifact.DefaultMaxJobOutputBytes, "largest total of an attempt's outputs stored as objects")
	fs.Int64Var(&f.maxLog, "max-log-bytes", artifact.DefaultMaxLogBytes, "largest archived log of one attempt; later lines are counted, not kept")
	fs.BoolVar(&f.archiveLogs, "archive-logs", true, "keep every line of every attempt's output in the object store")
	fs.Int64Var(&f.maxInputRef, "max-input-ref-bytes", job.DefaultMaxInputRefBytes, "largest total size of a job's inputs by reference (as the dispatchers' flag)")
	fs.BoolVar(&f.pprof, "pprof", false, "serve Go profiles at /debug/pprof/ on the metrics address")
	f.redis.Register(fs, "Redis for heartbeats and slot leases")
	fs.DurationVar(&f.heartbeat, "heartbeat-interval", capacity.DefaultHeartbeatInterval, "how often the worker reports its capacity; it is forgotten after three intervals")
	fs.StringVar(&f.cpu, "cpu", "", "CPU the worker may hand out, as a quantity (default: what the backend has; unknown for processes)")
	fs.StringVar(&f.memory, "memory", "", "memory the worker may hand out, as a quantity (default: what the backend has; unknown for processes)")
	fs.IntVar(&f.gpus, "gpus", 0, "GPUs the worker may hand out (default: what the backend has)")
	fs.StringVar(&f.labels, "labels", "", "labels of the worker in heartbeats: k=v,k2=v2")
	fs.StringVar(&f.allowedImages, "allowed-images", "", "docker: comma-separated image prefixes jobs may use (default: any)")
	fs.StringVar(&f.dockerHost, "docker-host", "", "docker: the daemon's address (default: DOCKER_HOST, else the local socket)")
	fs.StringVar(&f.dockerNetwork, "docker-network", "", "docker: the network containers join (default: the daemon's bridge; host is refused)")
	fs.StringVar(&f.dockerUser, "docker-user", "", "docker: the user of containers whose image runs as root or names none (default 65534:65534)")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubernetes: kubeconfig file (default: KUBECONFIG, ~/.kube/config, else in-cluster)")
	fs.StringVar(&f.namespace, "namespace", "", "kubernetes: the namespace of the Jobs (default: the kubeconfig's, or the pod's own)")
	fs.Float64Var(&f.cpuLimitRatio, "cpu-limit-ratio", kube.DefaultCPULimitRatio, "kubernetes: CPU limit as a multiple of the request")
	fs.Float64Var(&f.memoryLimitRatio, "memory-limit-ratio", kube.DefaultMemoryLimitRatio, "kubernetes: memory limit as a multiple of the request")
	fs.DurationVar(&f.imagePullWait, "image-pull-wait", kube.DefaultImagePullWait, "kubernetes: how long a pod may fail to pull its image before the attempt fails (class image)")
	fs.DurationVar(&f.pendingWait, "pending-wait", kube.DefaultPendingWait, "kubernetes: how long a pod may stay unschedulable before the attempt fails (class infrastructure)")
	fs.DurationVar(&f.jobTTL, "job-ttl", kube.DefaultTTLAfterFinished, "kubernetes: ttlSecondsAfterFinished of the Jobs")
	fs.StringVar(&f.sharedPVC, "shared-pvc", "", "kubernetes: a PersistentVolumeClaim the worker also mounts, through which outputs are collected")
	fs.StringVar(&f.sharedDir, "shared-dir", "", "kubernetes: where the worker mounts --shared-pvc")
	fs.StringVar(&f.podTemplate, "pod-template", "", "kubernetes: a PodTemplateSpec (YAML) every attempt's pod is built on: node selector, tolerations, affinity, pull secrets, service account...")
	fs.BoolVar(&f.handoff, "handoff", false, "docker, kubernetes: on SIGTERM, leave running attempts running for another worker (Kubernetes) or this worker restarted with the same id (Docker) to adopt, instead of draining")
	fs.DurationVar(&f.adoptWait, "adopt-wait", worker.DefaultAdoptWait, "how long a job waits for the worker that started its running attempt when only that worker can reach it (another Docker host); then the attempt is lost")
	fs.StringVar(&f.placementKeys, "placement-keys", "", "comma-separated node label keys requests may select with placement.node_selector (nvidia.com/gpu.product always)")
	fs.StringVar(&f.dockerConfig, "docker-config", "", "docker: a Docker client config.json whose auths (or credential helpers) give private registries' credentials for pulls")
	fs.StringVar(&f.nvidiaSMI, "nvidia-smi", "", "docker: the nvidia-smi that lists the host's GPUs and models (default: the one on the PATH; - for none)")
	fs.DurationVar(&f.dataRetention, "data-retention", worker.DefaultDataRetention, "how long a job's data directory (persist) may live whatever its job's state")
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

	if f.id == "" {
		f.id = worker.Config{}.WithDefaults().ID
	}
	// What the worker runs starts in order and stops in reverse: the
	// metrics server first, then the worker (draining for up to
	// --drain-timeout, less if a second signal comes), the ledger, NATS and
	// the executor's connection last.
	var running lifecycle.Group
	defer func() {
		sctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			select {
			case <-second:
				log.Warn("second signal: requeueing running jobs now")
				cancel()
			case <-sctx.Done():
			}
		}()
		if err := running.Stop(sctx); err != nil {
			log.Warn("stopping", "err", err)
		}
	}()
	exec, closeExec, err := newExecutor(ctx, &f, log)
	if err != nil {
		return err
	}
	_ = running.Start(ctx, "the executor", lifecycle.Closer(func() error { closeExec(); return nil }))
	cc, err := f.nats.Config("fleet-worker", log)
	if err != nil {
		return err
	}
	nc, err := queue.Connect(ctx, cc)
	if err != nil {
		return err
	}
	_ = running.Start(ctx, "the NATS connection", lifecycle.Closer(nc.Drain))

	if _, adopts := exec.(executor.Adopter); f.handoff && !adopts {
		return fmt.Errorf("--handoff: the %s executor's attempts cannot outlive the worker; it drains instead", f.executor)
	}
	var usage *executor.UsageSampler
	if r, ok := exec.(executor.UsageReader); ok {
		// One reading serves the heartbeat and the attempts' events.
		usage = executor.NewUsageSampler(r, max(f.heartbeat/2, 500*time.Millisecond))
	}
	cfg := worker.Config{
		ID: f.id, Pool: f.pool, Slots: f.slots, Backend: f.executor,
		Queue:   queue.Config{Names: queue.Names{Prefix: f.prefix}, AckWait: f.ackWait},
		Limits:  job.Limits{MaxInputRefBytes: f.maxInputRef},
		Handoff: f.handoff, RunningAfter: f.runningAfter,
		AdoptWait: f.adoptWait, Usage: usage, DataRetention: f.dataRetention,
		Logger: log,
	}.WithDefaults()
	if cfg.Artifacts, cfg.ArtifactLimits, err = artifactStore(nc, &f); err != nil {
		return err
	}
	var w *worker.Worker
	var led *ledger.Ledger
	if f.redis.URL != "" {
		lc, err := ledgerConfig(&f, cfg, exec)
		if err != nil {
			return err
		}
		lc.Draining = func() bool { return w != nil && w.Draining() }
		lc.Usage = usage
		lc.Logger = log
		// go-redis' global logger: its lines go to debug, since the ledger
		// reports an outage once itself (set here, not by the package).
		redis.SetLogger(capacity.LibraryLogger(log))
		caps, err := f.redis.Open(f.prefix, log)
		if err != nil {
			return err
		}
		_ = running.Start(ctx, "the Redis connection", lifecycle.Closer(caps.Close))
		led = ledger.New(caps, lc)
		cfg.Capacity = led
	}
	if w, err = worker.New(nc, exec, cfg); err != nil {
		return err
	}
	if led != nil {
		setup, cancel := context.WithTimeout(ctx, time.Minute)
		err := running.Start(setup, "the capacity ledger", lifecycle.StopWithin(led, 3*time.Second))
		cancel()
		if err != nil {
			return err
		}
	}
	// Start waits for as long as it takes a dispatcher to create the
	// streams and the NATS cluster to elect its leaders, logging why; a
	// signal ends the wait.
	if err := running.Start(ctx, "the worker", lifecycle.StopWithin(w, f.drainTimeout)); err != nil {
		if ctx.Err() != nil {
			log.Info("stopped while starting", "err", err)
			return nil
		}
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
		_ = running.Start(ctx, "the metrics server", lifecycle.Closer(srv.Close))
	}

	<-ctx.Done()
	return nil
}

// ledgerConfig turns the capacity flags into the Ledger's config.
func ledgerConfig(f *flags, cfg worker.Config, exec executor.Executor) (ledger.Config, error) {
	rc := ledger.Config{WorkerID: cfg.ID, Pool: cfg.Pool, Backend: f.executor, Version: version.Version,
		Slots: cfg.Slots, GPUs: f.gpus, Interval: f.heartbeat}
	if p, ok := exec.(executor.CapacityReader); ok {
		rc.Platform = p
	}
	if f.cpu != "" {
		v, err := job.ParseCPU(f.cpu)
		if err != nil {
			return rc, fmt.Errorf("--cpu: %w", err)
		}
		rc.CPUMilli = &v
	}
	if f.memory != "" {
		v, err := job.ParseMemory(f.memory)
		if err != nil {
			return rc, fmt.Errorf("--memory: %w", err)
		}
		rc.MemoryBytes = &v
	}
	labels, err := parseLabels(f.labels)
	if err != nil {
		return rc, err
	}
	rc.Labels = labels
	return rc, nil
}

// parseLabels reads --labels: k=v,k2=v2.
func parseLabels(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	labels := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, fmt.Errorf("--labels: %q is not k=v", kv)
		}
		if err := job.ValidateLabel(k, v); err != nil {
			return nil, fmt.Errorf("--labels: %w", err)
		}
		labels[k] = v
	}
	return labels, nil
}

func newExecutor(ctx context.Context, f *flags, log *slog.Logger) (executor.Executor, func(), error) {
	nothing := func() {}
	attempts, err := filepath.Abs(filepath.Join(f.dataDir, "attempts"))
	if err != nil {
		return nil, nothing, err
	}
	data, err := filepath.Abs(filepath.Join(f.dataDir, "jobdata"))
	if err != nil {
		return nil, nothing, err
	}
	outputs := workspace.Limits{MaxOutputBytes: f.maxOutput}
	labels, err := parseLabels(f.labels)
	if err != nil {
		return nil, nothing, err
	}
	keys := splitList(f.placementKeys)
	for _, k := range keys {
		if err := job.ValidateLabel(k, ""); err != nil {
			return nil, nothing, fmt.Errorf("--placement-keys: %w", err)
		}
	}
	if f.podTemplate != "" && f.executor != "kubernetes" {
		return nil, nothing, fmt.Errorf("--pod-template: only the kubernetes executor builds pods")
	}
	switch f.executor {
	case "process":
		e, err := process.New(process.Config{Dir: attempts, DataDir: data, Grace: f.grace, KeepFailed: f.keepFailed, Outputs: outputs,
			Labels: labels, PlacementKeys: keys})
		return e, nothing, err
	case "noop":
		return noop.Executor{}, nothing, nil
	case "docker":
		e, err := docker.New(docker.Config{Host: f.dockerHost, Dir: attempts, DataDir: data, AllowedImages: splitList(f.allowedImages),
			Network: f.dockerNetwork, User: f.dockerUser, GPUs: f.gpus, Grace: f.grace, KeepFailed: f.keepFailed,
			Outputs: outputs, Labels: labels, PlacementKeys: keys, NvidiaSMI: f.nvidiaSMI, DockerConfig: f.dockerConfig, Logger: log})
		if err != nil {
			return nil, nothing, err
		}
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := e.Ping(pctx); err != nil {
			_ = e.Close()
			return nil, nothing, fmt.Errorf("docker daemon: %w", err)
		}
		return e, func() { _ = e.Close() }, nil
	case "kubernetes":
		klog.SetSlogLogger(log.With("component", "client-go"))
		client, ns, err := kube.NewClient(f.kubeconfig)
		if err != nil {
			return nil, nothing, err
		}
		if f.namespace != "" {
			ns = f.namespace
		}
		var tmpl *corev1.PodTemplateSpec
		if f.podTemplate != "" {
			if tmpl, err = kube.LoadPodTemplate(f.podTemplate); err != nil {
				return nil, nothing, fmt.Errorf("--pod-template: %w", err)
			}
		}
		e, err := kube.New(kube.Config{Client: client, Namespace: ns, WorkerID: f.id, PodTemplate: tmpl, PlacementKeys: keys,
			CPULimitRatio: f.cpuLimitRatio, MemoryLimitRatio: f.memoryLimitRatio,
			ImagePullWait: f.imagePullWait, PendingWait: f.pendingWait, Grace: f.grace, TTLAfterFinished: f.jobTTL,
			SharedPVC: f.sharedPVC, SharedDir: f.sharedDir, Outputs: outputs, Logger: log})
		if err != nil {
			return nil, nothing, err
		}
		return e, func() { _ = e.Close() }, nil
	}
	return nil, nothing, fmt.Errorf("--executor %q: use process, docker, kubernetes or noop", f.executor)
}

// artifactStore is the fleet's object store and its limits, unless
// --artifacts is off.
func artifactStore(nc *nats.Conn, f *flags) (*artifact.Store, artifact.Limits, error) {
	lim := artifact.Limits{MaxOutputBytes: f.maxArtifact, MaxJobOutputBytes: f.maxJobArts, MaxLogBytes: f.maxLog}
	switch {
	case !f.artifacts:
		return nil, lim, nil
	case f.maxArtifact <= 0 || f.maxJobArts <= 0 || f.maxLog <= 0:
		return nil, lim, errors.New("--max-artifact-bytes, --max-job-artifact-bytes and --max-log-bytes must be positive")
	case !f.archiveLogs:
		lim.MaxLogBytes = -1
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, lim, fmt.Errorf("jetstream: %w", err)
	}
	return artifact.New(js, artifact.Config{Names: queue.Names{Prefix: f.prefix}}), lim, nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
