// Package docker runs each attempt as a container on one Docker host,
// through the Docker API with version negotiation (from Debian's 20.10,
// API 1.41, to current releases).
//
// An attempt gets one container, named from its job and attempt and
// labelled with job, attempt, worker and pool (see the Label constants).
// Its workspace is three host folders bind-mounted at /fleet/inputs
// (read-only), /fleet/outputs and /fleet/work; the declared outputs are
// read back after the run. Resources become cgroup limits: a CFS quota for
// the CPU, a memory limit without swap, a pids limit, NVIDIA device requests
// for GPUs. Its environment is the image's, then FLEET_INPUTS,
// FLEET_OUTPUTS, FLEET_WORK (the container paths), FLEET_JOB_ID,
// FLEET_ATTEMPT and FLEET_POOL, as on the process executor, then the
// request's env, whose values the executor never logs. Every container is
// hardened: not privileged, all capabilities dropped, no-new-privileges,
// nothing of the host mounted but the workspace, a bridge network (never
// the host's), and a non-root user unless the image names one of its own.
//
// A timeout or a cancel sends SIGTERM, then SIGKILL after the grace
// period. Containers are removed after the attempt, unless it failed and
// KeepFailed is set; Recover removes whatever an earlier life of the worker
// left behind.
//
// The daemon bind-mounts workspace folders by their path on the Docker
// host. A worker that runs in a container itself, with the Docker socket
// mounted, must see Config.Dir at the same path as the host does: mount
// the host folder at the same path, e.g. -v /var/lib/fleet:/var/lib/fleet
// for a worker started with --data-dir /var/lib/fleet.
package docker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/client"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/telemetry"
	"github.com/fleet-dev/fleet/internal/workspace"
	"github.com/fleet-dev/fleet/job"
)

// Config configures the executor.
type Config struct {
	// Host is the address of the Docker daemon, such as
	// unix:///var/run/docker.sock. Defaults to DOCKER_HOST, then the local
	// socket; the other DOCKER_* variables apply too.
	Host string
	// Dir holds the attempts' workspaces. It must have the same path on the
	// worker and on the Docker host (see the package documentation).
	// Defaults to a folder in the system's temporary directory.
	Dir string
	// AllowedImages lists the image prefixes that attempts may use, such
	// as "ghcr.io/acme/" or "alpine". A prefix matches at a boundary of the
	// name ("ghcr.io/acme" covers "ghcr.io/acme/app", not
	// "ghcr.io/acme-evil/app"), as written or in full
	// ("docker.io/library/alpine:3"). Defaults to none: every image may run.
	AllowedImages []string
	// Network is the network containers join. Defaults to the daemon's
	// default bridge. "host" is refused; "none" cuts jobs off.
	Network string
	// User runs the containers of images that name no user, or root, as
	// this user. Defaults to "65534:65534" (nobody); "0:0" keeps root.
	User string
	// PidsLimit bounds the processes of one container. Defaults to 1024.
	PidsLimit int64
	// GPUs is how many NVIDIA GPUs the Docker host offers. Defaults to 0,
	// and requests for GPUs are refused.
	GPUs int
	// Grace is how long a container has to exit after SIGTERM before it is
	// killed. Defaults to executor.DefaultGrace (10 seconds).
	Grace time.Duration
	// KeepFailed keeps the container and the workspace of attempts that
	// did not succeed, for debugging, until the worker starts again.
	KeepFailed bool
	// Outputs bounds what is read back from the outputs folder.
	Outputs workspace.Limits
	// TailBytes is how much of stdout and stderr a result keeps.
	TailBytes int
	// APITimeout bounds each short call to the daemon (create, start,
	// inspect, kill, remove). Defaults to 2 minutes.
	APITimeout time.Duration
	// PullTimeout bounds one image pull. Defaults to 10 minutes.
	PullTimeout time.Duration
	// DataDir holds the folders behind the jobs' data volumes (persist).
	// Like Dir, it must have the same path on the worker and the Docker
	// host. Defaults to Dir with "-data" appended.
	DataDir string
	// Labels are the worker's labels, which requests select with
	// placement.node_selector (keys among PlacementKeys).
	Labels map[string]string
	// PlacementKeys are the label keys requests may select; a request
	// naming another is refused. nvidia.com/gpu.product is always allowed.
	PlacementKeys []string
	// NvidiaSMI is the nvidia-smi that lists the host's GPUs and their
	// models. Defaults to the one on the PATH, if any; "-" lists none.
	NvidiaSMI string
	// DockerConfig is a Docker client configuration file (config.json)
	// whose "auths" give the credentials of private registries for pulls.
	// Requests never carry credentials.
	DockerConfig string
	// Logger defaults to slog.Default(). Environment values are never
	// logged.
	Logger *slog.Logger
}

func (c Config) withDefaults() (Config, error) {
	if c.Dir == "" {
		c.Dir = filepath.Join(os.TempDir(), "fleet-docker-attempts")
	}
	dir, err := filepath.Abs(c.Dir)
	if err != nil {
		return c, fmt.Errorf("workspace folder: %w", err)
	}
	c.Dir = dir
	if c.DataDir == "" {
		c.DataDir = dir + "-data"
	}
	if c.DataDir, err = filepath.Abs(c.DataDir); err != nil {
		return c, fmt.Errorf("data folder: %w", err)
	}
	if c.User == "" {
		c.User = "65534:65534"
	}
	if c.PidsLimit <= 0 {
		c.PidsLimit = 1024
	}
	if c.Grace <= 0 {
		c.Grace = executor.DefaultGrace
	}
	if c.APITimeout <= 0 {
		c.APITimeout = 2 * time.Minute
	}
	if c.PullTimeout <= 0 {
		c.PullTimeout = 10 * time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}

func (c Config) validate() error {
	if container.NetworkMode(c.Network).IsHost() {
		return errors.New("the host network is not allowed: containers join a bridge network")
	}
	if c.GPUs < 0 {
		return fmt.Errorf("GPUs must not be negative, got %d", c.GPUs)
	}
	return nil
}

// Executor runs attempts as Docker containers.
type Executor struct {
	cfg Config
	log *slog.Logger
	// api makes the short calls, each bounded by cfg.APITimeout; stream
	// has no timeout, for what lasts as long as a container or a pull:
	// waits, logs and pulls.
	api    *client.Client
	stream *client.Client
	pulls  *puller
	auths  *registryAuths

	gpuOnce sync.Once
	gpus    []gpu
	cpu     executor.CPUMeter

	mu      sync.Mutex
	running map[executor.AttemptID]*live // by attempt, for Usage
	gpuBusy map[string]bool              // GPUs held, by UUID
}

var (
	_ executor.Executor        = (*Executor)(nil)
	_ executor.Validator       = (*Executor)(nil)
	_ executor.Recoverer       = (*Executor)(nil)
	_ executor.CapacityReader  = (*Executor)(nil)
	_ executor.Adopter         = (*Executor)(nil)
	_ executor.UsageReader     = (*Executor)(nil)
	_ executor.DataKeeper      = (*Executor)(nil)
	_ executor.Fitter          = (*Executor)(nil)
	_ executor.InventoryReader = (*Executor)(nil)
	_ executor.ImageCache      = (*Executor)(nil)
)

// New returns an Executor. It does not contact the daemon; Ping does.
func New(cfg Config) (*Executor, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("docker executor: %w", err)
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("workspace folder: %w", err)
	}
	opts := []client.Opt{client.FromEnv, client.WithAPIVersionNegotiation()}
	if cfg.Host != "" {
		opts = append(opts, client.WithHost(cfg.Host))
	}
	api, err := client.NewClientWithOpts(append(opts, client.WithTimeout(cfg.APITimeout))...)
	if err != nil {
		return nil, fmt.Errorf("docker client: %w", err)
	}
	stream, err := client.NewClientWithOpts(opts...)
	if err != nil {
		_ = api.Close()
		return nil, fmt.Errorf("docker client: %w", err)
	}
	auths, err := loadAuths(cfg.DockerConfig)
	if err != nil {
		_ = api.Close()
		_ = stream.Close()
		return nil, fmt.Errorf("docker executor: %w", err)
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("data folder: %w", err)
	}
	e := &Executor{cfg: cfg, log: cfg.Logger.With("component", "docker-executor"), api: api, stream: stream, auths: auths,
		running: map[executor.AttemptID]*live{}, gpuBusy: map[string]bool{}}
	e.pulls = newPuller(e.pullImage, cfg.PullTimeout)
	return e, nil
}

// Ping checks that the daemon answers.
func (e *Executor) Ping(ctx context.Context) error {
	if _, err := e.api.Ping(ctx); err != nil {
		return fmt.Errorf("docker daemon at %s: %w", e.api.DaemonHost(), err)
	}
	return nil
}

// Close closes the connections to the daemon.
func (e *Executor) Close() error {
	return errors.Join(e.api.Close(), e.stream.Close())
}

// Validate refuses requests this worker can never run: without an image,
// with an image outside the allowlist, or asking for more GPUs than the
// host has.
func (e *Executor) Validate(r *job.Request) error {
	if err := checkImage(r.Image, e.cfg.AllowedImages); err != nil {
		return err
	}
	if r.Resources != nil && r.Resources.GPU > e.gpuTotal() {
		return fmt.Errorf("%d GPUs requested; this worker's Docker host offers %d", r.Resources.GPU, e.gpuTotal())
	}
	return checkPlacement(r, e.cfg.PlacementKeys)
}

// checkPlacement refuses a node selector on keys the pool does not allow.
func checkPlacement(r *job.Request, allowed []string) error {
	if r.Placement == nil {
		return nil
	}
	for _, k := range slices.Sorted(maps.Keys(r.Placement.NodeSelector)) {
		if k != job.GPUModelLabel && !slices.Contains(allowed, k) {
			return fmt.Errorf("placement.node_selector: key %q is not one this pool allows (allowed: %s)", k, orNone(allowed))
		}
	}
	return nil
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

// Run runs one attempt in a container. Before the container starts, an
// image that is missing or cannot be pulled is returned as a ClassImage
// failure, a daemon error as an error (infrastructure). Once it has
// started, the Outcome says how the attempt ended; the container is gone
// when Run returns, unless KeepFailed keeps it, or the worker handed the
// attempt off (ErrLeftRunning): then it runs on, for adoption.
func (e *Executor) Run(ctx context.Context, t *executor.Task) (out *executor.Outcome, err error) {
	req := t.Request
	if err := e.Validate(req); err != nil {
		return nil, job.Failf(job.ClassRejected, job.CodeInvalid, "%v", err)
	}
	_, endPull := telemetry.Step(ctx, "fleet.image")
	img, err := e.image(ctx, req.Image, req.PullPolicy, t.Report)
	endPull(err)
	if ctx.Err() != nil {
		return executor.CancelledOutcome(ctx, time.Time{}), nil
	}
	if err != nil {
		return nil, err
	}
	dir, err := e.workspace(ctx, t)
	if err != nil {
		return nil, err
	}
	keep := func() bool {
		return errors.Is(err, executor.ErrLeftRunning) || (e.cfg.KeepFailed && out != nil && out.Status != job.StatusSucceeded)
	}
	defer func() {
		if !keep() {
			_ = dir.Remove()
		}
	}()
	var data string
	if req.Persists() {
		if data, err = e.dataVolume(ctx, executor.TenantKey(t.Tenant), t.JobID); err != nil {
			return nil, err
		}
	}
	devices, release, err := e.devices(req.Resources)
	if err != nil {
		return nil, err
	}
	defer release()

	// The container's own calls are not cut short when the attempt is
	// cancelled: a create cut short may still create, and nothing would
	// remove the container.
	bg := context.WithoutCancel(ctx)
	log := e.log.With("job_id", t.JobID, "attempt", t.Attempt)
	name := containerName(t.JobID, t.Attempt, randomSuffix())
	cfg, host := e.spec(t, img.Config.User, dir, data)
	host.Resources.DeviceRequests = devices
	_, endCreate := telemetry.Step(ctx, "fleet.container.create")
	created, err := e.api.ContainerCreate(bg, cfg, host, nil, nil, name)
	endCreate(err)
	if err != nil {
		if cerrdefs.IsNotFound(err) {
			return nil, job.Failf(job.ClassImage, job.CodeImageNotPresent, "image %s is gone from the Docker host: %v", req.Image, err)
		}
		return nil, fmt.Errorf("create container %s: %w", name, err)
	}
	id := created.ID
	for _, w := range created.Warnings {
		log.Warn("Docker warns about the container", "container", name, "warning", w)
	}
	defer func() {
		switch {
		case errors.Is(err, executor.ErrLeftRunning):
			log.Info("leaving the container running for adoption", "container", name)
		case keep():
			log.Info("keeping the container of a failed attempt", "container", name)
		default:
			e.remove(bg, id, name)
		}
	}()

	if err := e.api.ContainerStart(bg, id, container.StartOptions{}); err != nil {
		return e.startFailed(bg, id, name, err)
	}
	started := time.Now()
	log.Debug("container started", "container", name)
	if t.Report != nil {
		t.Report.Phase("running", "container "+name+" started")
	}
	return e.supervise(ctx, t, &live{id: id, name: name, dir: dir, started: started}, true)
}

// live is a container an attempt runs in, started by Run or adopted.
type live struct {
	id, name string
	dir      *workspace.Dir
	started  time.Time
	// exited is set when the container had exited before it was adopted.
	exited bool
}

// supervise follows a started container until it ends, its timeout
// (counted from when it started) passes or ctx ends, and says how the
// attempt ended, with its outputs. With all, it reports the container's
// whole log; without (an adopted container), the log from now on, or
// the whole of it once the container has exited. On ErrLeaveRunning it leaves
// a running container alone and returns ErrLeftRunning.
func (e *Executor) supervise(ctx context.Context, t *executor.Task, c *live, all bool) (*executor.Outcome, error) {
	req := t.Request
	bg := context.WithoutCancel(ctx)
	id, name := c.id, c.name
	key := executor.AttemptID{Tenant: executor.TenantKey(t.Tenant), JobID: t.JobID, Attempt: t.Attempt}
	e.track(key, c)
	defer e.untrack(key)
	_, endRun := telemetry.Step(ctx, "fleet.run")

	stdout := executor.NewOutput("stdout", t.Report, e.cfg.TailBytes)
	stderr := executor.NewOutput("stderr", t.Report, e.cfg.TailBytes)
	since := time.Time{}
	if !all && !c.exited {
		since = time.Now()
	}
	logsCtx, cutLogs := context.WithCancel(bg)
	defer cutLogs()
	logsDone := e.follow(logsCtx, id, since, stdout, stderr)
	// The wait runs on a context of its own, not the attempt's: a cancel
	// must stop the container, not stop watching it.
	waitCtx, stopWait := context.WithCancel(bg)
	defer stopWait()
	exited := e.wait(waitCtx, id)

	timeout := req.Timeout.Std()
	left := timeout
	if !all {
		left -= time.Since(c.started)
	}
	handedOff := false
	x, stopped := executor.SuperviseLeft(ctx, timeout, left, exited, func() (exit, string) {
		if executor.LeavingRunning(ctx) {
			handedOff = true
			return exit{}, "handed off"
		}
		return e.terminate(bg, id, exited)
	})
	if handedOff {
		cutLogs()
		logsDone()
		endRun(executor.ErrLeftRunning)
		return nil, executor.ErrLeftRunning
	}
	logsDone()

	out := &executor.Outcome{StartedAt: c.started, FinishedAt: time.Now(), Stdout: stdout.Tail(), Stderr: stderr.Tail()}
	oom := false
	if x.err == nil {
		code := int(x.code)
		out.ExitCode = &code
		oom, x.err = e.oomKilled(bg, id, c.started, code == 137 && stopped == nil)
	}
	endRun(x.err)
	_, endCollect := telemetry.Step(ctx, "fleet.outputs.collect")
	outputs, artifacts, ofail := executor.CollectOutputs(ctx, t, c.dir, e.cfg.Outputs)
	endCollect(failErr(ofail))
	out.Outputs, out.Artifacts = outputs, artifacts
	switch {
	case stopped != nil:
		out.Status, out.Failure = executor.StatusOf(stopped), stopped
	case cerrdefs.IsNotFound(x.err):
		out.Status, out.Failure = job.StatusFailed, job.Failf(job.ClassInfrastructure, job.CodeContainerVanished,
			"container %s was removed while the attempt ran", name)
	case x.err != nil:
		out.Status, out.Failure = job.StatusFailed, job.Failf(job.ClassInfrastructure, job.CodeContainerLost,
			"lost track of container %s: %v", name, x.err)
	case *out.ExitCode != 0 && oom:
		out.Status, out.Failure = job.StatusFailed, job.Failf(job.ClassOOM, job.CodeOOMKilled,
			"killed for exceeding its memory limit of %s (exit code %d)", req.Resources.Memory, *out.ExitCode)
	case *out.ExitCode != 0:
		out.Status, out.Failure = job.StatusFailed, job.Failf(job.ClassExecution, job.CodeExitCode, "%s", exitMessage(*out.ExitCode))
	case ofail != nil:
		out.Status, out.Failure = job.StatusFailed, ofail
	default:
		out.Status = job.StatusSucceeded
	}
	return out, nil
}

// workspace creates the attempt's workspace, with its workdir when that is
// under /fleet/work: made here, the container's user can write to it; made
// by the daemon, it would be root's.
func (e *Executor) workspace(ctx context.Context, t *executor.Task) (*workspace.Dir, error) {
	dir, err := executor.NewWorkspace(ctx, t, e.cfg.Dir, t.Request.Inputs)
	if err != nil {
		return nil, err
	}
	if wd := t.Request.Workdir; wd != "" && !path.IsAbs(wd) {
		p := filepath.Join(dir.Work, filepath.FromSlash(wd))
		if err := os.MkdirAll(p, 0o755); err == nil {
			err = os.Chmod(p, 0o777)
		}
		if err != nil {
			_ = dir.Remove()
			return nil, fmt.Errorf("workdir: %w", err)
		}
	}
	return dir, nil
}

// startFailed settles a container that would not start. The daemon calls
// a command that cannot be run, missing or not executable, an invalid
// argument, and gives the container the shell's exit code for it (127 or
// 126): that is the job's failure. Anything else is the daemon's.
func (e *Executor) startFailed(ctx context.Context, id, name string, err error) (*executor.Outcome, error) {
	if !cerrdefs.IsInvalidArgument(err) {
		return nil, fmt.Errorf("start container %s: %w", name, err)
	}
	now := time.Now()
	out := &executor.Outcome{Status: job.StatusFailed, StartedAt: now, FinishedAt: now,
		Failure: job.Failf(job.ClassExecution, job.CodeStartFailed, "cannot start the container: %v", err)}
	if c, err := e.api.ContainerInspect(ctx, id); err == nil && c.State != nil && c.State.ExitCode != 0 {
		code := c.State.ExitCode
		out.ExitCode = &code
	}
	return out, nil
}
