package doctest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/doctest"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/kubetest"
	"github.com/fleet-dev/fleet/internal/testenv"
	"github.com/fleet-dev/fleet/internal/testport"
)

func TestMain(m *testing.M) { kubetest.Main(m) }

// root is the repository's root, two folders up from this package.
func root(t *testing.T) string {
	t.Helper()
	r, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(r, "go.mod")); err != nil {
		t.Fatalf("the repository root %s has no go.mod: %v", r, err)
	}
	return r
}

// labelled are the pages whose every fenced block must say what it holds.
func labelled(t *testing.T) []string {
	t.Helper()
	r := root(t)
	pages := []string{"README.md"}
	docs, err := filepath.Glob(filepath.Join(r, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range docs {
		pages = append(pages, filepath.Join("docs", filepath.Base(d)))
	}
	err = filepath.WalkDir(filepath.Join(r, "deploy"), func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && d.Name() == "README.md" {
			rel, _ := filepath.Rel(r, path)
			pages = append(pages, rel)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return pages
}

// TestEveryBlockIsLabelled: every fenced block of README.md, docs/*.md and
// deploy/**/README.md has an info string, every mark a reason; and every
// page with a sh block that runs has a test of its own here.
func TestEveryBlockIsLabelled(t *testing.T) {
	tested := []string{"README.md", "docs/clients.md", "docs/runs.md", "docs/schedules.md", "docs/sharing.md", "deploy/nats/README.md"}
	for _, page := range labelled(t) {
		blocks, err := doctest.Parse(filepath.Join(root(t), page))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range doctest.Problems(page, blocks) {
			t.Error(p)
		}
		runs := slices.ContainsFunc(blocks, func(b doctest.Block) bool { return b.Shell() && !b.Marked })
		if runs && !slices.Contains(tested, page) {
			t.Errorf("%s has sh blocks that run, and no test of this package runs it", page)
		}
		if len(blocks) > 0 {
			t.Logf("%s: %d blocks", page, len(blocks))
		}
	}
}

// fleetEnv is what a page's commands reach: free ports for NATS, the
// Redis-protocol store and the HTTP API, passed as the FLEET_* variables
// the commands read (and NATS_URL for the nats CLI).
type fleetEnv struct {
	natsURL, redisURL, httpAddr string
}

func newFleetEnv(t *testing.T) fleetEnv {
	return fleetEnv{
		natsURL:  "nats://127.0.0.1:" + freePort(t),
		redisURL: "redis://127.0.0.1:" + freePort(t) + "/0",
		httpAddr: "127.0.0.1:" + freePort(t),
	}
}

func (f fleetEnv) vars() []string {
	return []string{"FLEET_NATS_URL=" + f.natsURL, "FLEET_REDIS_URL=" + f.redisURL, "FLEET_HTTP_ADDR=" + f.httpAddr,
		"NATS_URL=" + f.natsURL}
}

// freePort is a port for one of the fleet's listeners: three asked for at
// once are three (testport), where port 0 gave the same port twice, and a
// dispatcher's HTTP API found its port taken by its own Redis-protocol
// store.
func freePort(t *testing.T) string { return strconv.Itoa(testport.Free(t)) }

// runner is a page's runner: a scratch directory whose bin/ holds the
// fleet's binaries as make build leaves them, the same binaries and the
// nats CLI on the PATH, and the fleet's environment.
func runner(t *testing.T, f fleetEnv) *doctest.Runner {
	t.Helper()
	scratch := t.TempDir()
	bins := filepath.Dir(fleettest.Binary(t, "dispatcher"))
	if err := os.Mkdir(filepath.Join(scratch, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"dispatcher", "worker", "fleetctl"} {
		if err := os.Symlink(fleettest.Binary(t, name), filepath.Join(scratch, "bin", name)); err != nil {
			t.Fatal(err)
		}
	}
	r := &doctest.Runner{
		Dir:  scratch,
		PATH: []string{bins, filepath.Dir(testenv.NatsCLI(t))},
		Env:  f.vars(),
		Logf: t.Logf,
	}
	// Whoever lands a fix that a block waits for runs the blocks marked
	// "needs the fix…" with FLEET_DOCTEST_RUN_FIXES=1, then drops their
	// marks.
	if os.Getenv("FLEET_DOCTEST_RUN_FIXES") == "1" {
		r.RunMarked = func(reason string) bool { return strings.HasPrefix(reason, "needs the fix") }
	}
	return r
}

// runPage runs a page of the repository and fails the test with the
// runner's error.
func runPage(t *testing.T, page string, r *doctest.Runner) []doctest.Ran {
	t.Helper()
	blocks, err := doctest.Parse(filepath.Join(root(t), page))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	ran, err := r.Run(ctx, page, blocks)
	if err != nil {
		t.Fatal(err)
	}
	for _, rr := range ran {
		t.Logf("%s:%d printed:\n%s", page, rr.Block.Line, rr.Output)
	}
	t.Logf("%s: %d sh blocks ran in %s", page, len(ran), time.Since(start).Round(time.Millisecond))
	return ran
}

// runs reports whether a block that runs (or that r runs though marked)
// holds s.
func runs(t *testing.T, page string, r *doctest.Runner, s string) bool {
	t.Helper()
	blocks, err := doctest.Parse(filepath.Join(root(t), page))
	if err != nil {
		t.Fatal(err)
	}
	return slices.ContainsFunc(blocks, func(b doctest.Block) bool {
		return b.Shell() && (!b.Marked || r.RunMarked != nil && r.RunMarked(b.Skip)) && strings.Contains(b.Text, s)
	})
}

// startFleet starts what a page takes as running: a dispatcher with NATS
// and the store embedded, and a process worker of pool default, and waits
// until the worker is live.
func startFleet(t *testing.T, f fleetEnv) {
	t.Helper()
	dir := t.TempDir()
	fleettest.StartProc(t, "dispatcher", f.vars(), "--embedded", "--data-dir", filepath.Join(dir, "dispatcher"))
	fleettest.StartProc(t, "worker", f.vars(), "--executor", "process", "--pool", "default", "--slots", "4",
		"--data-dir", filepath.Join(dir, "worker"))
	waitForWorker(t, f, "default")
}

// waitForWorker waits until the dispatcher's API lists a live worker of pool.
func waitForWorker(t *testing.T, f fleetEnv, pool string) {
	t.Helper()
	if err := liveWorker(context.Background(), f, pool, time.Minute); err != nil {
		t.Fatal(err)
	}
}

// workersLive is an AtEnd of a page that starts a fleet: the dispatcher's
// API lists a live worker of each pool.
func workersLive(f fleetEnv, pools ...string) func(context.Context) error {
	return func(ctx context.Context) error {
		for _, p := range pools {
			if err := liveWorker(ctx, f, p, 30*time.Second); err != nil {
				return err
			}
		}
		return nil
	}
}

// liveWorker waits until the dispatcher's API lists a live worker of pool.
func liveWorker(ctx context.Context, f fleetEnv, pool string, within time.Duration) error {
	deadline := time.Now().Add(within)
	var last string
	for time.Now().Before(deadline) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+f.httpAddr+"/v1/workers?pool="+pool, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			last = string(body)
			var workers []json.RawMessage
			if resp.StatusCode == http.StatusOK && json.Unmarshal(body, &workers) == nil && len(workers) > 0 {
				return nil
			}
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("no live worker of pool %s within %s (the dispatcher's API at %s): %s", pool, within, f.httpAddr, last)
}

// TestTheREADMERunsAsWritten runs the README's tour: a dispatcher that
// embeds NATS and the store (on free ports, through the FLEET_* variables
// the commands read), workers of the process, Docker and Kubernetes
// executors, jobs on each, sharing. The Docker part runs on the local
// daemon, with busybox:1.36 a stand-in built here when the daemon does not
// have it (no registry); the Kubernetes part on the test control plane of
// internal/kubetest, whose kubectl and admin kubeconfig the page gets.
func TestTheREADMERunsAsWritten(t *testing.T) {
	f := newFleetEnv(t)
	r := runner(t, f)
	if runs(t, "README.md", r, "--executor docker") {
		busybox(t)
	}
	if runs(t, "README.md", r, "kubectl") {
		env := kubetest.Start(t)
		env.SetPodLogs(t, "jobs", "hi from a pod")
		r.PATH = append(r.PATH, filepath.Dir(env.Kubectl))
		r.Env = append(r.Env, "KUBECONFIG="+env.KubeconfigPath)
	}
	// The tour's fleet is up: the dispatcher answers, its worker is live.
	r.AtEnd = workersLive(f, "default")
	runPage(t, "README.md", r)
}

// TestPagesRunAsWritten runs, each against a running fleet, the pages
// whose commands need one and nothing else: docs/clients.md (the nats
// CLI's requests, subscriptions and reads, fleetctl's watch),
// docs/runs.md (a run's rules, its retry, a node's job), docs/schedules.md
// (fleetctl schedule, with the page's schedule and request as the files
// they read) and docs/sharing.md (fleetctl pool).
func TestPagesRunAsWritten(t *testing.T) {
	for _, page := range []string{"docs/clients.md", "docs/runs.md", "docs/schedules.md", "docs/sharing.md"} {
		t.Run(filepath.Base(page), func(t *testing.T) {
			f := newFleetEnv(t)
			r := runner(t, f)
			startFleet(t, f)
			runPage(t, page, r)
		})
	}
}

// TestDeployNATSRunsAsWritten runs deploy/nats/README.md in a copy of
// deploy/nats (its scripts edit fleet.conf): the keys, a pool and a
// tenant added, the dispatcher embedding the server with the file, the
// workers of both pools.
func TestDeployNATSRunsAsWritten(t *testing.T) {
	f := newFleetEnv(t)
	r := runner(t, f)
	if err := os.CopyFS(filepath.Join(r.Dir, "deploy", "nats"), os.DirFS(filepath.Join(root(t), "deploy", "nats"))); err != nil {
		t.Fatal(err)
	}
	// gen-nkeys.sh uses nk when it is installed (else it builds it from
	// the module, which the copy is not in).
	tools := t.TempDir()
	build := exec.Command("go", "build", "-o", tools+"/", "github.com/nats-io/nkeys/nk")
	build.Dir = root(t)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build nk: %v\n%s", err, out)
	}
	r.PATH = append(r.PATH, tools)
	// The dispatcher the page started with the file answers, and the
	// workers of both pools, with their keys, are live.
	r.AtEnd = workersLive(f, "default", "gpu")
	runPage(t, "deploy/nats/README.md", r)
}
