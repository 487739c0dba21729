package docker

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
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

func TestRunSucceedsWithInputsAndOutputs(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	task := b.task("greet-1", &job.Request{
		Command: []string{"/testprog",
			"copy", "/fleet/inputs/name.txt", "/fleet/outputs/greeting.txt",
			"copy", "/fleet/inputs/deep/er.txt", "/fleet/outputs/deep.txt",
			"write", "in-workdir.txt", "scratch",
			"echo", "ran", "stderr", "careful",
			"env", "GREETING", "env", "FLEET_JOB_ID", "env", "FLEET_INPUTS", "env", "HOME",
			"self"},
		Env:     map[string]string{"GREETING": "hello", "SECRET_TOKEN": "hunter2-do-not-leak"},
		Workdir: "sub/dir",
		Inputs:  map[string]string{"name.txt": "docker", "deep/er.txt": "nested"},
		Outputs: []string{"greeting.txt", "deep.txt"},
	})
	out := b.run(t, task)
	if out.Status != job.StatusSucceeded || out.ExitCode == nil || *out.ExitCode != 0 {
		t.Fatalf("status %s, exit %v, failure %+v, stderr %q", out.Status, out.ExitCode, out.Failure, out.Stderr)
	}
	if out.Outputs["greeting.txt"] != "docker" || out.Outputs["deep.txt"] != "nested" {
		t.Errorf("outputs %q", out.Outputs)
	}
	// Not root, no capabilities, no way to gain privileges.
	want := "ran\nhello\ngreet-1\n/fleet/inputs\n/fleet/work\nuid=65534 gid=65534\n" +
		"CapPrm=0000000000000000\nCapEff=0000000000000000\nNoNewPrivs=1\n"
	if out.Stdout != want || out.Stderr != "careful\n" {
		t.Errorf("stdout %q, stderr %q; want %q and \"careful\\n\"", out.Stdout, out.Stderr, want)
	}
	lines, phases := task.Report.(*reporter).snapshot()
	if len(lines) != 10 || !slices.Contains(lines, "stdout: ran") || !slices.Contains(lines, "stderr: careful") {
		t.Errorf("log lines %q", lines)
	}
	if len(phases) != 1 || !strings.HasPrefix(phases[0], "running: container fleet-greet-1-1-") {
		t.Errorf("phases %q", phases)
	}
	if out.StartedAt.IsZero() || out.FinishedAt.Before(out.StartedAt) {
		t.Errorf("started %v, finished %v", out.StartedAt, out.FinishedAt)
	}
	// The environment stays in the container.
	doc, _ := json.Marshal(out)
	if strings.Contains(string(doc), "hunter2") || strings.Contains(b.logs.String(), "hunter2") || strings.Contains(strings.Join(lines, "\n"), "hunter2") {
		t.Errorf("an env value leaked:\noutcome %s\nlogs %s", doc, b.logs)
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

func TestNonZeroExitFailsWithTheCode(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	out := b.run(t, b.task("exits-3", &job.Request{Command: []string{"/testprog", "stderr", "oops", "exit", "3"}}))
	if out.Status != job.StatusFailed || out.ExitCode == nil || *out.ExitCode != 3 {
		t.Fatalf("status %s, exit %v", out.Status, out.ExitCode)
	}
	if f := out.Failure; f == nil || f.Class != job.ClassExecution || f.Code != job.CodeExitCode || f.Message != "exited with code 3" {
		t.Errorf("failure %+v", out.Failure)
	}
	if out.Stderr != "oops\n" {
		t.Errorf("stderr %q", out.Stderr)
	}
	b.noneLeft(t)
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

func TestTimeoutStopsTheContainer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		command []string
		how     string
	}{
		{"SIGTERM is enough", []string{"/testprog", "echo", "ready", "sleep", "1m"}, "stopped with SIGTERM"},
		{"SIGTERM is ignored", []string{"/testprog", "ignore-term", "echo", "ready", "sleep", "1m"},
			"killed with SIGKILL after a grace period of 500ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, Config{})
			timeout := job.Duration(time.Second)
			begin := time.Now()
			out := b.run(t, b.task("slow", &job.Request{Command: tc.command, Timeout: &timeout}))
			if took := time.Since(begin); took > 15*time.Second {
				t.Errorf("took %s", took)
			}
			if out.Status != job.StatusTimedOut || out.Failure == nil || out.Failure.Class != job.ClassTimeout ||
				out.Failure.Code != job.CodeAttemptTimeout {
				t.Fatalf("status %s, failure %+v", out.Status, out.Failure)
			}
			if want := "ran longer than its timeout of 1s; " + tc.how; out.Failure.Message != want {
				t.Errorf("message %q, want %q", out.Failure.Message, want)
			}
			if out.Stdout != "ready\n" {
				t.Errorf("stdout %q", out.Stdout)
			}
			b.noneLeft(t)
		})
	}
}

func TestCancelStopsTheRunningContainer(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	task := b.task("cancel-me", &job.Request{Command: []string{"/testprog", "ignore-term", "sleep", "1m"}})
	ctx, cancel := context.WithCancelCause(context.Background())
	go func() {
		<-task.Report.(*reporter).running
		cancel(executor.ErrCancelled)
	}()
	out, err := b.exec.Run(ctx, task)
	if err != nil {
		t.Fatal(err)
	}
	if out.Status != job.StatusCancelled || out.Failure == nil || out.Failure.Class != job.ClassCancelled {
		t.Fatalf("status %s, failure %+v", out.Status, out.Failure)
	}
	if want := "job cancelled; killed with SIGKILL after a grace period of 500ms"; out.Failure.Message != want {
		t.Errorf("message %q, want %q", out.Failure.Message, want)
	}
	b.noneLeft(t)
}

func TestOverTheMemoryLimitIsOOM(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	out := b.run(t, b.task("hungry", &job.Request{
		// containerd watches for OOM kills only once the container has
		// started (see oomKilled): the sleep lets it begin.
		Command:   []string{"/testprog", "sleep", "300ms", "alloc", "268435456", "sleep", "10s"},
		Resources: &job.Resources{Memory: "16Mi"},
	}))
	if out.Status != job.StatusFailed || out.Failure == nil || out.Failure.Class != job.ClassOOM || out.Failure.Code != job.CodeOOMKilled {
		t.Fatalf("status %s, exit %v, failure %+v, stderr %q", out.Status, out.ExitCode, out.Failure, out.Stderr)
	}
	if !strings.Contains(out.Failure.Message, "memory limit of 16Mi") || out.ExitCode == nil || *out.ExitCode != 137 {
		t.Errorf("exit %v, message %q", out.ExitCode, out.Failure.Message)
	}
	b.noneLeft(t)
}

func TestImageFailures(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	for _, tc := range []struct {
		name, image string
		policy      job.PullPolicy
		code        string
		message     []string
	}{
		{"missing under never", "fleet-test/absent:1", job.PullNever, job.CodeImageNotPresent,
			[]string{"image fleet-test/absent:1 is not on the Docker host, and pull_policy is never"}},
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
			if pulled := len(phases) > 0; pulled != (tc.policy != job.PullNever) {
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
	if err := e.Validate(&job.Request{}); err == nil || !strings.Contains(err.Error(), "an image is required") {
		t.Errorf("Validate without an image = %v", err)
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

// A worker killed with SIGKILL leaves its container running; started again
// with the same id, it removes the container and its workspace, and leaves
// other workers' containers alone.
func TestRecoverReapsTheContainersOfAKilledWorker(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), childEnv+"="+b.worker+" "+b.dir)
	child.Stderr = os.Stderr
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	line := make(chan string, 1)
	go func() {
		s := bufio.NewScanner(stdout)
		s.Scan()
		line <- s.Text()
	}()
	var name string
	select {
	case l := <-line:
		var ok bool
		if name, ok = strings.CutPrefix(l, "running "); !ok {
			t.Fatalf("worker said %q", l)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the worker's container did not start")
	}
	_ = child.Process.Kill()
	_ = child.Wait()

	// Another worker's container on the same host.
	other := setup(t, Config{})
	c, err := b.cli.ContainerCreate(context.Background(), &container.Config{Image: b.image,
		Labels: map[string]string{LabelManaged: "true", LabelWorkerID: other.worker}}, nil, nil, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.cli.ContainerRemove(context.Background(), c.ID, container.RemoveOptions{Force: true}) })

	orphan, err := b.cli.ContainerInspect(context.Background(), name)
	if err != nil || !orphan.State.Running {
		t.Fatalf("the killed worker's container: %v, %+v", err, orphan.State)
	}
	if ents, _ := os.ReadDir(b.dir); len(ents) != 1 {
		t.Fatalf("%d workspaces, want the orphan's", len(ents))
	}

	restarted, err := New(Config{Dir: b.dir, Logger: slog.New(slog.NewTextHandler(b.logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer restarted.Close()
	if err := restarted.Recover(context.Background(), b.worker); err != nil {
		t.Fatal(err)
	}
	if _, err := b.cli.ContainerInspect(context.Background(), name); !cerrdefs.IsNotFound(err) {
		t.Errorf("the orphan is still there: %v", err)
	}
	b.noneLeft(t)
	if _, err := b.cli.ContainerInspect(context.Background(), c.ID); err != nil {
		t.Errorf("another worker's container was touched: %v", err)
	}
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
