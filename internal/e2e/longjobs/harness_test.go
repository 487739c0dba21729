// Package longjobs tests, end to end, what long jobs on real clusters need:
// attempts adopted across worker restarts (Kubernetes by any worker of the
// pool, Docker by a worker restarted with the same id), jobs placed by GPU
// model and pod templates, data directories that outlive attempts, and the
// live usage of running attempts. Real parts: NATS with JetStream, a
// dispatcher with admission and the reaper, redis-server, workers as
// processes that the tests kill, the Docker daemon, and the Kubernetes
// control plane of internal/kubetest (kwok plays the nodes).
package longjobs

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/capacity"
	"github.com/fleet-dev/fleet/internal/capacity/monitor"
	"github.com/fleet-dev/fleet/internal/dispatcher"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/historytest"
	"github.com/fleet-dev/fleet/internal/kubetest"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/internal/redistest"
	"github.com/fleet-dev/fleet/internal/testport"
	"github.com/fleet-dev/fleet/job"
)

func TestMain(m *testing.M) { kubetest.Main(m) }

// heartbeat is the workers' heartbeat interval in these tests, and the
// reaper's: a killed worker's jobs come back within about four of them.
const heartbeat = time.Second

// fleet is a dispatcher (with admission and the reaper, on a real Redis),
// its HTTP API, and the environment of the workers the test starts.
type fleet struct {
	*fleettest.Fleet
	caps *capacity.Store
	api  *httptest.Server
	env  []string
}

func startFleet(t *testing.T) *fleet {
	t.Helper()
	rs := redistest.Start(t)
	caps, err := capacity.Open(rs.URL(), capacity.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { caps.Close() })
	adm, err := monitor.NewAdmission(caps, monitor.AdmitReject, fleettest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := adm.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = adm.Stop(context.Background()) })
	f := fleettest.Start(t, func(c *dispatcher.Config) { c.Admission = adm })
	reaper := monitor.NewReaper(caps, monitor.ReaperConfig{Interval: heartbeat, Announce: f.Dispatcher.Announce,
		Requeue: f.Dispatcher.Requeue, Logger: fleettest.Logger(t)})
	if err := reaper.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reaper.Stop(context.Background()) })
	api := dispatcher.NewAPI(f.Dispatcher)
	api.ServeCapacity(caps)
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	return &fleet{Fleet: f, caps: caps, api: srv,
		env: []string{"FLEET_NATS_URL=" + f.NATS.URL(), "FLEET_REDIS_URL=" + rs.URL(), "FLEET_HTTP_ADDR=" + srv.URL}}
}

// listen starts an ear, on a connection of its own, for the results of
// the default tenant's jobs of pool: start it before the jobs.
func (f *fleet) listen(t *testing.T, pool string) *historytest.Ear {
	t.Helper()
	return historytest.Listen(t, f.NATS.Connect(t), queue.Names{}, job.DefaultTenant, pool)
}

// requireHistory ends a test that stopped or killed a worker while jobs
// ran: every version of the default tenant's jobs of pool, read back from
// the pool's stream, passes historytest, and each of ids ended.
func (f *fleet) requireHistory(t *testing.T, pool string, ids []string, ears ...*historytest.Ear) {
	t.Helper()
	js, err := jetstream.New(f.NATS.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	historytest.Require(t, js, queue.Names{}, job.DefaultTenant, pool, "", ids, ears...)
}

// worker starts a worker process with the fleet's environment, the test's
// heartbeat interval and args, and waits until it pulls.
func (f *fleet) worker(t *testing.T, args ...string) *fleettest.Proc {
	t.Helper()
	all := append([]string{"--heartbeat-interval", heartbeat.String(), "--ack-wait", "5s", "--grace", "1s", "--log-format", "json"}, args...)
	p := fleettest.StartProc(t, "worker", f.env, all...)
	p.WaitOutput(t, "worker started", time.Minute)
	return p
}

// waitFor polls ok every 50 ms until it holds, for at most d.
func waitFor(t *testing.T, what string, d time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// count counts events of one type, and of one phase when phase is set.
func count(events []*job.Event, typ job.EventType, phase string) int {
	n := 0
	for _, e := range events {
		if e.Type == typ && (phase == "" || e.Phase == phase) {
			n++
		}
	}
	return n
}

// find returns the first event of one type and phase, or nil.
func find(events []*job.Event, typ job.EventType, phase string) *job.Event {
	for _, e := range events {
		if e.Type == typ && e.Phase == phase {
			return e
		}
	}
	return nil
}

func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

// writeFile writes a file of the test and returns its path.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(strings.TrimLeft(content, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// kubectl runs kubectl as the control plane's admin.
func kubectl(env *kubetest.Env, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return exec.CommandContext(ctx, env.Kubectl, append([]string{"--kubeconfig", env.KubeconfigPath}, args...)...).CombinedOutput()
}

func dur(d time.Duration) *job.Duration {
	v := job.Duration(d)
	return &v
}

// freeAddr returns a loopback address no one listens on, for a server the
// test starts (testport: not one the kernel hands out to others meanwhile).
func freeAddr(t *testing.T) string { return fmt.Sprintf("127.0.0.1:%d", testport.Free(t)) }

// scrape reads the value of a counter or gauge from the Prometheus metrics
// at addr, summed over its series.
func scrape(t *testing.T, addr, name string) (float64, bool) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	sum, found := 0.0, false
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		fields := strings.Fields(line)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		sum, found = sum+v, true
	}
	return sum, found
}
