package console

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/job"
)

// benchConsole is a console whose index holds n jobs, without a fleet
// behind it: what the jobs page costs is the index and the template.
func benchConsole(tb testing.TB, n int) *Console {
	tb.Helper()
	p, err := loadPages()
	if err != nil {
		tb.Fatal(err)
	}
	c := &Console{cfg: Config{MaxJobs: n + 1}, log: slog.New(slog.DiscardHandler), index: NewIndex(0, 0), pages: p,
		work: &workers{}, dead: &deadLetters{max: 10}}
	c.m = consoleMetrics{unregister: func() {}}
	c.routes()
	base := time.Now().Add(-7 * 24 * time.Hour)
	pools := []string{"default", "gpu", "k8s", "batch"}
	states := []job.State{job.StateSucceeded, job.StateSucceeded, job.StateSucceeded, job.StateFailed, job.StateRunning,
		job.StateQueued, job.StateSucceeded, job.StateCancelled, job.StateTimedOut, job.StateSucceeded}
	code := 0
	for i := range n {
		sub := base.Add(time.Duration(i) * 6 * time.Second)
		tenant := job.DefaultTenant
		if i%5 == 3 {
			tenant = "acme" // a tenant with a fifth of the jobs
		}
		rec := &job.Record{ID: fmt.Sprintf("job-%07d", i), Tenant: tenant, Pool: pools[i%len(pools)], State: states[i%len(states)], Attempt: 1,
			MaxAttempts: 3, WorkerID: fmt.Sprintf("worker-%d", i%20), SubmittedAt: sub, UpdatedAt: sub, StartedAt: &sub,
			Labels: map[string]string{"team": fmt.Sprintf("team-%d", i%13), "kind": "ci"}}
		if rec.State.Final() {
			f := sub.Add(time.Second)
			rec.FinishedAt, rec.ExitCode = &f, &code
		}
		if rec.State == job.StateFailed {
			rec.Failure = &job.Failure{Class: job.ClassExecution, Code: job.CodeExitCode, Message: "exited with code 2"}
		}
		put(tb, c.index, rec, uint64(i+1))
	}
	c.index.EndReplay()
	return c
}

func get(tb testing.TB, c *Console, path string) string {
	r := httptest.NewRequest(http.MethodGet, path, nil)
	r.Host = "127.0.0.1:8080"
	w := httptest.NewRecorder()
	c.ServeHTTP(w, r)
	if w.Code != http.StatusOK {
		tb.Fatalf("GET %s: %d %s", path, w.Code, w.Body.String())
	}
	return w.Body.String()
}

// BenchmarkJobsPage100k serves the jobs page, whole (layout and 50 rows),
// with 100,000 jobs in the index: the newest page, a page deep in the
// list, and filters that match few jobs (each scans the index once).
// The target is under 100 ms a page.
func BenchmarkJobsPage100k(b *testing.B) {
	c := benchConsole(b, 100_000)
	deep := c.index.List(Filter{}, Cursor{}, Cursor{}, 50_000).Older.String()
	for _, bc := range []struct{ name, path string }{
		{"newest", "/ui/jobs"},
		{"deep", "/ui/jobs?before=" + deep},
		{"state+pool+label", "/ui/jobs?state=failed&pool=gpu&label=team%3Dteam-5"},
		{"id-prefix", "/ui/jobs?id=job-00123"},
		{"last-hour", "/ui/jobs?range=1h"},
		{"tenant", "/ui/jobs?tenant=acme"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				get(b, c, bc.path)
			}
		})
	}
}

// TestJobsPageWith100kJobs checks the benchmark's pages are right: full
// pages, in order, filters that hold.
func TestJobsPageWith100kJobs(t *testing.T) {
	c := benchConsole(t, 100_000)
	start := time.Now()
	page := get(t, c, "/ui/jobs")
	t.Logf("the newest page of 100,000 jobs in %s (%d bytes)", time.Since(start), len(page))
	if n := strings.Count(page, `<tr id="job-`); n != 50 || !strings.Contains(page, `id="job-default.batch.job-0099999"`) {
		t.Errorf("the newest page has %d rows, or not the newest job", n)
	}
	page = get(t, c, "/ui/jobs?state=failed&pool=gpu&label=team%3Dteam-5")
	for _, row := range strings.Split(page, `<tr id="job-`)[1:] {
		if !strings.Contains(row, `data-state="failed"`) || !strings.Contains(row, "<td>gpu</td>") || !strings.Contains(row, "team=team-5") ||
			!strings.Contains(row, ".gpu.") {
			t.Fatalf("a row that does not match the filter: %.300s", row)
		}
	}
	if !strings.Contains(page, `<b id="total">`) {
		t.Error("no total")
	}
	page = get(t, c, "/ui/jobs?tenant=acme&state=failed")
	rows := strings.Split(page, `<tr id="job-`)[1:]
	if len(rows) != 50 || !strings.Contains(page, `<b id="total">10000</b>`) {
		t.Errorf("tenant acme, failed: %d rows, want 50 of 10000", len(rows))
	}
	for _, row := range rows {
		if !strings.HasPrefix(row, "acme.") || !strings.Contains(row, `data-state="failed"`) {
			t.Fatalf("a row that does not match tenant=acme&state=failed: %.300s", row)
		}
	}
}

// bigRun is a run of layers × width nodes, each after two of the layer
// before it, in a console whose index holds its nodes' jobs as a run
// part way through would: the first three fifths of its layers ended (one
// node in 50 failed), the next layer running, the rest waiting.
func bigRun(tb testing.TB, layers, width int) (*Console, *fakeRuns) {
	tb.Helper()
	fr := newFakeRuns()
	v := &job.RunView{RunID: "big", Tenant: job.DefaultTenant, State: job.RunRunning, Round: 1, SubmittedAt: time.Now(),
		Nodes: make([]job.NodeView, 0, layers*width)}
	for x := range layers {
		for y := range width {
			nd := job.NodeView{ID: fmt.Sprintf("n%03d-%03d", x, y), Pool: "default", State: job.NodeWaiting, Round: 1}
			nd.JobID = job.RunJobID(v.RunID, nd.ID, 1)
			if x > 0 {
				nd.After = []string{fmt.Sprintf("n%03d-%03d", x-1, y), fmt.Sprintf("n%03d-%03d", x-1, (y*7+3)%width)}
			}
			v.Nodes = append(v.Nodes, nd)
		}
	}
	fr.add(v)
	c := runsConsole(tb, fr, false)
	seq := uint64(0)
	now := time.Now()
	for i, nd := range v.Nodes {
		x := i / width
		rec := &job.Record{ID: nd.JobID, Pool: "default", SubmittedAt: now, UpdatedAt: now}
		switch {
		case x < layers*3/5 && i%50 == 7:
			rec.State, rec.Failure = job.StateFailed, &job.Failure{Class: job.ClassExecution, Code: job.CodeExitCode}
		case x < layers*3/5:
			rec.State = job.StateSucceeded
		case x == layers*3/5:
			rec.State = job.StateRunning
		default:
			continue
		}
		seq++
		put(tb, c.index, rec, seq)
	}
	return c, fr
}

// BenchmarkRunPage serves a run's page, whole (layout, graph and counts),
// as each update of an open page draws it: the run read once, its
// nodes' states from the index. A run of 10,000 nodes (100 layers of 100,
// 19,800 edges) is drawn by layers; one of 300 (10 of 30), the most drawn
// one box a node. The target is well under 100 ms a page. The layout,
// made once a run, is measured alone.
func BenchmarkRunPage(b *testing.B) {
	for _, bc := range []struct {
		name          string
		layers, width int
	}{{"10k-nodes", 100, 100}, {"300-nodes", 10, 30}} {
		c, fr := bigRun(b, bc.layers, bc.width)
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				get(b, c, "/ui/runs/default/big")
			}
		})
		nodes := fr.views["default/big"].Nodes
		b.Run(bc.name+"-layout", func(b *testing.B) {
			for b.Loop() {
				layOut(nodes)
			}
		})
	}
}

// TestRunPageWith10kNodes checks the benchmark's page: drawn by layers,
// with its nodes counted as the index holds their jobs, of a size a
// browser takes at once.
func TestRunPageWith10kNodes(t *testing.T) {
	c, _ := bigRun(t, 100, 100)
	start := time.Now()
	page := get(t, c, "/ui/runs/default/big")
	took := time.Since(start)
	t.Logf("the page of a run of 10,000 nodes in %s (%d bytes)", took, len(page))
	for _, s := range []string{`id="summarised"`, `data-count="succeeded">5880 succeeded`, `data-count="failed">120 failed`,
		`data-count="running">100 running`, `data-count="waiting">3900 waiting`, `<g class="band" data-band="49" data-first="98" data-last="99" data-nodes="200">`} {
		if !strings.Contains(page, s) {
			t.Errorf("the page has no %s", s)
		}
	}
	if len(page) > 250_000 {
		t.Errorf("the page of a run of 10,000 nodes is %d bytes", len(page))
	}
}
