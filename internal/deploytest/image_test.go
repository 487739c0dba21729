package deploytest

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/api/types/build"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/jsonmessage"
	"github.com/docker/docker/pkg/stdcopy"
	"github.com/docker/go-connections/nat"
	"github.com/nats-io/nats.go"

	fleetclient "github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/internal/dockertest"
	"github.com/fleet-dev/fleet/job"
)

// testLabel marks what these tests create on the daemon.
const testLabel = "fleet.test/deploytest"

func randomSuffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

// staticBinaries builds the commands as static Linux binaries, as `make
// build` with CGO_ENABLED=0 does, once per test binary.
func staticBinaries(t testing.TB) string {
	t.Helper()
	root := repoRoot(t)
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "fleet-deploytest-bin-")
		if binErr != nil {
			return
		}
		args := []string{"build", "-trimpath", "-ldflags=-s -w", "-o", binDir + "/"}
		for _, c := range commands {
			args = append(args, "./cmd/"+c)
		}
		// A cold build of client-go and the Docker client takes minutes on
		// two cores, more while other test packages build beside it.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir = root
		// GOFLAGS may carry -race, which a static build cannot have.
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH, "GOFLAGS=")
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binDir
}

// buildRuntimeLocal builds the Dockerfile's runtime-local target from the
// static binaries, tags it tag and removes it when the test ends. The
// context holds only the Dockerfile and bin/.
func buildRuntimeLocal(t testing.TB, cli *client.Client, tag string) {
	t.Helper()
	root, bins := repoRoot(t), staticBinaries(t)
	files := map[string]string{"Dockerfile": filepath.Join(root, "Dockerfile")}
	for _, c := range commands {
		files["bin/"+c] = filepath.Join(bins, c)
	}
	ctxTar, err := tarFiles(files)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	resp, err := cli.ImageBuild(ctx, ctxTar, build.ImageBuildOptions{
		Tags: []string{tag}, Target: "runtime-local", Remove: true, ForceRemove: true,
		Labels: map[string]string{testLabel: "true"},
	})
	if err != nil {
		t.Fatalf("build runtime-local: %v", err)
	}
	defer resp.Body.Close()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := cli.ImageRemove(ctx, tag, image.RemoveOptions{Force: true, PruneChildren: true}); err != nil {
			t.Logf("remove image %s: %v", tag, err)
		}
	})
	if err := jsonmessage.DisplayJSONMessagesStream(resp.Body, io.Discard, 0, false, nil); err != nil {
		t.Fatalf("build runtime-local: %v", err)
	}
}

// tarFiles makes a build context: name in the archive -> file on disk.
func tarFiles(files map[string]string) (io.Reader, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range files {
			if !yield(n) {
				return
			}
		}
	})
	for _, name := range names {
		data, err := os.ReadFile(files[name])
		if err != nil {
			return nil, err
		}
		mode := int64(0o644)
		if strings.HasPrefix(name, "bin/") {
			mode = 0o755
		}
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: mode, Size: int64(len(data)), ModTime: time.Unix(0, 0)}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	return &buf, tw.Close()
}

// hardened is how the test runs the image: as Kubernetes does with the
// chart's securityContext. Read-only root, no capabilities, and the data
// folder a tmpfs owned by the image's user.
func hardened(hc *container.HostConfig) *container.HostConfig {
	hc.ReadonlyRootfs = true
	hc.CapDrop = []string{"ALL"}
	hc.SecurityOpt = []string{"no-new-privileges"}
	hc.Tmpfs = map[string]string{"/var/lib/fleet": "rw,noexec,nosuid,size=64m,uid=65532,gid=65532,mode=0700"}
	return hc
}

// startContainer creates and starts a container, removed when the test
// ends; its log is shown if the test failed.
func startContainer(t testing.TB, cli *client.Client, name string, cfg *container.Config, hc *container.HostConfig, nc *network.NetworkingConfig) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg.Labels = map[string]string{testLabel: "true"}
	c, err := cli.ContainerCreate(ctx, cfg, hc, nc, nil, name)
	if err != nil {
		t.Fatalf("create %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if t.Failed() {
			t.Logf("--- log of %s:\n%s", name, containerLog(ctx, cli, c.ID))
		}
		if err := cli.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true, RemoveVolumes: true}); err != nil {
			t.Logf("remove %s: %v", name, err)
		}
	})
	if err := cli.ContainerStart(ctx, c.ID, container.StartOptions{}); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	return c.ID
}

func containerLog(ctx context.Context, cli *client.Client, id string) string {
	r, err := cli.ContainerLogs(ctx, id, container.LogsOptions{ShowStdout: true, ShowStderr: true, Tail: "200"})
	if err != nil {
		return err.Error()
	}
	defer r.Close()
	var out bytes.Buffer
	_, _ = stdcopy.StdCopy(&out, &out, r)
	return out.String()
}

// hostPort is where a published port of a container answers on the host.
func hostPort(t testing.TB, cli *client.Client, id, port string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	info, err := cli.ContainerInspect(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	b := info.NetworkSettings.Ports[nat.Port(port)]
	if len(b) == 0 {
		t.Fatalf("port %s of %s is not published", port, info.Name)
	}
	return "127.0.0.1:" + b[0].HostPort
}

// waitHTTP waits until url answers 200, or fails the test after d.
func waitHTTP(t testing.TB, url string, d time.Duration) {
	t.Helper()
	c := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(d)
	var last string
	for time.Now().Before(deadline) {
		resp, err := c.Get(url)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = fmt.Sprintf("%s: %s", resp.Status, body)
		} else {
			last = err.Error()
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s did not answer 200 within %s: %s", url, d, last)
}

// apiGet sends a GET with an optional bearer token and returns the status
// and body.
func apiGet(t testing.TB, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestRuntimeImageRunsAJob builds the image from locally built static
// binaries (the Dockerfile's runtime-local target), starts `dispatcher
// --embedded` and a process worker from it, hardened as the chart runs
// them, and runs jobs through them from the host.
func TestRuntimeImageRunsAJob(t *testing.T) {
	cli := dockertest.Client(t)
	suffix := randomSuffix()
	tag := "fleet-deploytest/runtime:" + suffix
	buildRuntimeLocal(t, cli, tag)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	info, err := cli.ImageInspect(ctx, tag)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.User != "65532:65532" {
		t.Errorf("the image runs as %q, want 65532:65532", info.Config.User)
	}

	netName := "fleet-deploytest-" + suffix
	if _, err := cli.NetworkCreate(ctx, netName, network.CreateOptions{Labels: map[string]string{testLabel: "true"}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := cli.NetworkRemove(ctx, netName); err != nil {
			t.Logf("remove network %s: %v", netName, err)
		}
	})

	// The API listens on the container's address, so it wants a token.
	token := "deploytest-" + randomSuffix() + randomSuffix()
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("# deploytest\n"+token+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	loopback := func(ports ...string) nat.PortMap {
		m := nat.PortMap{}
		for _, p := range ports {
			m[nat.Port(p)] = []nat.PortBinding{{HostIP: "127.0.0.1"}}
		}
		return m
	}
	dispatcher := startContainer(t, cli, "fleet-deploytest-dispatcher-"+suffix,
		&container.Config{
			Image: tag,
			Cmd:   []string{"dispatcher", "--embedded"},
			Env: []string{
				"FLEET_NATS_URL=nats://0.0.0.0:4222",
				"FLEET_REDIS_URL=redis://0.0.0.0:6379/0",
				"FLEET_HTTP_ADDR=0.0.0.0:8080",
				"FLEET_API_TOKEN_FILE=/etc/fleet/api/tokens",
			},
			ExposedPorts: nat.PortSet{"4222/tcp": {}, "8080/tcp": {}},
		},
		hardened(&container.HostConfig{
			NetworkMode:  container.NetworkMode(netName),
			PortBindings: loopback("4222/tcp", "8080/tcp"),
			Binds:        []string{tokens + ":/etc/fleet/api/tokens:ro"},
		}),
		&network.NetworkingConfig{EndpointsConfig: map[string]*network.EndpointSettings{netName: {Aliases: []string{"dispatcher"}}}},
	)
	api := "http://" + hostPort(t, cli, dispatcher, "8080/tcp")
	waitHTTP(t, api+"/readyz", 30*time.Second)

	worker := startContainer(t, cli, "fleet-deploytest-worker-"+suffix,
		&container.Config{
			Image: tag,
			Cmd:   []string{"worker", "--executor", "process", "--slots", "2", "--id", "deploytest-worker", "--grace", "1s"},
			Env: []string{
				"FLEET_NATS_URL=nats://dispatcher:4222",
				"FLEET_REDIS_URL=redis://dispatcher:6379/0",
				"FLEET_METRICS_ADDR=0.0.0.0:9090",
			},
			ExposedPorts: nat.PortSet{"9090/tcp": {}},
		},
		hardened(&container.HostConfig{NetworkMode: container.NetworkMode(netName), PortBindings: loopback("9090/tcp")}),
		nil,
	)
	waitHTTP(t, "http://"+hostPort(t, cli, worker, "9090/tcp")+"/readyz", 30*time.Second)

	// The API: tokens required. The dispatcher admits a pool's jobs once it
	// has seen a heartbeat of one of its workers, through Redis.
	if code, _ := apiGet(t, api+"/v1/workers", ""); code != http.StatusUnauthorized {
		t.Errorf("GET /v1/workers without a token: %d, want 401", code)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := apiGet(t, api+"/v1/workers", token)
		if code == http.StatusOK && strings.Contains(body, `"deploytest-worker"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET /v1/workers: %d %s; want the worker's heartbeat", code, tail(body, 500))
		}
		time.Sleep(200 * time.Millisecond)
	}

	nc, err := nats.Connect("nats://"+hostPort(t, cli, dispatcher, "4222/tcp"), nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	fc, err := fleetclient.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// The image holds the fleet's binaries and nothing else: the jobs run
	// them. `dispatcher -h` exits 0; `fleetctl` without a command exits 2.
	submit := func(r *job.Request) error {
		sctx, scancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer scancel()
		_, err := fc.Submit(sctx, r)
		return err
	}
	// Admission refreshes its view of the workers every second: until it has
	// seen this one, it rejects the pool's jobs. Each try has a new id (an
	// id is an idempotency key).
	ok := &job.Request{Command: []string{"dispatcher", "-h"}}
	for try := 0; ; try++ {
		ok.ID = fmt.Sprintf("deploytest-ok-%s-%d", suffix, try)
		err := submit(ok)
		var rejected *fleetclient.RejectedError
		if err == nil {
			break
		}
		if !errors.As(err, &rejected) || try == 50 {
			t.Fatalf("submit %s: %v", ok.ID, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	bad := &job.Request{ID: "deploytest-bad-" + suffix, Command: []string{"fleetctl"}}
	if err := submit(bad); err != nil {
		t.Fatalf("submit %s: %v", bad.ID, err)
	}
	result := func(id string) *job.Result {
		rctx, rcancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer rcancel()
		r, err := fc.Result(rctx, id)
		if err != nil {
			t.Fatalf("result of %s: %v", id, err)
		}
		return r
	}
	if r := result(ok.ID); r.Status != job.StatusSucceeded || !strings.Contains(r.Stderr, "usage: dispatcher") || r.WorkerID != "deploytest-worker" {
		t.Errorf("job %s: status %s on %q, stderr %q", ok.ID, r.Status, r.WorkerID, tail(r.Stderr, 200))
	}
	if r := result(bad.ID); r.Status != job.StatusFailed || r.ExitCode == nil || *r.ExitCode != 2 {
		t.Errorf("job %s: status %s, exit code %v; want failed with 2", bad.ID, r.Status, r.ExitCode)
	}

	if code, body := apiGet(t, api+"/metrics", ""); code != http.StatusOK || !strings.Contains(body, "fleet_") {
		t.Errorf("GET /metrics: %d %s", code, tail(body, 300))
	}
}
