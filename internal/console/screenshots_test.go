//go:build screenshots

package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"

	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/redistest"
	"github.com/fleet-dev/fleet/job"
)

// TestConsoleScreenshots draws the pictures of the console in docs/console.md
// (docs/console-*.png) from a fleet doing what the demo does, and more:
// make screenshots runs it with FLEET_SCREENSHOTS set to the folder; it is
// built only with the screenshots tag, so make test neither runs nor skips it.
func TestConsoleScreenshots(t *testing.T) {
	dir := os.Getenv("FLEET_SCREENSHOTS")
	if dir == "" {
		t.Fatal("draws the screenshots of docs/console.md: run with FLEET_SCREENSHOTS=<folder> (make screenshots)")
	}
	const interval = time.Second
	rs := redistest.Start(t)
	s := startSite(t, siteOptions{redisURL: rs.URL(), interval: interval, traceURL: "https://jaeger.example/trace/{trace_id}"})
	env := []string{"FLEET_NATS_URL=" + s.f.NATS.URL(), "FLEET_REDIS_URL=" + rs.URL()}
	worker := func(id, pool string, slots int, extra ...string) *fleettest.Proc {
		args := append([]string{"--id", id, "--pool", pool, "--slots", fmt.Sprint(slots), "--heartbeat-interval", interval.String(),
			"--grace", "200ms", "--cpu", "4", "--memory", "8Gi"}, extra...)
		p := fleettest.StartProc(t, "worker", append(env, "FLEET_DATA_DIR="+t.TempDir()), args...)
		p.WaitOutput(t, "worker started", 30*time.Second)
		return p
	}
	worker("demo-worker", "default", 4)
	worker("build-2", "default", 4)
	worker("gpu-1", "gpu", 2, "--gpus", "1")
	lost := worker("batch-1", "batch", 2)

	// The demo's examples, as make demo submits them.
	examples, _ := filepath.Glob("../../examples/*.json")
	for _, f := range examples {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var r job.Request
		if err := json.Unmarshal(data, &r); err != nil {
			t.Fatal(err)
		}
		s.f.Submit(t, &r)
	}
	submit := func(r *job.Request) string { return s.f.Submit(t, r) }
	for i := range 24 {
		team := []string{"build", "ml", "web"}[i%3]
		cmd := fmt.Sprintf("echo step %d; sleep 0.%d", i, i%10)
		if i%7 == 3 {
			cmd = fmt.Sprintf("echo 'compiling module %d' ; echo 'error: undefined reference to main' >&2; exit 2", i)
		}
		submit(&job.Request{ID: fmt.Sprintf("%s-%03d", team, i), Command: []string{"sh", "-c", cmd},
			Labels: map[string]string{"team": team, "kind": "ci"}, Env: map[string]string{"CI_TOKEN": "secret"}})
	}
	for i := range 3 {
		submit(&job.Request{ID: fmt.Sprintf("train-%d", i), Pool: "gpu", Command: []string{"sh", "-c", "sleep 40"},
			Resources: &job.Resources{GPU: 0, CPU: "2", Memory: "2Gi"}, Labels: map[string]string{"team": "ml"}})
	}
	long := submit(&job.Request{ID: "nightly-build", Command: []string{"sh", "-c",
		`for i in $(seq 1 200); do echo "[$(date +%T)] building target $i of 200"; sleep 0.3; done`},
		Env: map[string]string{"REGISTRY_PASSWORD": "never-shown"}, Outputs: []string{"report.txt"},
		Labels: map[string]string{"team": "build", "kind": "nightly"}, Timeout: ptrDur(5 * time.Minute)})
	submit(&job.Request{ID: "reindex-search", Pool: "batch", Command: []string{"sleep", "60"}, Retry: &job.RetryPolicy{MaxAttempts: 3},
		Labels: map[string]string{"team": "web"}})
	cancelled := submit(&job.Request{ID: "superseded-deploy", Command: []string{"sleep", "60"}, Labels: map[string]string{"team": "web"}})

	time.Sleep(3 * time.Second)
	ctx := context.Background()
	if _, err := s.f.Dispatcher.Cancel(ctx, "default", cancelled); err != nil {
		t.Fatal(err)
	}
	// A worker dies with a job: it shows among the lost.
	waitFor(t, "a job on batch-1", 20*time.Second, func() bool {
		live, _ := s.caps.Workers(ctx, "batch")
		for _, hb := range live {
			if hb.WorkerID == "batch-1" && len(hb.Running) > 0 {
				return true
			}
		}
		return false
	})
	lost.Kill()
	s.f.Await(t, "demo-fails", 30*time.Second)
	s.f.Await(t, "demo-times-out", 30*time.Second)
	waitFor(t, "batch-1 among the lost", 20*time.Second, func() bool {
		l, _ := s.caps.Lost(ctx, 0)
		return len(l) > 0
	})
	b := newBrowser(t)
	shoot := func(name, path string, wait func() bool) {
		t.Helper()
		b.open(t, s.url(path))
		waitFor(t, name+" live", 10*time.Second, func() bool { return strings.HasPrefix(b.text(t, "#status"), "live") })
		if wait != nil {
			waitFor(t, name+" ready", 20*time.Second, wait)
		}
		time.Sleep(500 * time.Millisecond)
		png, err := chromedp.Run(b.ctx, chromedp.CaptureScreenshot())
		if err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(dir, "console-"+name+".png")
		if err := os.WriteFile(out, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s", out)
	}
	shoot("overview", "/ui/", nil)
	shoot("jobs", "/ui/jobs", nil)
	shoot("job", "/ui/jobs/"+long, func() bool { return strings.Count(b.text(t, "#log"), "building target") > 12 })
	shoot("workers", "/ui/workers", nil)
	shoot("dlq", "/ui/dlq", nil)
	if _, err := chromedp.Call(b.ctx, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
		Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: "dark"}}}); err != nil {
		t.Fatal(err)
	}
	shoot("overview-dark", "/ui/", nil)
	shoot("job-dark", "/ui/jobs/demo-fails", nil)
	if errs := b.errors(); len(errs) > 0 {
		t.Errorf("errors: %v", errs)
	}
}

func ptrDur(d time.Duration) *job.Duration {
	v := job.Duration(d)
	return &v
}
