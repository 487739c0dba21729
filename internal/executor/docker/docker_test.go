package docker

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"

	"github.com/fleet-dev/fleet/internal/dockertest"
	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/workspace"
	"github.com/fleet-dev/fleet/job"
)

// testBundle is what a test against the daemon works with.
type testBundle struct {
	exec   *Executor
	cli    *client.Client
	image  string
	worker string        // the worker id of this test's attempts
	dir    string        // the executor's workspaces
	logs   *lockedWriter // what the executor logs, at debug level
}

// setup returns an executor for one test, on the daemon, with the test
// image built. Its grace period is short.
func setup(t testing.TB, cfg Config) *testBundle {
	t.Helper()
	b := &testBundle{cli: dockertest.Client(t), image: dockertest.TestImage(t), worker: runID + "-" + job.NewID()[20:]}
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	if cfg.Grace == 0 {
		cfg.Grace = 500 * time.Millisecond
	}
	b.logs = &lockedWriter{}
	cfg.Logger = slog.New(slog.NewTextHandler(b.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	b.exec, b.dir = e, cfg.Dir
	return b
}

// task makes an attempt of req, which runs the test image with
// pull_policy never unless it says otherwise.
func (b *testBundle) task(id string, req *job.Request) *executor.Task {
	if req.Image == "" {
		req.Image = b.image
	}
	if req.PullPolicy == "" {
		req.PullPolicy = job.PullNever
	}
	req.Normalize()
	return &executor.Task{JobID: id, Attempt: 1, WorkerID: b.worker, Pool: "default", Request: req,
		Report: &reporter{running: make(chan string, 1)}}
}

func (b *testBundle) run(t *testing.T, task *executor.Task) *executor.Outcome {
	t.Helper()
	out, err := b.exec.Run(context.Background(), task)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return out
}

// containers lists the containers of this test's worker.
func (b *testBundle) containers(t testing.TB) []container.Summary {
	t.Helper()
	list, err := b.cli.ContainerList(context.Background(), container.ListOptions{All: true,
		Filters: filters.NewArgs(filters.Arg("label", LabelWorkerID+"="+b.worker))})
	if err != nil {
		t.Fatal(err)
	}
	return list
}

// noneLeft fails the test if a container or a workspace of its worker is
// left.
func (b *testBundle) noneLeft(t testing.TB) {
	t.Helper()
	if list := b.containers(t); len(list) > 0 {
		t.Errorf("%d containers left: %v", len(list), list[0].Names)
	}
	if ents, _ := os.ReadDir(b.dir); len(ents) > 0 {
		t.Errorf("workspace left: %s", ents[0].Name())
	}
}

type reporter struct {
	mu      sync.Mutex
	lines   []string // "stream: line"
	phases  []string
	running chan string // gets the container's name once it runs
}

func (r *reporter) Log(stream, line string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, stream+": "+line)
}

func (r *reporter) Phase(phase, message string) {
	r.mu.Lock()
	r.phases = append(r.phases, phase+": "+message)
	r.mu.Unlock()
	if phase == "running" && r.running != nil {
		name := strings.TrimSuffix(strings.TrimPrefix(message, "container "), " started")
		select {
		case r.running <- name:
		default:
		}
	}
}

func (r *reporter) snapshot() (lines, phases []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.lines...), append([]string(nil), r.phases...)
}

type lockedWriter struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedWriter) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// The environment, workspace, outputs and output lines of an attempt are
// the conformance suite's (TestConformance); this is what a container
// adds: not root, no capabilities, no way to gain privileges, and the
// phase that names it.
func TestContainersAreHardened(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	task := b.task("hardened", &job.Request{Command: []string{"/testprog", "self"}})
	out := b.run(t, task)
	if out.Status != job.StatusSucceeded {
		t.Fatalf("status %s, failure %+v, stderr %q", out.Status, out.Failure, out.Stderr)
	}
	want := "uid=65534 gid=65534\nCapPrm=0000000000000000\nCapEff=0000000000000000\nNoNewPrivs=1\n"
	if out.Stdout != want {
		t.Errorf("stdout %q, want %q", out.Stdout, want)
	}
	_, phases := task.Report.(*reporter).snapshot()
	if len(phases) != 1 || !strings.HasPrefix(phases[0], "running: container fleet-hardened-1-") {
		t.Errorf("phases %q", phases)
	}
	b.noneLeft(t)
}

func TestRunTheImagesOwnCommand(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	out := b.run(t, b.task("default-cmd", &job.Request{}))
	if out.Status != job.StatusSucceeded || out.Stdout != "hello from testprog\n" {
		t.Errorf("status %s, stdout %q, failure %+v", out.Status, out.Stdout, out.Failure)
	}
}

func TestACommandThatCannotStartFails(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	out := b.run(t, b.task("no-such-cmd", &job.Request{Command: []string{"/no/such/program"}}))
	if out.Status != job.StatusFailed || out.Failure == nil || out.Failure.Class != job.ClassExecution || out.Failure.Code != job.CodeStartFailed {
		t.Fatalf("status %s, failure %+v", out.Status, out.Failure)
	}
	if out.ExitCode == nil || *out.ExitCode != 127 || !strings.Contains(out.Failure.Message, "/no/such/program") {
		t.Errorf("exit %v, message %q", out.ExitCode, out.Failure.Message)
	}
	b.noneLeft(t)
}

func TestOutputsOverTheLimitFailTheAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Outputs: workspace.Limits{MaxOutputBytes: 1024}})
	out := b.run(t, b.task("too-big", &job.Request{
		Command: []string{"/testprog", "fill", "/fleet/outputs/big.bin", "2048"},
		Outputs: []string{"big.bin"},
	}))
	if out.Status != job.StatusFailed || out.Failure == nil || out.Failure.Code != job.CodeOutputLarge ||
		!strings.Contains(out.Failure.Message, "over the limit of 1024 bytes") {
		t.Errorf("status %s, failure %+v", out.Status, out.Failure)
	}
	b.noneLeft(t)
}

func TestImageFailures(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	for _, tc := range []struct {
		name, image string
		policy      job.PullPolicy
		code        job.FailureCode
		message     []string
	}{
		// Nothing listens on port 1: the pull fails at once.
		{"pull fails", "127.0.0.1:1/fleet/absent:1", job.PullIfNotPresent, job.CodeImagePull,
			[]string{"cannot pull image 127.0.0.1:1/fleet/absent:1: ", "connection refused"}},
		{"pull always fails", "127.0.0.1:1/fleet/absent:1", job.PullAlways, job.CodeImagePull,
			[]string{"cannot pull image 127.0.0.1:1/fleet/absent:1: "}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			task := b.task("image", &job.Request{Image: tc.image, PullPolicy: tc.policy, Command: []string{"true"}})
			out, err := b.exec.Run(context.Background(), task)
			var f *job.Failure
			if out != nil || !errors.As(err, &f) {
				t.Fatalf("Run = %+v, %v; want a failure", out, err)
			}
			if f.Class != job.ClassImage || f.Code != tc.code {
				t.Errorf("failure %+v", f)
			}
			for _, m := range tc.message {
				if !strings.Contains(f.Message, m) {
					t.Errorf("message %q lacks %q", f.Message, m)
				}
			}
			_, phases := task.Report.(*reporter).snapshot()
			if len(phases) == 0 {
				t.Errorf("phases %q", phases)
			}
		})
	}
	t.Cleanup(func() { b.noneLeft(t) })
}

func TestImagesOutsideTheAllowlistAreRefused(t *testing.T) {
	t.Parallel()
	e, err := New(Config{Dir: t.TempDir(), AllowedImages: []string{"ghcr.io/acme/", "fleet-test/testprog"}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	req := &job.Request{Image: "docker.io/library/alpine:3.20", Command: []string{"true"}}
	req.Normalize()
	err = e.Validate(req)
	if want := "image docker.io/library/alpine:3.20 is not allowed on this worker (allowed: ghcr.io/acme/, fleet-test/testprog)"; err == nil || err.Error() != want {
		t.Errorf("Validate = %v, want %q", err, want)
	}
	// Run refuses it as well, before asking anything of the daemon.
	_, err = e.Run(context.Background(), &executor.Task{JobID: "j", Attempt: 1, Request: req})
	var f *job.Failure
	if !errors.As(err, &f) || f.Class != job.ClassRejected || !strings.Contains(f.Message, "not allowed") {
		t.Errorf("Run = %v", err)
	}

	for _, r := range []*job.Request{
		{Image: "fleet-test/testprog:latest"},
		{Image: "ghcr.io/acme/tool@sha256:" + strings.Repeat("0", 64)},
	} {
		if err := e.Validate(r); err != nil {
			t.Errorf("Validate(%s) = %v", r.Image, err)
		}
	}
	if err := e.Validate(&job.Request{Image: "fleet-test/testprog", Resources: &job.Resources{GPU: 1}}); err == nil ||
		err.Error() != "1 GPUs requested; this worker's Docker host offers 0" {
		t.Errorf("Validate with a GPU = %v", err)
	}
}

func TestKeepFailedKeepsTheContainerUntilRecover(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{KeepFailed: true})
	out := b.run(t, b.task("kept", &job.Request{Command: []string{"/testprog", "exit", "4"}}))
	if out.Status != job.StatusFailed {
		t.Fatalf("status %s", out.Status)
	}
	list := b.containers(t)
	if len(list) != 1 || list[0].State != container.StateExited || list[0].Labels[LabelJobID] != "kept" {
		t.Fatalf("containers %+v", list)
	}
	if ents, _ := os.ReadDir(b.dir); len(ents) != 1 {
		t.Errorf("%d workspaces kept, want 1", len(ents))
	}
	// A success is not kept.
	if out := b.run(t, b.task("ok", &job.Request{Command: []string{"true"}})); out.Status != job.StatusSucceeded || len(b.containers(t)) != 1 {
		t.Errorf("status %s, %d containers", out.Status, len(b.containers(t)))
	}
	if err := b.exec.Recover(context.Background(), b.worker); err != nil {
		t.Fatal(err)
	}
	b.noneLeft(t)
}

func TestAContainerRemovedUnderneathIsAnInfrastructureFailure(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	task := b.task("vanishes", &job.Request{Command: []string{"/testprog", "sleep", "1m"}})
	removed := make(chan error, 1)
	go func() {
		name := <-task.Report.(*reporter).running
		removed <- b.cli.ContainerRemove(context.Background(), name, container.RemoveOptions{Force: true})
	}()
	out := b.run(t, task)
	if err := <-removed; err != nil {
		t.Fatal(err)
	}
	if out.Status != job.StatusFailed || out.Failure == nil || out.Failure.Class != job.ClassInfrastructure ||
		out.Failure.Code != job.CodeContainerVanished {
		t.Errorf("status %s, failure %+v", out.Status, out.Failure)
	}
	b.noneLeft(t)
}

func TestCapacity(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{GPUs: 0})
	info, err := b.cli.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	c, err := b.exec.Capacity(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if c.Health != job.HealthHealthy || c.Reason != "" || c.CPUMilli == nil || *c.CPUMilli != int64(info.NCPU)*1000 ||
		c.MemoryBytes == nil || *c.MemoryBytes != info.MemTotal || c.Containers == nil {
		t.Fatalf("capacity %+v", c)
	}
	h := c.Host
	if h == nil || h.Cores != info.NCPU || h.Hostname != info.Name || !strings.HasPrefix(h.BackendVersion, "docker ") ||
		h.MemoryUsedBytes <= 0 || h.MemoryUsedBytes > h.MemoryTotalBytes {
		t.Errorf("host %+v", h)
	}
}

func TestCapacityOfAnUnreachableDaemon(t *testing.T) {
	t.Parallel()
	e, err := New(Config{Dir: t.TempDir(), Host: "unix://" + filepath.Join(t.TempDir(), "none.sock")})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	c, err := e.Capacity(context.Background())
	if err != nil || c.Health != job.HealthUnhealthy || !strings.HasPrefix(c.Reason, "Docker daemon: ") {
		t.Errorf("capacity %+v, %v", c, err)
	}
	if err := e.Ping(context.Background()); err == nil {
		t.Error("Ping of no daemon succeeded")
	}
}
