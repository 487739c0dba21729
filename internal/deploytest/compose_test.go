package deploytest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	fleetclient "github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/internal/dockertest"
	"github.com/fleet-dev/fleet/internal/testenv"
	"github.com/fleet-dev/fleet/job"
)

// composeProject is what `docker compose config --format json` prints, as
// far as these tests read it.
type composeProject struct {
	Name     string
	Services map[string]composeService
	Volumes  map[string]json.RawMessage
	Secrets  map[string]struct{ Environment string }
}

type composeService struct {
	Image       string
	Command     []string
	User        string
	ReadOnly    bool `json:"read_only"`
	Profiles    []string
	CapDrop     []string           `json:"cap_drop"`
	SecurityOpt []string           `json:"security_opt"`
	Environment map[string]*string `json:"environment"`
	Volumes     []struct {
		Type, Source, Target string
		ReadOnly             bool `json:"read_only"`
	}
	Ports []struct {
		HostIP    string `json:"host_ip"`
		Target    int
		Published string
	}
	Healthcheck *struct{ Test []string }
	DependsOn   map[string]struct{ Condition string } `json:"depends_on"`
	Secrets     []struct{ Source, Target string }
}

func (s composeService) env(k string) string {
	if v := s.Environment[k]; v != nil {
		return *v
	}
	return ""
}

// composeConfig renders docker-compose.yml (and more files) as JSON.
func composeConfig(t testing.TB, env []string, args ...string) composeProject {
	t.Helper()
	root := repoRoot(t)
	argv := append(compose(t), "-f", filepath.Join(root, "docker-compose.yml"), "--project-directory", root)
	argv = append(argv, args...)
	out := run(t, root, env, nil, append(argv, "config", "--format", "json")...)
	var p composeProject
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		t.Fatalf("decode compose config: %v\n%s", err, out)
	}
	return p
}

// TestComposeConfig validates docker-compose.yml with Compose v2 and checks
// the deployment it describes.
func TestComposeConfig(t *testing.T) {
	p := composeConfig(t, toolEnv(t), "--profile", "tracing")
	services := slices.Sorted(func(yield func(string) bool) {
		for n := range p.Services {
			if !yield(n) {
				return
			}
		}
	})
	if want := []string{"dispatcher", "jaeger", "nats", "redis", "worker-1", "worker-2"}; !slices.Equal(services, want) {
		t.Fatalf("services %v, want %v", services, want)
	}
	if j := p.Services["jaeger"]; !slices.Equal(j.Profiles, []string{"tracing"}) {
		t.Errorf("jaeger profiles %v, want only tracing", j.Profiles)
	}
	if q := composeConfig(t, toolEnv(t)); q.Services["jaeger"].Image != "" {
		t.Errorf("jaeger runs without --profile tracing")
	}

	// Nothing is published beyond the host's loopback.
	for name, s := range p.Services {
		for _, port := range s.Ports {
			if port.HostIP != "127.0.0.1" {
				t.Errorf("%s publishes %d on %q, want 127.0.0.1", name, port.Target, port.HostIP)
			}
		}
	}

	// NATS keeps JetStream on a named volume; everything is health-checked
	// and started in order.
	nats := p.Services["nats"]
	if !slices.ContainsFunc(nats.Volumes, func(v struct {
		Type, Source, Target string
		ReadOnly             bool `json:"read_only"`
	}) bool {
		return v.Type == "volume" && v.Source == "nats-data" && v.Target == "/data"
	}) {
		t.Errorf("nats has no named volume at /data: %+v", nats.Volumes)
	}
	// The server's configuration, read by the NATS server's own code.
	opts, err := server.ProcessConfigFile(filepath.Join(repoRoot(t), "deploy", "compose", "nats.conf"))
	if err != nil {
		t.Fatal(err)
	}
	if !opts.JetStream || opts.StoreDir != "/data" || opts.HTTPPort != 8222 || opts.MaxPayload != 8<<20 {
		t.Errorf("nats.conf: jetstream %t in %q, monitoring port %d, max payload %d; want JetStream in /data, 8222, 8 MiB (as --embedded)",
			opts.JetStream, opts.StoreDir, opts.HTTPPort, opts.MaxPayload)
	}
	for _, name := range []string{"nats", "redis", "dispatcher"} {
		if p.Services[name].Healthcheck == nil || len(p.Services[name].Healthcheck.Test) == 0 {
			t.Errorf("%s has no health check", name)
		}
	}
	d := p.Services["dispatcher"]
	if d.DependsOn["nats"].Condition != "service_healthy" || d.DependsOn["redis"].Condition != "service_healthy" {
		t.Errorf("dispatcher depends on %+v, want nats and redis healthy", d.DependsOn)
	}

	// The dispatcher's API listens on the network with a token from a secret.
	if d.env("FLEET_HTTP_ADDR") != "0.0.0.0:8080" || d.env("FLEET_INSECURE_HTTP") != "" {
		t.Errorf("dispatcher API: FLEET_HTTP_ADDR %q, FLEET_INSECURE_HTTP %q", d.env("FLEET_HTTP_ADDR"), d.env("FLEET_INSECURE_HTTP"))
	}
	if len(d.Secrets) != 1 || d.Secrets[0].Target != d.env("FLEET_API_TOKEN_FILE") || p.Secrets[d.Secrets[0].Source].Environment != "FLEET_API_TOKEN" {
		t.Errorf("dispatcher token: secrets %+v, FLEET_API_TOKEN_FILE %q, top-level %+v", d.Secrets, d.env("FLEET_API_TOKEN_FILE"), p.Secrets)
	}

	// Two Docker workers: the socket, and each its own workspace folder at
	// the same path on the host and in the container.
	// Their ids carry the project's name: another project's workers on
	// the same Docker host have others (see TestComposeWorkerIDsAreTheProjects).
	for _, name := range []string{"worker-1", "worker-2"} {
		w := p.Services[name]
		if !slices.Equal(w.Command, []string{"worker", "--executor", "docker"}) || w.env("FLEET_ID") != "fleet-"+name {
			t.Errorf("%s: command %v, FLEET_ID %q", name, w.Command, w.env("FLEET_ID"))
		}
		var socket, data bool
		for _, v := range w.Volumes {
			if v.Type != "bind" {
				continue
			}
			socket = socket || (v.Source == "/var/run/docker.sock" && v.Target == v.Source)
			data = data || (v.Source == w.env("FLEET_DATA_DIR") && v.Target == v.Source)
		}
		if !socket || !data {
			t.Errorf("%s: docker socket mounted %t, workspaces at the host's path %t: %+v", name, socket, data, w.Volumes)
		}
		if !w.ReadOnly || !slices.Contains(w.CapDrop, "ALL") {
			t.Errorf("%s: read_only %t, cap_drop %v", name, w.ReadOnly, w.CapDrop)
		}
		if w.DependsOn["dispatcher"].Condition != "service_healthy" {
			t.Errorf("%s depends on %+v", name, w.DependsOn)
		}
	}
	if a, b := p.Services["worker-1"].env("FLEET_DATA_DIR"), p.Services["worker-2"].env("FLEET_DATA_DIR"); a == b {
		t.Errorf("the workers share the workspace folder %s", a)
	}

	// FLEET_DATA_ROOT moves the workspaces.
	q := composeConfig(t, toolEnv(t, "FLEET_DATA_ROOT=/srv/fleet-x"))
	if got := q.Services["worker-1"].env("FLEET_DATA_DIR"); got != "/srv/fleet-x/fleet-worker-1" {
		t.Errorf("with FLEET_DATA_ROOT=/srv/fleet-x, FLEET_DATA_DIR is %q", got)
	}
}

// Two projects of docker-compose.yml on one Docker host have workers of
// different ids and folders: a worker that starts removes every container
// its id left on the host, and would remove the other project's running
// jobs (it did: TestComposeClusterUpRunsAJob's job container was removed
// 3 ms after it started, while another make test's compose project
// started its worker-2).
func TestComposeWorkerIDsAreTheProjects(t *testing.T) {
	a := composeConfig(t, toolEnv(t), "-p", "staging")
	b := composeConfig(t, toolEnv(t), "-p", "production")
	for _, name := range []string{"worker-1", "worker-2"} {
		if id := a.Services[name].env("FLEET_ID"); id != "staging-"+name {
			t.Errorf("project staging, %s: FLEET_ID %q", name, id)
		}
		if x, y := a.Services[name].env("FLEET_DATA_DIR"), b.Services[name].env("FLEET_DATA_DIR"); x == y {
			t.Errorf("%s of both projects keeps its workspaces in %s", name, x)
		}
	}
}

// standIns replaces the two third-party images, which no registry here
// serves, by `dispatcher --embedded` of the image under test: on "nats" its
// NATS server (with deploy/compose/nats.conf), on "redis" its Redis-protocol
// store. Their own dispatchers use
// another subject prefix, so that only the compose file's dispatcher handles
// the fleet's jobs. Everything else is docker-compose.yml as it is.
const standIns = `services:
  nats:
    image: ${FLEET_IMAGE}
    user: "0:0"
    command: ["dispatcher", "--embedded", "--nats-server-config", "/etc/nats/nats.conf",
              "--subject-prefix", "standin", "--http-addr", "127.0.0.1:8081"]
    environment:
      FLEET_NATS_URL: nats://0.0.0.0:4222
      FLEET_REDIS_URL: redis://127.0.0.1:6380/0
      FLEET_DATA_DIR: /data
    healthcheck:
      test: ["CMD", "fleetctl", "capacity", "--http-addr", "127.0.0.1:8081"]
      interval: 1s
      start_period: 0s
  redis:
    image: ${FLEET_IMAGE}
    user: "0:0"
    command: ["dispatcher", "--embedded", "--subject-prefix", "standin", "--http-addr", "127.0.0.1:8081"]
    environment:
      FLEET_NATS_URL: nats://127.0.0.1:4223
      FLEET_REDIS_URL: redis://0.0.0.0:6379/0
      FLEET_DATA_DIR: /tmp/standin
    healthcheck:
      test: ["CMD", "fleetctl", "capacity", "--http-addr", "127.0.0.1:8081"]
      interval: 1s
  dispatcher:
    healthcheck:
      interval: 1s
      start_period: 0s
`

// TestComposeUpRunsAJob starts docker-compose.yml with `up --wait` (the
// image built from local binaries; NATS and Redis stood in for, see
// standIns), then runs a job on its Docker workers from the host, as the
// Docker Compose section of docs/running.md says.
func TestComposeUpRunsAJob(t *testing.T) {
	f := composeUp(t, nil, standIns)
	f.waitWorkers(t)
	f.runJob(t, "compose")
}

// composeFleet is a compose project started by a test.
type composeFleet struct {
	run      func(args ...string) (string, string, error)
	api      string
	token    string
	suffix   string
	project  string
	jobImage string
	nc       *nats.Conn
	client   *fleetclient.Client
}

// composeUp starts docker-compose.yml, with the extra compose files and the
// stand-ins for the third-party images, with the image under test built
// from local binaries; everything is removed when the test ends.
func composeUp(t *testing.T, files []string, standIns string) *composeFleet {
	t.Helper()
	cli := dockertest.Client(t)
	argv := compose(t)
	_, err := os.Stat("/var/run/docker.sock")
	testenv.Require(t, err == nil, "the workers mount /var/run/docker.sock: %v", err)
	f := &composeFleet{jobImage: dockertest.TestImage(t), suffix: randomSuffix()}

	tag := "fleet-deploytest/compose:" + f.suffix
	buildRuntimeLocal(t, cli, tag)

	dir := t.TempDir()
	override := filepath.Join(dir, "standins.yml")
	if err := os.WriteFile(override, []byte(standIns), 0o644); err != nil {
		t.Fatal(err)
	}
	// The workspaces: created by the daemon and the root workers, so removed
	// here rather than by t.TempDir, which may not be allowed to.
	dataRoot, err := os.MkdirTemp("", "fleet-deploytest-compose-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dataRoot) })

	f.token = "compose-" + randomSuffix() + randomSuffix()
	root := repoRoot(t)
	env := toolEnv(t, "FLEET_IMAGE="+tag, "FLEET_API_TOKEN="+f.token, "FLEET_DATA_ROOT="+dataRoot,
		"FLEET_NATS_PORT=", "FLEET_HTTP_PORT=", "FLEET_LOG_LEVEL=debug")
	f.project = "fleet-deploytest-" + f.suffix
	project := []string{"-p", f.project, "-f", filepath.Join(root, "docker-compose.yml")}
	for _, file := range files {
		project = append(project, "-f", filepath.Join(root, file))
	}
	project = append(project, "-f", override, "--project-directory", root)
	f.run = func(args ...string) (string, string, error) {
		return tryRun(root, env, nil, append(append(slices.Clone(argv), project...), args...)...)
	}
	t.Cleanup(func() {
		if t.Failed() {
			out, _, _ := f.run("logs", "--no-color", "--tail", "80")
			t.Logf("--- compose logs:\n%s", out)
		}
		if _, stderr, err := f.run("down", "--volumes", "--remove-orphans", "--timeout", "5"); err != nil {
			t.Errorf("compose down: %v\n%s", err, stderr)
		}
	})
	start := time.Now()
	if _, stderr, err := f.run("up", "--detach", "--wait", "--wait-timeout", "120", "--no-build", "--pull", "never"); err != nil {
		t.Fatalf("compose up: %v\n%s", err, tail(stderr, 4000))
	}
	t.Logf("compose up --wait: %s", time.Since(start).Round(100*time.Millisecond))

	f.api = "http://" + f.port(t, "dispatcher", "8080")
	f.nc, err = nats.Connect("nats://"+f.port(t, "nats", "4222"), nats.Timeout(5*time.Second),
		nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.nc.Close)
	if f.client, err = fleetclient.New(f.nc); err != nil {
		t.Fatal(err)
	}
	return f
}

// port returns the host address of a service's published port.
func (f *composeFleet) port(t *testing.T, service, p string) string {
	t.Helper()
	out, stderr, err := f.run("port", service, p)
	if err != nil {
		t.Fatalf("compose port %s %s: %v\n%s", service, p, err, stderr)
	}
	return strings.TrimSpace(out)
}

// waitWorkers waits until both workers heartbeat, checking on the way that
// the API wants the token.
func (f *composeFleet) waitWorkers(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := apiGet(t, f.api+"/v1/workers", f.token)
		w1, w2 := f.project+"-worker-1", f.project+"-worker-2"
		if code == http.StatusOK && strings.Contains(body, `"`+w1+`"`) && strings.Contains(body, `"`+w2+`"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET /v1/workers: %d %s; want %s and %s", code, tail(body, 500), w1, w2)
		}
		time.Sleep(250 * time.Millisecond)
	}
	if code, _ := apiGet(t, f.api+"/v1/workers", ""); code != http.StatusUnauthorized {
		t.Errorf("GET /v1/workers without a token: %d, want 401", code)
	}
}

// runJob submits a job to the Docker workers from the host and checks its
// result. A submission that gets no answer (a NATS server electing) or is
// refused (admission has not seen the workers yet) is sent again with the
// same id, which makes it run once.
func (f *composeFleet) runJob(t *testing.T, name string) {
	t.Helper()
	req := &job.Request{
		ID:         fmt.Sprintf("%s-%s", name, f.suffix),
		Image:      f.jobImage,
		PullPolicy: job.PullNever,
		Command:    []string{"/testprog", "copy", "/fleet/inputs/name.txt", "/fleet/outputs/greeting.txt", "echo", "hello from " + name},
		Inputs:     map[string]string{"name.txt": name},
		Outputs:    []string{"greeting.txt"},
	}
	for try := 0; ; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := f.client.Submit(ctx, req)
		cancel()
		if err == nil {
			break
		}
		if try == 50 {
			t.Fatalf("submit: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	r, err := f.client.Result(ctx, req.ID)
	if err != nil {
		t.Fatalf("result of %s: %v", req.ID, err)
	}
	if r.Status != job.StatusSucceeded || r.Backend != "docker" || r.Outputs["greeting.txt"] != name || !strings.Contains(r.Stdout, "hello from "+name) {
		t.Errorf("result: status %s, backend %s, worker %s, outputs %v, stdout %q, stderr %q, failure %+v",
			r.Status, r.Backend, r.WorkerID, r.Outputs, r.Stdout, r.Stderr, r.Failure)
	}
}
