// Package process runs each attempt as a local process: the simplest
// executor, for trusted jobs on the worker's own host, for development and
// for measuring the fleet itself.
//
// The process gets a fresh workspace (inputs read-only, outputs, work)
// whose paths it finds in FLEET_INPUTS, FLEET_OUTPUTS and FLEET_WORK; it
// runs in its own process group with only the request's environment and a
// PATH, never the worker's own variables. A timeout or a cancel sends
// SIGTERM to the whole group, then SIGKILL after the grace period; when the
// process ends, whatever it left in its group is killed too. The process
// dies with its worker; what it started does not, and Recover kills it when
// the worker starts again.
package process

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/telemetry"
	"github.com/fleet-dev/fleet/internal/workspace"
	"github.com/fleet-dev/fleet/job"
)

// Config configures the executor.
type Config struct {
	// Dir holds the attempts' workspaces. Defaults to a folder in the
	// system's temporary directory.
	Dir string
	// Grace is how long a process has to exit after SIGTERM before it is
	// killed. Defaults to executor.DefaultGrace (10 seconds).
	Grace time.Duration
	// KeepFailed keeps the workspace of attempts that did not succeed.
	KeepFailed bool
	// Outputs bounds what is read back from the outputs folder.
	Outputs workspace.Limits
	// TailBytes is how much of stdout and stderr a result keeps.
	TailBytes int
	// DataDir holds the jobs' data directories (persist), one folder per
	// job named by its id. Defaults to Dir with "-data" appended.
	DataDir string
	// Labels are the worker's labels, which requests select with
	// placement.node_selector (keys among PlacementKeys).
	Labels        map[string]string
	PlacementKeys []string
}

// Executor runs attempts as processes.
type Executor struct {
	cfg  Config
	path string

	mu      sync.Mutex
	running map[executor.AttemptID]proc // for Usage
	cpu     executor.CPUMeter
}

// proc is the process group of a running attempt.
type proc struct {
	pgid    int
	started time.Time
}

var (
	_ executor.Executor    = (*Executor)(nil)
	_ executor.Validator   = (*Executor)(nil)
	_ executor.Recoverer   = (*Executor)(nil)
	_ executor.UsageReader = (*Executor)(nil)
	_ executor.DataKeeper  = (*Executor)(nil)
	_ executor.Fitter      = (*Executor)(nil)
)

// ownerFile, in the root of an attempt's workspace, holds the id of the
// worker that runs it.
const ownerFile = "worker"

// New returns an Executor.
func New(cfg Config) (*Executor, error) {
	if cfg.Dir == "" {
		cfg.Dir = filepath.Join(os.TempDir(), "fleet-attempts")
	}
	if cfg.Grace <= 0 {
		cfg.Grace = executor.DefaultGrace
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("attempts folder: %w", err)
	}
	if cfg.DataDir == "" {
		cfg.DataDir = filepath.Clean(cfg.Dir) + "-data"
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("data folder: %w", err)
	}
	path := os.Getenv("PATH")
	if path == "" {
		path = "/usr/local/bin:/usr/bin:/bin"
	}
	return &Executor{cfg: cfg, path: path, running: map[executor.AttemptID]proc{}}, nil
}

// Validate refuses requests a process cannot run.
func (e *Executor) Validate(r *job.Request) error {
	if len(r.Command) == 0 {
		return errors.New("a command is required")
	}
	if filepath.IsAbs(r.Workdir) {
		return fmt.Errorf("workdir %q must be relative to the attempt's work folder", r.Workdir)
	}
	if r.Resources != nil && r.Resources.GPU > 0 {
		return errors.New("GPUs are not available to process jobs")
	}
	if r.Placement != nil {
		for k := range r.Placement.NodeSelector {
			if !slices.Contains(e.cfg.PlacementKeys, k) {
				return fmt.Errorf("placement.node_selector: key %q is not one this pool allows (allowed: %v)", k, e.cfg.PlacementKeys)
			}
		}
	}
	return nil
}

// Fits implements executor.Fitter: a request for labels this worker does
// not carry is for another worker of the pool.
func (e *Executor) Fits(r *job.Request) error {
	if r.Placement == nil {
		return nil
	}
	for k, v := range r.Placement.NodeSelector {
		if e.cfg.Labels[k] != v {
			return fmt.Errorf("node_selector %s=%s: this worker's labels do not match", k, v)
		}
	}
	return nil
}

// Run runs one attempt. A request that Validate refuses is refused as
// ClassRejected, before anything runs.
func (e *Executor) Run(ctx context.Context, t *executor.Task) (out *executor.Outcome, err error) {
	req := t.Request
	if err := e.Validate(req); err != nil {
		return nil, job.Failf(job.ClassRejected, job.CodeInvalid, "%v", err)
	}
	dir, err := executor.NewWorkspace(ctx, t, e.cfg.Dir, req.Inputs)
	if err != nil {
		return nil, err
	}
	defer func() {
		if out != nil && out.Status != job.StatusSucceeded && e.cfg.KeepFailed {
			return
		}
		_ = dir.Remove()
	}()
	if err := os.WriteFile(filepath.Join(dir.Root, ownerFile), []byte(t.WorkerID), 0o600); err != nil {
		return nil, fmt.Errorf("workspace: %w", err)
	}

	cmd := exec.Command(req.Command[0], req.Command[1:]...)
	cmd.Dir = filepath.Join(dir.Work, filepath.FromSlash(req.Workdir))
	if err := os.MkdirAll(cmd.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("workdir: %w", err)
	}
	data := ""
	if req.Persists() {
		if data, err = e.dataDir(executor.TenantKey(t.Tenant), t.JobID); err != nil {
			return nil, err
		}
	}
	cmd.Env = e.environ(t, dir, data)
	// Its own process group, so that a stop reaches its children; and it
	// dies with the worker, whose successor will run the job again.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stdout := executor.NewOutput("stdout", t.Report, e.cfg.TailBytes)
	stderr := executor.NewOutput("stderr", t.Report, e.cfg.TailBytes)
	copied, err := pipeOutput(cmd, stdout, stderr)
	if err != nil {
		return nil, err
	}

	started := time.Now()
	_, endRun := telemetry.Step(ctx, "fleet.run")
	if err := cmd.Start(); err != nil {
		endRun(err)
		copied.abort()
		return &executor.Outcome{Status: job.StatusFailed, StartedAt: started, FinishedAt: time.Now(),
			Failure: job.Failf(job.ClassExecution, job.CodeStartFailed, "cannot start %s: %v", req.Command[0], unwrapExec(err))}, nil
	}
	copied.started()
	pgid := cmd.Process.Pid
	key := executor.AttemptID{Tenant: executor.TenantKey(t.Tenant), JobID: t.JobID, Attempt: t.Attempt}
	e.mu.Lock()
	e.running[key] = proc{pgid: pgid, started: started}
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		delete(e.running, key)
		e.mu.Unlock()
	}()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	waitErr, stopped := executor.Supervise(ctx, req.Timeout.Std(), exited, func() (error, string) {
		return e.terminate(pgid, exited)
	})
	// Leave nothing behind: children that outlived the process go too.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	copied.wait()
	finished := time.Now()
	endRun(waitErr)

	out = &executor.Outcome{StartedAt: started, FinishedAt: finished, Stdout: stdout.Tail(), Stderr: stderr.Tail()}
	code, signaled := exitCode(cmd.ProcessState, waitErr)
	out.ExitCode = &code
	_, endCollect := telemetry.Step(ctx, "fleet.outputs.collect")
	outputs, artifacts, ofail := executor.CollectOutputs(ctx, t, dir, e.cfg.Outputs)
	if ofail != nil {
		endCollect(ofail)
	} else {
		endCollect(nil)
	}
	out.Outputs, out.Artifacts = outputs, artifacts
	switch {
	case stopped != nil:
		out.Status, out.Failure = executor.StatusOf(stopped), stopped
	case code != 0:
		msg := fmt.Sprintf("exited with code %d", code)
		if signaled != "" {
			msg = "killed by " + signaled
		}
		out.Status, out.Failure = job.StatusFailed, job.Failf(job.ClassExecution, job.CodeExitCode, "%s", msg)
	case ofail != nil:
		out.Status, out.Failure = job.StatusFailed, ofail
	default:
		out.Status = job.StatusSucceeded
	}
	return out, nil
}

// terminate stops the process group: SIGTERM, then SIGKILL after the grace
// period. It returns the wait's error and how the process ended.
func (e *Executor) terminate(pgid int, exited <-chan error) (error, string) {
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	grace := time.NewTimer(e.cfg.Grace)
	defer grace.Stop()
	select {
	case err := <-exited:
		return err, "stopped with SIGTERM"
	case <-grace.C:
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		return <-exited, fmt.Sprintf("killed with SIGKILL after a grace period of %s", e.cfg.Grace)
	}
}

// environ is the process's whole environment: a PATH, the workspace, and
// the request's own variables. Nothing of the worker's environment (its
// credentials among them) reaches the job.
func (e *Executor) environ(t *executor.Task, dir *workspace.Dir, data string) []string {
	env := []string{
		"PATH=" + e.path,
		"HOME=" + dir.Work,
		"TMPDIR=" + dir.Work,
		"FLEET_INPUTS=" + dir.Inputs,
		"FLEET_OUTPUTS=" + dir.Outputs,
		"FLEET_WORK=" + dir.Work,
		"FLEET_JOB_ID=" + t.JobID,
		"FLEET_ATTEMPT=" + strconv.Itoa(t.Attempt),
		"FLEET_POOL=" + t.Pool,
	}
	env = append(env, executor.RunEnv(t.Request)...)
	if data != "" {
		env = append(env, "FLEET_DATA="+data)
	}
	for k, v := range t.Request.Env {
		env = append(env, k+"="+v)
	}
	return env
}

func exitCode(ps *os.ProcessState, err error) (code int, signal string) {
	if ps == nil {
		return -1, ""
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal()), fmt.Sprintf("signal %d (%s)", ws.Signal(), ws.Signal())
	}
	return ps.ExitCode(), ""
}

func unwrapExec(err error) error {
	var ee *exec.Error
	if errors.As(err, &ee) {
		return ee.Err
	}
	return err
}

// output copies the process's stdout and stderr through pipes the worker
// owns: exec.Cmd.Wait would otherwise wait for every process still holding
// them, and a child left in the background would hang the attempt.
type output struct {
	wg      sync.WaitGroup
	readers []*os.File
	writers []*os.File
}

func pipeOutput(cmd *exec.Cmd, stdout, stderr *executor.Output) (*output, error) {
	o := &output{}
	for _, dst := range []*executor.Output{stdout, stderr} {
		r, w, err := os.Pipe()
		if err != nil {
			o.abort()
			return nil, fmt.Errorf("pipe: %w", err)
		}
		o.readers = append(o.readers, r)
		o.writers = append(o.writers, w)
		o.wg.Add(1)
		go func(r *os.File, dst *executor.Output) {
			defer o.wg.Done()
			_, _ = io.Copy(dst, r)
			_ = dst.Close()
		}(r, dst)
	}
	cmd.Stdout, cmd.Stderr = o.writers[0], o.writers[1]
	return o, nil
}

// started closes the worker's copies of the write ends: the process has
// its own.
func (o *output) started() {
	for _, w := range o.writers {
		_ = w.Close()
	}
}

// wait waits until the output is read to its end, which comes when every
// process holding the write ends is gone.
func (o *output) wait() {
	o.wg.Wait()
	for _, r := range o.readers {
		_ = r.Close()
	}
}

func (o *output) abort() {
	for _, w := range o.writers {
		_ = w.Close()
	}
	o.wait()
}
