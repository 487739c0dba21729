package console

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// fakeRuns answers for the dispatcher about runs: the views it holds, and
// the reads, cancels and retries asked of it.
type fakeRuns struct {
	mu      sync.Mutex
	views   map[string]*job.RunView // by tenant/id
	order   map[string][]string     // by tenant, oldest first
	reads   map[string]int
	lists   int
	actions []string
}

func newFakeRuns() *fakeRuns {
	return &fakeRuns{views: map[string]*job.RunView{}, order: map[string][]string{}, reads: map[string]int{}}
}

func (f *fakeRuns) add(v *job.RunView) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v.Tenant = orDefault(v.Tenant)
	f.views[v.Tenant+"/"+v.RunID] = v
	f.order[v.Tenant] = append(f.order[v.Tenant], v.RunID)
}

func orDefault(tenant string) string {
	if tenant == "" {
		return job.DefaultTenant
	}
	return tenant
}

func (f *fakeRuns) status(_ context.Context, tenant, id string) (*job.RunView, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads[tenant+"/"+id]++
	v := f.views[tenant+"/"+id]
	if v == nil {
		return nil, fmt.Errorf("%w: run %s", queue.ErrNotFound, id)
	}
	c := *v
	c.Nodes = slices.Clone(v.Nodes)
	return &c, nil
}

func (f *fakeRuns) list(_ context.Context, tenant string) (*job.RunList, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lists++
	return &job.RunList{Runs: slices.Clone(f.order[tenant])}, nil
}

func (f *fakeRuns) act(action string) func(context.Context, string, string) (*job.RunReply, error) {
	return func(_ context.Context, tenant, id string) (*job.RunReply, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.actions = append(f.actions, action+" "+tenant+"/"+id)
		return &job.RunReply{RunID: id, Round: 1, Message: action + " done"}, nil
	}
}

func (f *fakeRuns) readsOf(tenant, id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reads[tenant+"/"+id]
}

// runsConsole is a console without a fleet behind it, whose runs are
// fr's.
func runsConsole(tb testing.TB, fr *fakeRuns, readOnly bool) *Console {
	tb.Helper()
	p, err := loadPages()
	if err != nil {
		tb.Fatal(err)
	}
	cfg := Config{RunStatus: fr.status, ListRuns: fr.list, CancelRun: fr.act("cancel"), RetryRun: fr.act("retry"), ReadOnly: readOnly}
	c := &Console{cfg: cfg, log: slog.New(slog.DiscardHandler), index: NewIndex(0, 0), pages: p, work: &workers{},
		dead: &deadLetters{max: 10}, runs: newRunBook(cfg)}
	c.m = newConsoleMetrics(c)
	tb.Cleanup(c.m.unregister)
	c.index.EndReplay()
	c.routes()
	return c
}

// diamondView is a run's diamond as the dispatcher would say it stands:
// a succeeded, b and c queued, d waiting for them.
func diamondView(id string) *job.RunView {
	nodes := graphOf(id, job.StateQueued, "a", "b:a", "c:a", "d:b,c")
	nodes[0].State = job.StateSucceeded
	nodes[3].State, nodes[3].WaitingFor = job.NodeWaiting, []string{"b", "c"}
	return &job.RunView{RunID: id, Tenant: job.DefaultTenant, State: job.RunRunning, Round: 1,
		SubmittedAt: time.Now().Add(-time.Minute), Nodes: nodes}
}

// nodesOn reads a page's node boxes: id → state, and code when it has one.
func nodesOn(page string) map[string]string {
	out := map[string]string{}
	for _, m := range regexp.MustCompile(`data-node="([^"]+)" data-state="([a-z_]+)"[^>]*?(?: data-code="([a-z_]+)")?>`).FindAllStringSubmatch(page, -1) {
		out[m[1]] = m[2]
		if m[3] != "" {
			out[m[1]] += "/" + m[3]
		}
	}
	return out
}

// TestRunPageShowsNodesAsTheirJobsStand: the run's page takes each node's
// state from its job in the index, newer than the run's read, but keeps
// the end of a node that had ended; a waiting node waits for those of its
// parents that have not ended; the run is read through the dispatcher
// once, and again when a message about its round comes.
func TestRunPageShowsNodesAsTheirJobsStand(t *testing.T) {
	fr := newFakeRuns()
	fr.add(diamondView("dia"))
	c := runsConsole(t, fr, false)
	page := get(t, c, "/ui/runs/default/dia")
	want := map[string]string{"a": "succeeded", "b": "queued", "c": "queued", "d": "waiting"}
	if got := nodesOn(page); !mapsEqual(got, want) {
		t.Errorf("before the index has the jobs: %v, want %v", got, want)
	}
	// The jobs move on: b runs, c failed; a's job, as the index holds an
	// older version of it, is running.
	now := time.Now()
	put(t, c.index, &job.Record{ID: "dia:b", Pool: "default", State: job.StateRunning, SubmittedAt: now, UpdatedAt: now}, 1)
	put(t, c.index, &job.Record{ID: "dia:c", Pool: "default", State: job.StateFailed, SubmittedAt: now, UpdatedAt: now,
		Failure: &job.Failure{Class: job.ClassExecution, Code: job.CodeExitCode}}, 2)
	put(t, c.index, &job.Record{ID: "dia:a", Pool: "default", State: job.StateRunning, SubmittedAt: now, UpdatedAt: now}, 3)
	page = get(t, c, "/ui/runs/default/dia")
	want = map[string]string{"a": "succeeded", "b": "running", "c": "failed/exit_code", "d": "waiting"}
	if got := nodesOn(page); !mapsEqual(got, want) {
		t.Errorf("as the jobs stand: %v, want %v", got, want)
	}
	if !strings.Contains(page, "node d · waiting · waiting for b</title>") {
		t.Error("d does not wait for b alone")
	}
	if !strings.Contains(page, `href="/ui/jobs/default/default/dia:b"`) || !strings.Contains(page, `id="run-cancel"`) ||
		strings.Contains(page, `id="run-retry"`) {
		t.Error("no link to b's job, or not cancel alone of a running run")
	}
	if n := fr.readsOf("default", "dia"); n != 1 {
		t.Errorf("the run was read %d times, want once", n)
	}
	// Its summary comes: read again.
	fr.mu.Lock()
	v := fr.views["default/dia"]
	v.State, v.Nodes[1].State, v.Nodes[2].State, v.Nodes[2].Code = job.RunFailed, job.StateSucceeded, job.StateFailed, job.CodeExitCode
	v.Nodes[3].State, v.Nodes[3].Code, v.Nodes[3].WaitingFor = job.StateCancelled, job.CodeUpstreamFailed, nil
	fr.mu.Unlock()
	var names queue.Names
	c.runs.receive(names, names.RunLive("default", "dia", "node.default.b")) // a node's end is not followed
	c.runs.receive(names, names.RunLive("default", "other", "end.1"))
	if get(t, c, "/ui/runs/default/dia"); fr.readsOf("default", "dia") != 1 {
		t.Error("read again for a node's end, or another run's")
	}
	c.runs.receive(names, names.RunLive("default", "dia", "end.1"))
	page = get(t, c, "/ui/runs/default/dia")
	if fr.readsOf("default", "dia") != 2 || !strings.Contains(page, `id="run-state">failed<`) {
		t.Errorf("after its summary: %d reads, the run not failed", fr.readsOf("default", "dia"))
	}
	want = map[string]string{"a": "succeeded", "b": "succeeded", "c": "failed/exit_code", "d": "cancelled/upstream_failed"}
	if got := nodesOn(page); !mapsEqual(got, want) {
		t.Errorf("ended: %v, want %v", got, want)
	}
	if !strings.Contains(page, "<title>node d · cancelled · upstream_failed · job dia:d</title>") ||
		strings.Contains(page, `id="run-cancel"`) || !strings.Contains(page, `id="run-retry"`) {
		t.Error("d's tooltip has no code, or a failed run offers cancel and not retry")
	}
	for _, bad := range []string{"/ui/runs/default/nope", "/ui/runs/default/bad:id", "/ui/runs/no%20such/dia"} {
		if code := status(c, bad); code != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", bad, code)
		}
	}
}

// status is the status of a GET of path.
func status(c *Console, path string) int {
	r := httptest.NewRequest(http.MethodGet, path, nil)
	r.Host = "127.0.0.1:8080"
	w := httptest.NewRecorder()
	c.ServeHTTP(w, r)
	return w.Code
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestRunPageOfALargeRunCountsLayers: a run of 2,000 nodes is drawn by
// layers, and says so, with the nodes that did not succeed listed, at
// most 100.
func TestRunPageOfALargeRunCountsLayers(t *testing.T) {
	fr := newFakeRuns()
	nodes := fanOut(1999)
	for i := range nodes {
		if i%10 == 5 {
			nodes[i].State, nodes[i].Code = job.StateFailed, job.CodeExitCode
		}
	}
	fr.add(&job.RunView{RunID: "big", State: job.RunFailed, Round: 1, SubmittedAt: time.Now(), Nodes: nodes})
	c := runsConsole(t, fr, false)
	page := get(t, c, "/ui/runs/default/big")
	if !strings.Contains(page, `id="summarised"`) || strings.Contains(page, `class="node `) || !strings.Contains(page, `data-nodes="1999"`) {
		t.Error("a run of 2,000 nodes is not drawn by layers, or does not say so")
	}
	if n := strings.Count(page, `<tr data-node="`); n != maxFailedShown || !strings.Contains(page, "100 more: see") {
		t.Errorf("%d nodes listed that did not succeed, want 100 and 100 more", n)
	}
	if !strings.Contains(page, `<span class="state s-failed" data-count="failed">200 failed</span>`) {
		t.Error("the counts do not say 200 failed")
	}
}

// TestRunsPageListsATenantsRunsNewestFirst: a page of runs, newest
// first, each with its state, round and nodes by state; the next page;
// another tenant's runs on its own list; runs listed again when a new
// one is defined.
func TestRunsPageListsATenantsRunsNewestFirst(t *testing.T) {
	fr := newFakeRuns()
	for i := range 30 {
		v := diamondView(fmt.Sprintf("run-%02d", i))
		if i%2 == 0 {
			v.State = job.RunSucceeded
			for j := range v.Nodes {
				v.Nodes[j].State = job.StateSucceeded
			}
		}
		fr.add(v)
	}
	acme := diamondView("acme-only")
	acme.Tenant = "acme"
	fr.add(acme)
	c := runsConsole(t, fr, false)
	page := get(t, c, "/ui/runs")
	rows := regexp.MustCompile(`<tr id="run-([^"]+)" data-run="[^"]+" data-state="([a-z]+)">`).FindAllStringSubmatch(page, -1)
	if len(rows) != runsPageSize || rows[0][1] != "run-29" || rows[0][2] != "running" || rows[1][1] != "run-28" ||
		rows[1][2] != "succeeded" || rows[24][1] != "run-05" {
		t.Fatalf("rows %v", rows)
	}
	if !strings.Contains(page, `<b id="runs-total">30</b>`) || !strings.Contains(page, `aria-current="page">Runs</a>`) {
		t.Error("no total, or the nav does not mark the runs page")
	}
	first := page[strings.Index(page, `<tr id="run-run-29"`):]
	first = first[:strings.Index(first, "</tr>")]
	for _, s := range []string{`<a href="/ui/runs/default/run-29">`, `<td class="n round">1</td>`, `<td class="n nodes">4</td>`,
		`data-count="waiting">1 waiting`, `data-count="queued">2 queued`, `data-count="succeeded">1 succeeded`} {
		if !strings.Contains(first, s) {
			t.Errorf("the newest run's row has no %s: %s", s, first)
		}
	}
	older := regexp.MustCompile(`href="(/ui/runs\?[^"]+)" rel="next"`).FindStringSubmatch(page)
	if older == nil {
		t.Fatal("no older page")
	}
	page = get(t, c, strings.ReplaceAll(older[1], "&amp;", "&"))
	rows = regexp.MustCompile(`<tr id="run-([^"]+)"`).FindAllStringSubmatch(page, -1)
	if len(rows) != 5 || rows[0][1] != "run-04" || rows[4][1] != "run-00" {
		t.Errorf("the older page: %v", rows)
	}
	page = get(t, c, "/ui/runs?tenant=acme")
	if rows = regexp.MustCompile(`<tr id="run-([^"]+)"`).FindAllStringSubmatch(page, -1); len(rows) != 1 || rows[0][1] != "acme-only" ||
		!strings.Contains(page, `<a href="/ui/runs/acme/acme-only">`) {
		t.Errorf("acme's runs: %v", rows)
	}
	lists := fr.lists
	fr.add(diamondView("run-30"))
	if get(t, c, "/ui/runs"); fr.lists != lists {
		t.Error("listed again without a new run")
	}
	var names queue.Names
	c.runs.receive(names, names.RunLive("default", "run-30", "def"))
	time.Sleep(snapshotEvery)
	if page = get(t, c, "/ui/runs"); !strings.Contains(page, `<tr id="run-run-30"`) {
		t.Error("a new run is not listed once defined")
	}
	if code := status(c, "/ui/runs?tenant=no+such"); code != http.StatusBadRequest {
		t.Errorf("a tenant that cannot be: %d", code)
	}
}

// TestRunActionsNeedTheFormsTokenAndAWritableConsole: cancel and retry
// act as the run's tenant with the page's CSRF token, and lead back to the
// run's page with what happened; without the token, or on a read-only
// console, they are refused and not asked of the dispatcher.
func TestRunActionsNeedTheFormsTokenAndAWritableConsole(t *testing.T) {
	fr := newFakeRuns()
	fr.add(diamondView("dia"))
	post := func(c *Console, path, csrf string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(url.Values{"csrf": {csrf}}.Encode()))
		r.Host = "127.0.0.1:8080"
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		r.AddCookie(&http.Cookie{Name: csrfCookie, Value: strings.Repeat("k", 43)})
		w := httptest.NewRecorder()
		c.ServeHTTP(w, r)
		return w
	}
	c := runsConsole(t, fr, false)
	token := strings.Repeat("k", 43)
	w := post(c, "/ui/runs/default/dia/cancel", token)
	if w.Code != http.StatusSeeOther || w.Header().Get("Location") != "/ui/runs/default/dia?notice=cancel+done" {
		t.Errorf("cancel: %d to %q", w.Code, w.Header().Get("Location"))
	}
	if w = post(c, "/ui/runs/default/dia/retry", token); w.Code != http.StatusSeeOther {
		t.Errorf("retry: %d", w.Code)
	}
	if w = post(c, "/ui/runs/default/dia/retry", "forged"); w.Code != http.StatusForbidden {
		t.Errorf("retry with a forged token: %d", w.Code)
	}
	if w = post(c, "/ui/runs/default/a:b/cancel", token); w.Code != http.StatusNotFound {
		t.Errorf("cancel of a run id that cannot be: %d", w.Code)
	}
	ro := runsConsole(t, fr, true)
	if w = post(ro, "/ui/runs/default/dia/cancel", token); w.Code != http.StatusForbidden {
		t.Errorf("cancel on a read-only console: %d", w.Code)
	}
	if page := get(t, ro, "/ui/runs/default/dia"); strings.Contains(page, `id="run-cancel"`) || strings.Contains(page, "/cancel") {
		t.Error("a read-only console offers cancel")
	}
	if !slices.Equal(fr.actions, []string{"cancel default/dia", "retry default/dia"}) {
		t.Errorf("asked of the dispatcher: %v", fr.actions)
	}
}
