package docker

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/workspace"
	"github.com/fleet-dev/fleet/job"
)

func TestResources(t *testing.T) {
	t.Parallel()
	gpu := []container.DeviceRequest{{Driver: "nvidia", Count: 2, Capabilities: [][]string{{"gpu"}}}}
	for _, tc := range []struct {
		name           string
		res            job.Resources
		quota, mem     int64
		deviceRequests []container.DeviceRequest
	}{
		{name: "defaults", res: job.Resources{CPU: job.DefaultCPU, Memory: job.DefaultMemory}, quota: 100_000, mem: 256 << 20},
		{name: "half a CPU", res: job.Resources{CPU: "500m", Memory: "64Mi"}, quota: 50_000, mem: 64 << 20},
		{name: "more CPUs than a host has", res: job.Resources{CPU: "64", Memory: "1Gi"}, quota: 6_400_000, mem: 1 << 30},
		{name: "fractional CPU", res: job.Resources{CPU: "1.5", Memory: "1G"}, quota: 150_000, mem: 1_000_000_000},
		{name: "below the smallest quota", res: job.Resources{CPU: "1m", Memory: "6Mi"}, quota: 1000, mem: 6 << 20},
		{name: "GPUs", res: job.Resources{CPU: "2", Memory: "8Gi", GPU: 2}, quota: 200_000, mem: 8 << 30, deviceRequests: gpu},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := resources(&tc.res, 512)
			if got.CPUPeriod != 100_000 || got.CPUQuota != tc.quota {
				t.Errorf("CPU period/quota %d/%d, want 100000/%d", got.CPUPeriod, got.CPUQuota, tc.quota)
			}
			if got.NanoCPUs != 0 {
				t.Errorf("NanoCPUs %d, want 0 (the quota says it)", got.NanoCPUs)
			}
			if got.Memory != tc.mem || got.MemorySwap != tc.mem {
				t.Errorf("memory %d, swap %d; want both %d", got.Memory, got.MemorySwap, tc.mem)
			}
			if got.PidsLimit == nil || *got.PidsLimit != 512 {
				t.Errorf("pids limit %v, want 512", got.PidsLimit)
			}
			if !reflect.DeepEqual(got.DeviceRequests, tc.deviceRequests) {
				t.Errorf("device requests %+v, want %+v", got.DeviceRequests, tc.deviceRequests)
			}
		})
	}
}

func TestContainerName(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		job     string
		attempt int
		want    string
	}{
		{"build-42", 1, "fleet-build-42-1-abc123"},
		{"Nightly_Report.v2", 3, "fleet-nightly-report-v2-3-abc123"},
		{"__", 1, "fleet-x-1-abc123"},
		{strings.Repeat("a", 128), 12, "fleet-" + strings.Repeat("a", 40) + "-12-abc123"},
	} {
		got := containerName(tc.job, tc.attempt, "abc123")
		if got != tc.want {
			t.Errorf("containerName(%q, %d) = %q, want %q", tc.job, tc.attempt, got, tc.want)
		}
		if len(got) > 63 {
			t.Errorf("containerName(%q, %d) is %d characters long", tc.job, tc.attempt, len(got))
		}
	}
	if a, b := randomSuffix(), randomSuffix(); len(a) != 6 || a == b {
		t.Errorf("random suffixes %q and %q", a, b)
	}
}

func TestLabels(t *testing.T) {
	t.Parallel()
	task := &executor.Task{JobID: "Job.1", Attempt: 2, WorkerID: "w-7", Pool: "gpu"}
	want := map[string]string{
		"fleet.managed": "true", "fleet.job_id": "Job.1", "fleet.attempt": "2",
		"fleet.worker_id": "w-7", "fleet.pool": "gpu", "fleet.workspace": "/var/lib/fleet/Job.1-2-ab",
	}
	if got := labels(task, "/var/lib/fleet/Job.1-2-ab"); !reflect.DeepEqual(got, want) {
		t.Errorf("labels = %v, want %v", got, want)
	}
	// A run's node's: its run and node, as the seed's bijux.run_id and
	// bijux.node_id.
	task.Request = &job.Request{RunID: "nightly", NodeID: "train"}
	if got := labels(task, "/w"); got["fleet.run_id"] != "nightly" || got["fleet.node_id"] != "train" {
		t.Errorf("labels of a run's node: %v", got)
	}
}

func TestRunAs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ image, want string }{
		{"", "65534:65534"},
		{"root", "65534:65534"},
		{"0", "65534:65534"},
		{"0:0", "65534:65534"},
		{"root:staff", "65534:65534"},
		{"app", ""},
		{"1000:1000", ""},
	} {
		if got := runAs(tc.image, "65534:65534"); got != tc.want {
			t.Errorf("runAs(%q) = %q, want %q", tc.image, got, tc.want)
		}
	}
}

func TestCheckImage(t *testing.T) {
	t.Parallel()
	allow := []string{"ghcr.io/acme", "fleet-test/", "alpine"}
	for _, tc := range []struct {
		image   string
		allowed []string
		err     string // part of the error; empty when allowed
	}{
		{"", nil, "an image is required"},
		{"Not/Valid", nil, "not a valid reference"},
		{"anything/at:all", nil, ""},
		{"ghcr.io/acme/app:1", allow, ""},
		{"ghcr.io/acme:1", allow, ""},
		{"ghcr.io/acme-evil/app:1", allow, "not allowed on this worker (allowed: ghcr.io/acme, fleet-test/, alpine)"},
		{"fleet-test/testprog:latest", allow, ""},
		{"alpine", allow, ""},
		{"alpine:3.20", allow, ""},
		{"docker.io/library/alpine:3.20", allow, ""},
		{"alpine-evil", allow, "not allowed"},
		{"busybox", allow, "image busybox is not allowed"},
		{"busybox", []string{"docker.io/library/"}, ""},
		{"ghcr.io/acme/app@sha256:" + strings.Repeat("a", 64), allow, ""},
	} {
		err := checkImage(tc.image, tc.allowed)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("checkImage(%q, %v) = %v, want nil", tc.image, tc.allowed, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("checkImage(%q, %v) = %v, want an error with %q", tc.image, tc.allowed, err, tc.err)
		}
	}
}

func TestSpec(t *testing.T) {
	t.Parallel()
	e := &Executor{cfg: Config{User: "65534:65534", PidsLimit: 100, Network: "fleet"}}
	req := &job.Request{
		Image: "fleet-test/testprog", Command: []string{"sh", "-c", "true"}, Workdir: "src/app",
		Env: map[string]string{"TOKEN": "secret", "A": "1"},
	}
	req.Normalize()
	task := &executor.Task{JobID: "j1", Attempt: 1, WorkerID: "w1", Pool: "default", Request: req}
	dir := &workspace.Dir{Root: "/ws/j1", Inputs: "/ws/j1/inputs", Outputs: "/ws/j1/outputs", Work: "/ws/j1/work"}

	cfg, host := e.spec(task, "", dir, "")
	if got := []string(cfg.Entrypoint); !slices.Equal(got, req.Command) || cfg.Cmd != nil {
		t.Errorf("entrypoint %q, cmd %q; want the whole command as entrypoint", got, cfg.Cmd)
	}
	if cfg.User != "65534:65534" || cfg.WorkingDir != "/fleet/work/src/app" {
		t.Errorf("user %q, workdir %q", cfg.User, cfg.WorkingDir)
	}
	wantEnv := []string{"HOME=/fleet/work", "FLEET_INPUTS=/fleet/inputs", "FLEET_OUTPUTS=/fleet/outputs", "FLEET_WORK=/fleet/work",
		"FLEET_JOB_ID=j1", "FLEET_ATTEMPT=1", "FLEET_POOL=default", "A=1", "TOKEN=secret"}
	if !slices.Equal(cfg.Env, wantEnv) {
		t.Errorf("env %q, want %q", cfg.Env, wantEnv)
	}
	for k, v := range cfg.Labels {
		if strings.Contains(k+v, "secret") {
			t.Errorf("label %s=%s carries an env value", k, v)
		}
	}
	if host.Privileged || !slices.Equal(host.CapDrop, []string{"ALL"}) || len(host.CapAdd) != 0 ||
		!slices.Equal(host.SecurityOpt, []string{"no-new-privileges"}) || host.NetworkMode != "fleet" {
		t.Errorf("not hardened: privileged %v, cap drop %v, cap add %v, security %v, network %q",
			host.Privileged, host.CapDrop, host.CapAdd, host.SecurityOpt, host.NetworkMode)
	}
	if len(host.Binds) != 0 || host.PidMode != "" || host.IpcMode != "" || host.UsernsMode != "" {
		t.Errorf("shares something of the host: binds %v, pid %q, ipc %q, userns %q", host.Binds, host.PidMode, host.IpcMode, host.UsernsMode)
	}
	wantMounts := []mount.Mount{
		{Type: mount.TypeBind, Source: "/ws/j1/inputs", Target: "/fleet/inputs", ReadOnly: true},
		{Type: mount.TypeBind, Source: "/ws/j1/outputs", Target: "/fleet/outputs"},
		{Type: mount.TypeBind, Source: "/ws/j1/work", Target: "/fleet/work"},
	}
	if !reflect.DeepEqual(host.Mounts, wantMounts) {
		t.Errorf("mounts %+v, want %+v", host.Mounts, wantMounts)
	}
	if host.CPUQuota != 100_000 || host.Memory != 256<<20 || *host.PidsLimit != 100 {
		t.Errorf("resources %+v", host.Resources)
	}

	// An image with a user of its own keeps it, and its home.
	req.Command, req.Workdir = nil, "/abs"
	cfg, _ = e.spec(task, "1000", dir, "")
	if cfg.User != "" || cfg.Entrypoint != nil || cfg.WorkingDir != "/abs" || strings.HasPrefix(cfg.Env[0], "HOME=") {
		t.Errorf("user %q, entrypoint %q, workdir %q, env %q", cfg.User, cfg.Entrypoint, cfg.WorkingDir, cfg.Env)
	}
}

func TestExitMessage(t *testing.T) {
	t.Parallel()
	for code, want := range map[int]string{
		3:   "exited with code 3",
		137: "exited with code 137 (128 + signal 9, killed)",
		143: "exited with code 143 (128 + signal 15, terminated)",
		255: "exited with code 255",
	} {
		if got := exitMessage(code); got != want {
			t.Errorf("exitMessage(%d) = %q, want %q", code, got, want)
		}
	}
}

func TestConfigRefusesTheHostNetwork(t *testing.T) {
	t.Parallel()
	_, err := New(Config{Dir: t.TempDir(), Network: "host"})
	if err == nil || !strings.Contains(err.Error(), "host network") {
		t.Fatalf("New with the host network: %v", err)
	}
}

func TestCountContainers(t *testing.T) {
	t.Parallel()
	got := countContainers([]container.Summary{
		{State: container.StateRunning, Status: "Up 2 minutes"},
		{State: container.StateRunning, Status: "Up 2 minutes (unhealthy)"},
		{State: container.StateCreated},
		{State: container.StateExited, Status: "Exited (3) 1 second ago"},
		{State: container.StateDead},
	})
	want := job.ContainerCounts{Running: 2, Unhealthy: 1, Starting: 1, Exited: 2}
	if *got != want {
		t.Errorf("counts %+v, want %+v", *got, want)
	}
}

func TestConcurrentPullsOfOneImageAreOne(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int32
		release := make(chan struct{})
		p := newPuller(func(ctx context.Context, ref string) error {
			calls.Add(1)
			<-release
			if ref == "bad" {
				return errors.New("manifest unknown")
			}
			return nil
		}, time.Minute)

		errs := make(chan error, 20)
		for i := range 20 {
			ref := "good"
			if i%2 == 1 {
				ref = "bad"
			}
			go func() { errs <- p.pull(context.Background(), ref) }()
		}
		// A caller that gives up does not fail the pull for the others.
		ctx, cancel := context.WithCancelCause(context.Background())
		gaveUp := make(chan error, 1)
		go func() { gaveUp <- p.pull(ctx, "good") }()
		synctest.Wait()
		if n := calls.Load(); n != 2 {
			t.Fatalf("%d pulls under way for two images", n)
		}
		cancel(executor.ErrCancelled)
		if err := <-gaveUp; !errors.Is(err, executor.ErrCancelled) {
			t.Errorf("a cancelled caller got %v", err)
		}

		close(release)
		var failed int
		for range 20 {
			if err := <-errs; err != nil {
				failed++
			}
		}
		if calls.Load() != 2 || failed != 10 {
			t.Errorf("%d pulls for two images, %d of 20 callers failed; want 2 and 10", calls.Load(), failed)
		}
		// Once done, the next call pulls again.
		if err := p.pull(context.Background(), "good"); err != nil || calls.Load() != 3 {
			t.Errorf("a later pull: %v, %d pulls", err, calls.Load())
		}
	})
}
