package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/fleet-dev/fleet/internal/capacity"
	"github.com/fleet-dev/fleet/internal/capacity/monitor"
	"github.com/fleet-dev/fleet/internal/console"
	"github.com/fleet-dev/fleet/internal/dispatcher"
	"github.com/fleet-dev/fleet/internal/executor/process"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/historytest"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/internal/redistest"
	"github.com/fleet-dev/fleet/internal/testenv"
	"github.com/fleet-dev/fleet/internal/worker"
	"github.com/fleet-dev/fleet/job"
)

// site is a fleet with its console, served as the dispatcher serves it.
type site struct {
	f       *fleettest.Fleet
	c       *console.Console
	srv     *httptest.Server
	caps    *capacity.Store
	auth    *dispatcher.Auth
	workDir string
	// schedReads counts the console's reads of the schedules.
	schedReads atomic.Int64
}

type siteOptions struct {
	token    string // requires this API token
	readOnly bool
	redisURL string // capacity, and a reaper
	interval time.Duration
	traceURL string
}

func startSite(t *testing.T, o siteOptions) *site {
	t.Helper()
	s := &site{f: fleettest.Start(t), workDir: t.TempDir()}
	d := s.f.Dispatcher
	lag := d.Lag
	cfg := console.Config{JS: d.JetStream(), Queue: s.f.Queue, History: d.History, Status: d.Status, Cancel: d.Cancel,
		Retry: d.RetryDeadLetter, Lag: lag, ReadOnly: o.readOnly, PauseSchedule: d.PauseSchedule, Pools: d.AllPools,
		RunStatus: d.RunStatus, ListRuns: d.ListRuns, CancelRun: d.CancelRun, RetryRun: d.RetryRun,
		TraceURL: o.traceURL, HeartbeatInterval: o.interval, WorkersEvery: 200 * time.Millisecond, Version: "test",
		Logger: fleettest.Logger(t)}
	cfg.Schedules = func(ctx context.Context) (*job.ScheduleList, error) {
		s.schedReads.Add(1)
		return d.AllSchedules(ctx)
	}
	if o.redisURL != "" {
		caps, err := capacity.Open(o.redisURL, capacity.Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { caps.Close() })
		s.caps, cfg.Capacity = caps, caps
		reaper := monitor.NewReaper(caps, monitor.ReaperConfig{Interval: o.interval, Announce: d.Announce, Requeue: d.Requeue,
			Logger: fleettest.Logger(t)})
		if err := reaper.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = reaper.Stop(context.Background()) })
	}
	if o.token != "" {
		s.auth = &dispatcher.Auth{}
		path := filepath.Join(t.TempDir(), "tokens")
		if err := os.WriteFile(path, []byte(o.token+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := s.auth.LoadTokens(path); err != nil {
			t.Fatal(err)
		}
		cfg.Auth = s.auth
	}
	c, err := console.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = c.Stop(ctx)
	})
	s.c = c
	api := dispatcher.NewAPI(d)
	api.Handle("/ui/", c)
	var h http.Handler = api
	if s.auth != nil {
		h = s.auth.Wrap(api)
	}
	s.srv = httptest.NewServer(h)
	t.Cleanup(s.srv.Close)
	waitFor(t, "the console's index", 10*time.Second, c.Index().Ready)
	return s
}

func (s *site) url(path string) string { return s.srv.URL + path }

// jobPage is the path of a job's page.
func jobPage(tenant, pool, id string) string { return "/ui/jobs/" + tenant + "/" + pool + "/" + id }

// row selects a job's row on the jobs page.
func row(tenant, pool, id string) string { return fmt.Sprintf(`[id="job-%s.%s.%s"]`, tenant, pool, id) }

// deadRow selects a dead letter's row.
func deadRow(tenant, pool, id string) string {
	return fmt.Sprintf(`[id="dl-%s.%s.%s"]`, tenant, pool, id)
}

// worker starts an in-process worker running processes.
func (s *site) worker(t *testing.T, id string) *worker.Worker {
	t.Helper()
	e, err := process.New(process.Config{Dir: s.workDir, Grace: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return s.f.Worker(t, e, worker.Config{ID: id, Slots: 4})
}

func waitFor(t *testing.T, what string, d time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if ok() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s: not within %s", what, d)
}

// browser is a headless Chromium that records every error its pages
// report: script exceptions, console errors and warnings, refused
// resources and Content-Security-Policy violations.
type browser struct {
	ctx  context.Context
	mu   sync.Mutex
	errs []string
}

// newBrowser starts a headless Chromium for the test. Chromium fails the
// connections it is making (net::ERR_NETWORK_CHANGED) whenever an address
// of the host changes, as it does each time Docker makes a network or
// starts a container, so `make test` runs this package alone, not beside
// the packages that do.
func newBrowser(t *testing.T) *browser {
	t.Helper()
	path, err := exec.LookPath("chromium")
	testenv.Require(t, err == nil, "chromium is not installed (apt-get install chromium)")
	opts := []chromedp.ExecAllocatorOption{chromedp.ExecPath(path), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.NoFirstRun, chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1400, 900),
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true)}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	b := &browser{ctx: ctx}
	if err := chromedp.Do(ctx); err != nil { // starts the browser and its tab
		t.Fatalf("start chromium: %v", err)
	}
	messages := chromedp.Console(ctx)
	go func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			switch m.Type {
			case chromedp.ConsoleError, chromedp.ConsoleWarning, chromedp.ConsoleException:
				b.add(fmt.Sprintf("%s (%s) %s", m, m.Source, m.URL))
			}
		}
	}()
	return b
}

func (b *browser) add(s string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.errs = append(b.errs, s)
}

// errors returns the errors reported since the last call.
func (b *browser) errors() []string {
	time.Sleep(100 * time.Millisecond) // messages arrive a moment after their cause
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.errs
	b.errs = nil
	return e
}

// do runs actions, bounded in time.
func (b *browser) do(t *testing.T, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		t.Fatalf("browser: %v", err)
	}
}

// eval evaluates js in the page. A page that navigates away while it is
// asked (a form sent, a link followed) answers that it is gone; js is then
// asked of the page that replaced it.
func eval[T any](t *testing.T, b *browser, js string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	for {
		v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js, chromedp.EvalAwaitPromise))
		if err == nil {
			return v
		}
		if !navigatedAway(err) || ctx.Err() != nil {
			t.Fatalf("browser: %s: %v", js, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// navigatedAway reports whether err says the page asked was replaced by
// another while it was being asked.
func navigatedAway(err error) bool {
	m := err.Error()
	return strings.Contains(m, "Inspected target navigated or closed") ||
		strings.Contains(m, "Execution context was destroyed") ||
		strings.Contains(m, "Cannot find context with specified id")
}

// attr reads an attribute of the first node matching sel, "" when none.
func (b *browser) attr(t *testing.T, sel, name string) string {
	t.Helper()
	return eval[string](t, b, fmt.Sprintf(`(function(){var e=document.querySelector(%q);return e?e.getAttribute(%q)||"":""})()`, sel, name))
}

func (b *browser) exists(t *testing.T, sel string) bool {
	t.Helper()
	return eval[int](t, b, fmt.Sprintf(`document.querySelectorAll(%q).length`, sel)) > 0
}

func (b *browser) text(t *testing.T, sel string) string {
	t.Helper()
	return eval[string](t, b, fmt.Sprintf(`(function(){var e=document.querySelector(%q);return e?e.textContent.trim():""})()`, sel))
}

// click clicks the first node matching sel from inside the page, once
// it is there. The live pages redraw parts of themselves as updates
// arrive, so a node found by the protocol may be gone by the time a
// protocol click reaches it; a click in the page cannot miss that way.
func (b *browser) click(t *testing.T, sel string) {
	t.Helper()
	waitFor(t, "a "+sel+" to click", 10*time.Second, func() bool {
		return eval[bool](t, b, fmt.Sprintf(`(function(){var e=document.querySelector(%q);if(!e)return false;e.click();return true})()`, sel))
	})
}

func (b *browser) location(t *testing.T) string {
	t.Helper()
	return eval[string](t, b, `location.href`)
}

// open loads a page and waits for its live part.
func (b *browser) open(t *testing.T, url string) {
	t.Helper()
	b.do(t, chromedp.Navigate(url), chromedp.WaitVisible(chromedp.ID("live")))
}

// visitAll loads each of the console's pages (and a job's, given its
// path), waits for its live stream to deliver, and fails on any error the
// page reported.
func (b *browser) visitAll(t *testing.T, s *site, jobPath string) {
	t.Helper()
	pages := []string{"/ui/", "/ui/jobs", "/ui/runs", "/ui/workers", "/ui/dlq", "/ui/schedules"}
	if jobPath != "" {
		pages = append(pages, jobPath)
	}
	for _, p := range pages {
		b.open(t, s.url(p))
		waitFor(t, p+" live", 5*time.Second, func() bool { return strings.HasPrefix(b.text(t, "#status"), "live") })
		if errs := b.errors(); len(errs) > 0 {
			t.Errorf("%s: the page reported errors:\n%s", p, strings.Join(errs, "\n"))
		}
	}
}

// TestConsoleShowsAJobLiveAndFindsItByFilters: every page loads without
// an error; a submitted job appears in the list and goes queued →
// running → succeeded on the page without a reload; filters by state and
// label find it.
func TestConsoleShowsAJobLiveAndFindsItByFilters(t *testing.T) {
	s := startSite(t, siteOptions{traceURL: "https://jaeger.example/trace/{trace_id}"})
	b := newBrowser(t)
	b.visitAll(t, s, "")

	b.open(t, s.url("/ui/jobs"))
	eval[bool](t, b, `window.__notReloaded = true`)
	waitFor(t, "the stream", 5*time.Second, func() bool { return strings.HasPrefix(b.text(t, "#status"), "live") })
	// No worker yet: the job waits in the queue.
	id := s.f.Submit(t, &job.Request{ID: "live-1", Command: []string{"sh", "-c", "sleep 1.5; echo done"},
		Labels: map[string]string{"team": "ml"}})
	sel := row("default", "default", id)
	var seen []string
	observe := func(until string, within time.Duration) {
		t.Helper()
		waitFor(t, "state "+until, within, func() bool {
			st := b.attr(t, sel, "data-state")
			if st != "" && (len(seen) == 0 || seen[len(seen)-1] != st) {
				seen = append(seen, st)
			}
			return st == until
		})
	}
	observe("queued", 5*time.Second)
	s.worker(t, "w-live")
	observe("succeeded", 15*time.Second)
	if !slices.Equal(seen, []string{"queued", "running", "succeeded"}) {
		t.Errorf("the sel went through %v, want queued, running, succeeded", seen)
	}
	if !eval[bool](t, b, `window.__notReloaded === true`) {
		t.Error("the page was reloaded")
	}

	// Filters: state and label find it; another label does not.
	s.f.Submit(t, &job.Request{ID: "other-1", Command: []string{"true"}, Labels: map[string]string{"team": "web"}})
	s.f.Await(t, "other-1", 10*time.Second)
	b.do(t, chromedp.SetValue(chromedp.ID("f-state"), "succeeded"), chromedp.SetValue(chromedp.ID("f-label"), "team=ml"),
		chromedp.Click(chromedp.ID("f-apply")))
	waitFor(t, "the filtered list", 10*time.Second, func() bool { return strings.Contains(b.location(t), "state=succeeded") })
	b.do(t, chromedp.WaitVisible(chromedp.CSS(sel)))
	if b.exists(t, row("default", "default", "other-1")) || b.text(t, "#total") != "1" {
		t.Errorf("state=succeeded, label team=ml: other-1 listed or total %q", b.text(t, "#total"))
	}
	if loc := b.location(t); !strings.Contains(loc, "label=team%3Dml") || !strings.Contains(loc, "state=succeeded") {
		t.Errorf("the filter is not in the URL: %s", loc)
	}
	b.open(t, s.url("/ui/jobs?label=team%3Dnobody"))
	if b.exists(t, sel) {
		t.Error("label team=nobody lists the job")
	}
	b.open(t, s.url("/ui/jobs?state=failed"))
	if b.exists(t, sel) {
		t.Error("state=failed lists the succeeded job")
	}
	b.visitAll(t, s, jobPage("default", "default", id))
	// The page of a job before tenants sends to the default tenant's.
	b.open(t, s.url("/ui/jobs/"+id))
	if loc := b.location(t); !strings.HasSuffix(loc, jobPage("default", "default", id)) {
		t.Errorf("/ui/jobs/%s led to %s", id, loc)
	}

	// A traced job's page links its trace through --trace-url.
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	traced := trace.ContextWithSpanContext(context.Background(),
		trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true}))
	if reply, err := s.f.Dispatcher.Submit(traced, "default", []byte(`{"id": "traced-1", "command": ["true"]}`)); err != nil || reply.Rejected() {
		t.Fatalf("submit: %+v %v", reply, err)
	}
	b.open(t, s.url("/ui/jobs/traced-1"))
	if href := b.attr(t, "#trace", "href"); href != "https://jaeger.example/trace/"+tid.String() {
		t.Errorf("the trace link: %q", href)
	}
}

// TestConsoleCancelsARunningJob: cancel on the job's page stops a running
// sleep 60, and the page shows cancelled.
func TestConsoleCancelsARunningJob(t *testing.T) {
	s := startSite(t, siteOptions{})
	s.worker(t, "w-cancel")
	id := s.f.Submit(t, &job.Request{ID: "sleepy", Command: []string{"sleep", "60"},
		Env: map[string]string{"API_SECRET": "do-not-show-me"}})
	b := newBrowser(t)
	b.open(t, s.url("/ui/jobs/"+id))
	waitFor(t, "running on the page", 10*time.Second, func() bool { return b.exists(t, "h1 .s-running") })
	html := eval[string](t, b, `document.documentElement.outerHTML`)
	if strings.Contains(html, "do-not-show-me") || !strings.Contains(html, "API_SECRET") {
		t.Error("the job page shows an env value, or not the env's names")
	}
	start := time.Now()
	eval[bool](t, b, `window.confirm = function () { return true }; true`) // the cancel button asks first
	b.click(t, "#cancel")
	waitFor(t, "cancelled on the page", 15*time.Second, func() bool { return b.exists(t, "h1 .s-cancelled") })
	r := s.f.Await(t, id, 10*time.Second)
	if r.Status != job.StatusCancelled {
		t.Errorf("the job ended %s", r.Status)
	}
	t.Logf("cancelled on the page %s after the click", time.Since(start).Round(time.Millisecond))
	if errs := b.errors(); len(errs) > 0 {
		t.Errorf("errors: %v", errs)
	}
}

// TestConsoleRetriesADeadLetter: retry on the dead-letters page submits
// the request again as ID-retry-1.
func TestConsoleRetriesADeadLetter(t *testing.T) {
	s := startSite(t, siteOptions{})
	s.worker(t, "w-dlq")
	id := s.f.Submit(t, &job.Request{ID: "doomed", Command: []string{"sh", "-c", "exit 3"}})
	if r := s.f.Await(t, id, 15*time.Second); r.Status != job.StatusFailed {
		t.Fatalf("the job ended %s", r.Status)
	}
	b := newBrowser(t)
	b.open(t, s.url("/ui/dlq"))
	dl := deadRow("default", "default", id)
	waitFor(t, "the dead letter", 10*time.Second, func() bool { return b.exists(t, dl) })
	if !strings.Contains(b.text(t, dl), "execution/exit_code") {
		t.Errorf("the dead letter's failure is not shown: %q", b.text(t, dl))
	}
	b.click(t, `button[data-retry="default/default/`+id+`"]`)
	want := job.RetryID(id, 1)
	waitFor(t, "the retry's page", 10*time.Second, func() bool {
		return strings.HasSuffix(strings.SplitN(b.location(t), "?", 2)[0], jobPage("default", "default", want))
	})
	if r := s.f.Await(t, want, 15*time.Second); r.Status != job.StatusFailed {
		t.Errorf("%s ended %s, want failed as its request says", want, r.Status)
	}
	// The dead-letters page links the retry.
	b.open(t, s.url("/ui/dlq"))
	waitFor(t, "the retry linked", 5*time.Second, func() bool { return strings.Contains(b.text(t, dl), want) })
	if errs := b.errors(); len(errs) > 0 {
		t.Errorf("errors: %v", errs)
	}
}

// TestConsoleRefusesWithoutAToken: with API tokens, every page, stream
// and action is refused without one; the login form sets a session
// cookie (HttpOnly, Secure, SameSite) that lets the browser in; an action
// without the page's CSRF token is refused.
func TestConsoleRefusesWithoutAToken(t *testing.T) {
	const token = "console-test-token-0123456789"
	s := startSite(t, siteOptions{token: token})
	id := s.f.Submit(t, &job.Request{ID: "guarded", Command: []string{"true"}})
	noRedirect := &http.Client{Timeout: 5 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	do := func(method, path, bearer string, form url.Values) *http.Response {
		t.Helper()
		var body *strings.Reader
		if form != nil {
			body = strings.NewReader(form.Encode())
		} else {
			body = strings.NewReader("")
		}
		req, _ := http.NewRequest(method, s.url(path), body)
		if form != nil {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	page := jobPage("default", "default", id)
	for _, p := range []string{"/ui/", "/ui/jobs", page, "/ui/workers", "/ui/dlq", "/ui/jobs?state=queued", "/ui/runs"} {
		if r := do("GET", p, "", nil); r.StatusCode != http.StatusSeeOther || !strings.HasPrefix(r.Header.Get("Location"), "/ui/login") {
			t.Errorf("GET %s without a token: %d to %q, want 303 to the login", p, r.StatusCode, r.Header.Get("Location"))
		}
		if r := do("GET", p, "wrong-token-wrong-token", nil); r.StatusCode != http.StatusSeeOther {
			t.Errorf("GET %s with a wrong token: %d", p, r.StatusCode)
		}
		if r := do("GET", p, token, nil); r.StatusCode != http.StatusOK {
			t.Errorf("GET %s with the token: %d", p, r.StatusCode)
		}
	}
	if r := do("GET", "/ui/stream?page=jobs", "", nil); r.StatusCode != http.StatusUnauthorized {
		t.Errorf("the stream without a token: %d", r.StatusCode)
	}
	if r := do("GET", "/ui/jobs/"+id, "", nil); r.StatusCode != http.StatusSeeOther || !strings.HasPrefix(r.Header.Get("Location"), "/ui/login") {
		t.Errorf("GET /ui/jobs/%s without a token: %d to %q, want 303 to the login", id, r.StatusCode, r.Header.Get("Location"))
	}
	if r := do("GET", "/ui/jobs/"+id, token, nil); r.StatusCode != http.StatusSeeOther || r.Header.Get("Location") != page {
		t.Errorf("GET /ui/jobs/%s with the token: %d to %q, want 303 to %s", id, r.StatusCode, r.Header.Get("Location"), page)
	}
	for _, p := range []string{page + "/cancel", page + "/retry", "/ui/dlq/retry", "/ui/runs/default/some-run/cancel",
		"/ui/runs/default/some-run/retry"} {
		if r := do("POST", p, "", url.Values{"job": {id}}); r.StatusCode != http.StatusUnauthorized {
			t.Errorf("POST %s without a token: %d", p, r.StatusCode)
		}
	}

	b := newBrowser(t)
	tokenField := chromedp.CSS(`input[name="token"]`)
	b.do(t, chromedp.Navigate(s.url("/ui/jobs/"+id)), chromedp.WaitVisible(tokenField))
	if b.exists(t, "#live") {
		t.Fatal("the job page shows without a token")
	}
	b.do(t, chromedp.SetValue(tokenField, "not-the-token-at-all"), chromedp.Submit(tokenField), chromedp.WaitVisible(chromedp.CSS(".error")))
	b.errors() // the refused login answers 401, which the browser logs
	b.do(t, chromedp.SetValue(tokenField, token), chromedp.Submit(tokenField), chromedp.WaitVisible(chromedp.ID("live")))
	loc := b.location(t)
	if !strings.HasSuffix(loc, page) {
		t.Errorf("after the login: %s, want the job's page", loc)
	}
	got, err := chromedp.Call(b.ctx, network.GetCookies, network.GetCookiesParams{URLs: []string{s.url("/ui/")}})
	if err != nil {
		t.Fatal(err)
	}
	var session *network.Cookie
	for _, c := range got.Cookies {
		if c.Name == "fleet_session" {
			session = c
		}
		if strings.Contains(c.Value, token) {
			t.Errorf("cookie %s holds the token", c.Name)
		}
	}
	if session == nil || !session.HTTPOnly || !session.Secure || session.SameSite != network.CookieSameSiteStrict {
		t.Fatalf("the session cookie: %+v", session)
	}
	if html := eval[string](t, b, `document.documentElement.outerHTML`); strings.Contains(html, token) || strings.Contains(loc, token) {
		t.Error("the token is in the page or its URL")
	}
	b.visitAll(t, s, page)

	// The cookie without the page's CSRF token does not make an action.
	req, _ := http.NewRequest("POST", s.url(page+"/cancel"), strings.NewReader("csrf=forged"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.AddCookie(&http.Cookie{Name: "fleet_session", Value: session.Value})
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("an action with a forged CSRF token: %d, want 403", resp.StatusCode)
	}
	// Nor does a forged cookie let anyone in.
	req, _ = http.NewRequest("GET", s.url("/ui/jobs"), nil)
	req.AddCookie(&http.Cookie{Name: "fleet_session", Value: session.Value[:len(session.Value)-4] + "AAAA"})
	if resp, err = noRedirect.Do(req); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusSeeOther {
			t.Errorf("a forged session cookie: %d, want 303 to the login", resp.StatusCode)
		}
	}
}

// TestConsoleReadOnlyOffersAndAcceptsNoAction: a read-only console shows
// no cancel or retry, and refuses them when posted anyway.
func TestConsoleReadOnlyOffersAndAcceptsNoAction(t *testing.T) {
	s := startSite(t, siteOptions{readOnly: true})
	s.worker(t, "w-ro")
	run := s.f.Submit(t, &job.Request{ID: "ro-running", Command: []string{"sleep", "30"}})
	dead := s.f.Submit(t, &job.Request{ID: "ro-dead", Command: []string{"false"}})
	s.f.Await(t, dead, 15*time.Second)
	b := newBrowser(t)
	b.open(t, s.url(jobPage("default", "default", run)))
	waitFor(t, "running", 10*time.Second, func() bool { return b.exists(t, "h1 .s-running") })
	if b.exists(t, "#cancel") {
		t.Error("a read-only console offers cancel")
	}
	b.open(t, s.url("/ui/dlq"))
	waitFor(t, "the dead letter", 10*time.Second, func() bool { return b.exists(t, deadRow("default", "default", dead)) })
	if b.exists(t, "button[data-retry]") || b.exists(t, "#retry-selected") {
		t.Error("a read-only console offers retry")
	}
	b.open(t, s.url(jobPage("default", "default", dead)))
	if b.exists(t, "#retry") {
		t.Error("a read-only console offers retry on the job page")
	}
	// Posted anyway, with the page's own CSRF token: refused.
	for _, p := range []string{jobPage("default", "default", run) + "/cancel", jobPage("default", "default", dead) + "/retry", "/ui/dlq/retry"} {
		// The page's CSRF token, taken from its forms or cookie-backed value.
		code := eval[int](t, b, fmt.Sprintf(`fetch(%q, {method: "POST", body: new URLSearchParams({job: %q, csrf: %q})}).then(r => r.status)`, p, dead, "x"))
		if code != http.StatusForbidden {
			t.Errorf("POST %s on a read-only console: %d, want 403", p, code)
		}
	}
	b.errors()
	if st, err := s.f.Dispatcher.Status(context.Background(), "default", run); err != nil || st.Job.State != job.StateRunning {
		t.Errorf("the running job: %v %v", st, err)
	}
	if s.c.Index().Has(queue.JobKey{Tenant: "default", Pool: "default", ID: job.RetryID(dead, 1)}) {
		t.Error("a read-only console retried a dead letter")
	}
}

// TestConsoleWorkersPageLosesAKilledWorker: a worker process SIGKILLed
// leaves the workers page within its heartbeat TTL (and the console's
// refresh), and shows among the recently lost with the job it held; that
// job, cancelled, ends once (historytest).
func TestConsoleWorkersPageLosesAKilledWorker(t *testing.T) {
	const interval = 500 * time.Millisecond
	ttl := 3 * interval
	rs := redistest.Start(t)
	s := startSite(t, siteOptions{redisURL: rs.URL(), interval: interval})
	env := []string{"FLEET_NATS_URL=" + s.f.NATS.URL(), "FLEET_REDIS_URL=" + rs.URL(), "FLEET_DATA_DIR=" + t.TempDir()}
	w := fleettest.StartProc(t, "worker", env, "--id", "doomed-worker", "--slots", "2", "--heartbeat-interval", interval.String())
	w.WaitOutput(t, "worker started", 30*time.Second)
	nc := s.f.NATS.Connect(t)
	ear := historytest.Listen(t, nc, queue.Names{}, job.DefaultTenant, "default")
	id := s.f.Submit(t, &job.Request{ID: "held-by-doomed", Command: []string{"sleep", "30"}})

	b := newBrowser(t)
	b.open(t, s.url("/ui/workers"))
	row := "#worker-doomed-worker"
	waitFor(t, "the worker on the page", 10*time.Second, func() bool { return b.exists(t, row) })
	waitFor(t, "its job on the page", 10*time.Second, func() bool { return strings.Contains(b.text(t, row), id) })
	b.open(t, s.url("/ui/"))
	waitFor(t, "the pool's slots on the overview", 5*time.Second, func() bool {
		return strings.Contains(b.text(t, `tr[data-pool="default"]`), "1 / 2")
	})
	b.open(t, s.url("/ui/workers"))
	w.Kill()
	killed := time.Now()
	waitFor(t, "the worker to leave the page", ttl+2*time.Second, func() bool { return !b.exists(t, row) })
	gone := time.Since(killed)
	t.Logf("the killed worker left the page %s after the kill (heartbeat TTL %s)", gone.Round(10*time.Millisecond), ttl)
	if gone > ttl+time.Second {
		t.Errorf("the killed worker left the page %s after the kill: more than its TTL %s and the console's refresh", gone, ttl)
	}
	lost := `tr[data-lost="doomed-worker"]`
	waitFor(t, "the worker among the recently lost", 10*time.Second, func() bool { return b.exists(t, lost) })
	if !strings.Contains(b.text(t, lost), id) {
		t.Errorf("the lost worker's row does not name the job it held: %q", b.text(t, lost))
	}
	if errs := b.errors(); len(errs) > 0 {
		t.Errorf("errors: %v", errs)
	}

	// The job it held, cancelled, ends once when a worker gets it again.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.f.Client.Cancel(ctx, id); err != nil {
		t.Fatal(err)
	}
	s.worker(t, "heir")
	if r := s.f.Await(t, id, 30*time.Second); r.Status != job.StatusCancelled {
		t.Errorf("the cancelled job of the killed worker: %s %+v", r.Status, r.Failure)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	historytest.Require(t, js, queue.Names{}, job.DefaultTenant, "default", "", []string{id}, ear)
}

// TestConsolesAgreeAndRebuildFromTheStreams: a console that followed jobs
// live and one started afterwards (another dispatcher, or this one
// restarted), which rebuilds its index from the pools' streams, show the
// same counts, the same last hour and the same list.
func TestConsolesAgreeAndRebuildFromTheStreams(t *testing.T) {
	s := startSite(t, siteOptions{})
	s.worker(t, "w-agree")
	var ids []string
	for i := range 12 {
		cmd := "true"
		if i%4 == 0 {
			cmd = "exit 1"
		}
		ids = append(ids, s.f.Submit(t, &job.Request{ID: fmt.Sprintf("agree-%02d", i), Command: []string{"sh", "-c", cmd},
			Labels: map[string]string{"n": fmt.Sprint(i % 3)}}))
	}
	for _, id := range ids {
		s.f.Await(t, id, 20*time.Second)
	}
	s.f.Submit(t, &job.Request{ID: "agree-waiting", Pool: "nobody-serves-this", Command: []string{"true"}})

	d := s.f.Dispatcher
	late, err := console.New(console.Config{JS: d.JetStream(), Queue: s.f.Queue, History: d.History, Cancel: d.Cancel,
		Retry: d.RetryDeadLetter, Logger: fleettest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := late.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = late.Stop(context.Background()) })
	waitFor(t, "the late console's index", 10*time.Second, late.Index().Ready)
	summary := func(ix *console.Index) string {
		st := ix.Stats(time.Now())
		var b strings.Builder
		for _, p := range st {
			fmt.Fprintf(&b, "%s %v ok=%d failed=%d started=%d p50=%s;", p.Pool, p.ByState, p.Succeeded, p.Failed, p.Started, p.P50)
		}
		for _, r := range ix.List(console.Filter{}, console.Cursor{}, console.Cursor{}, 100).Rows {
			fmt.Fprintf(&b, "%s=%s/%d ", r.ID, r.State, r.Attempt)
		}
		return b.String()
	}
	waitFor(t, "the two consoles to agree", 10*time.Second, func() bool {
		return summary(s.c.Index()) == summary(late.Index())
	})
	live := s.c.Index().Stats(time.Now())[0]
	if live.Succeeded != 9 || live.Failed != 3 || live.ByState["queued"] != 1 || live.OldestQueued.IsZero() {
		t.Errorf("counts: %d succeeded, %d failed, %d queued in the last hour, want 9, 3, 1 and an oldest queued job",
			live.Succeeded, live.Failed, live.ByState["queued"])
	}
}
