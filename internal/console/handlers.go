package console

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/fleet-dev/fleet/internal/capacity"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// view is what every page's template gets.
type view struct {
	Page, Title string
	CSRF        string
	ReadOnly    bool
	Session     bool // logged in with a token: offer to log out
	Ready       bool // the index holds every job
	Indexed     int
	Notice      string
	Stream      string // the page's stream URL
	Version     string
	Now         time.Time
	TraceURL    string
	Data        any
}

// builder builds a page's view from its request.
type builder func(ctx context.Context, r *http.Request, v *view) error

func (c *Console) routes() {
	m := http.NewServeMux()
	m.Handle("GET /ui/static/", http.StripPrefix("/ui/static/", http.FileServerFS(static())))
	m.HandleFunc("GET /ui/login", c.loginPage)
	m.HandleFunc("POST /ui/login", c.login)
	m.HandleFunc("POST /ui/logout", c.logout)
	m.Handle("GET /ui/{$}", c.page("overview", "Overview", c.overview))
	m.Handle("GET /ui/jobs", c.page("jobs", "Jobs", c.jobs))
	m.HandleFunc("GET /ui/jobs/{id}", c.defaultTenantJob)
	m.Handle("GET /ui/jobs/{tenant}/{pool}/{id}", c.page("job", "Job", c.jobPage))
	m.Handle("GET /ui/workers", c.page("workers", "Workers", c.workersPage))
	m.Handle("GET /ui/dlq", c.page("dlq", "Dead letters", c.dlqPage))
	m.Handle("GET /ui/schedules", c.page("schedules", "Schedules", c.schedulesPage))
	m.Handle("GET /ui/pools", c.page("pools", "Pools", c.poolsPage))
	m.Handle("GET /ui/runs", c.page("runs", "Runs", c.runsPage))
	m.Handle("GET /ui/runs/{tenant}/{id}", c.page("run", "Run", c.runPage))
	m.Handle("GET /ui/stream", c.guard(c.stream))
	m.Handle("POST /ui/jobs/{tenant}/{pool}/{id}/cancel", c.action(c.cancel))
	m.Handle("POST /ui/jobs/{tenant}/{pool}/{id}/retry", c.action(c.retryOne))
	m.Handle("POST /ui/dlq/retry", c.action(c.retryMany))
	m.Handle("POST /ui/schedules/{tenant}/{name}/pause", c.action(c.pauseSchedule))
	m.Handle("POST /ui/schedules/{tenant}/{name}/resume", c.action(c.resumeSchedule))
	m.Handle("POST /ui/runs/{tenant}/{id}/cancel", c.action(c.cancelRun))
	m.Handle("POST /ui/runs/{tenant}/{id}/retry", c.action(c.retryRun))
	c.mux = m
}

// ServeHTTP serves /ui/.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	securityHeaders(w)
	if c.cfg.Auth == nil && !c.cfg.AnyHost && !loopbackHost(r.Host) {
		http.Error(w, "this console is open to loopback only: use 127.0.0.1 or localhost", http.StatusForbidden)
		return
	}
	c.mux.ServeHTTP(w, r)
}

// guard lets in who may see the console; others get 401.
func (c *Console) guard(next func(http.ResponseWriter, *http.Request, who)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v := c.identify(w, r)
		if !v.ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="fleet"`)
			http.Error(w, "log in first: a bearer token or a client certificate is required", http.StatusUnauthorized)
			return
		}
		next(w, r, v)
	})
}

// page serves a page: the layout around the page's live part.
func (c *Console) page(name, title string, build builder) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v := c.identify(w, r)
		if !v.ok {
			http.Redirect(w, r, "/ui/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
			return
		}
		vw := c.newView(name, title, v)
		vw.Notice = r.URL.Query().Get("notice")
		q := r.URL.Query()
		q.Del("notice")
		q.Set("page", name)
		switch name {
		case "job":
			q.Set("tenant", r.PathValue("tenant"))
			q.Set("pool", r.PathValue("pool"))
			q.Set("id", r.PathValue("id"))
		case "run":
			q.Set("tenant", r.PathValue("tenant"))
			q.Set("id", r.PathValue("id"))
		}
		vw.Stream = "/ui/stream?" + q.Encode()
		if err := build(r.Context(), r, vw); err != nil {
			c.fail(w, err)
			return
		}
		var buf bytes.Buffer
		if err := c.pages.render(&buf, "layout", vw); err != nil {
			c.log.Error("console page", "page", name, "err", err)
			http.Error(w, "the page could not be drawn", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(buf.Bytes())
	})
}

func (c *Console) newView(name, title string, v who) *view {
	return &view{Page: name, Title: title, CSRF: v.csrf, ReadOnly: c.cfg.ReadOnly, Session: v.session,
		Ready: c.index.Ready(), Indexed: c.index.Len(), Version: c.cfg.Version, Now: time.Now(), TraceURL: c.cfg.TraceURL}
}

func (c *Console) fail(w http.ResponseWriter, err error) {
	if errors.Is(err, queue.ErrNotFound) {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	var bad badRequest
	if errors.As(err, &bad) {
		http.Error(w, string(bad), http.StatusBadRequest)
		return
	}
	c.log.Warn("console page failed", "err", err)
	http.Error(w, "the fleet cannot answer now; try again", http.StatusServiceUnavailable)
}

type badRequest string

func (b badRequest) Error() string { return string(b) }

// action serves a form POST: allowed, not read-only, with its CSRF token.
func (c *Console) action(do func(w http.ResponseWriter, r *http.Request) (string, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v := c.identify(w, r)
		switch {
		case !v.ok:
			http.Error(w, "log in first: a bearer token or a client certificate is required", http.StatusUnauthorized)
			return
		case c.cfg.ReadOnly:
			http.Error(w, "this console is read-only", http.StatusForbidden)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
		if !checkCSRF(r, v) {
			http.Error(w, "the form's CSRF token is missing or wrong: reload the page", http.StatusForbidden)
			return
		}
		to, err := do(w, r)
		if err != nil {
			c.fail(w, err)
			return
		}
		http.Redirect(w, r, to, http.StatusSeeOther)
	})
}

// Overview.

type poolRow struct {
	Pool    string
	Stats   PoolStats
	Lag     *queue.Lag
	Cap     *job.PoolCapacity
	Workers int
}

type overviewData struct {
	All      PoolStats
	Pools    []poolRow
	Cap      job.PoolCapacity
	CapError string
	CapOff   bool
}

func (c *Console) overview(_ context.Context, _ *http.Request, v *view) error {
	v.Data = c.overviewData(v.Now)
	return nil
}

func (c *Console) overviewData(now time.Time) *overviewData {
	stats := c.index.Stats(now)
	d := &overviewData{All: stats[0], CapOff: c.cfg.Capacity == nil}
	var lag map[string]queue.Lag
	if c.cfg.Lag != nil {
		lag = c.cfg.Lag()
	}
	_, caps, _, _, err := c.work.snapshot()
	if err != nil {
		d.CapError = err.Error()
	}
	rows := map[string]*poolRow{}
	row := func(p string) *poolRow {
		if rows[p] == nil {
			rows[p] = &poolRow{Pool: p, Stats: PoolStats{Pool: p, ByState: map[string]int{}, Minutes: nil}}
		}
		return rows[p]
	}
	for _, s := range stats[1:] {
		row(s.Pool).Stats = s
	}
	for p, l := range lag {
		l := l
		row(p).Lag = &l
	}
	for i := range caps {
		pc := caps[i]
		row(pc.Pool).Cap = &pc
		d.Cap.Workers += pc.Workers
		d.Cap.Slots.Total += pc.Slots.Total
		d.Cap.Slots.Used += pc.Slots.Used
		d.Cap.GPUs.Total += pc.GPUs.Total
		d.Cap.GPUs.Reserved += pc.GPUs.Reserved
	}
	names := make([]string, 0, len(rows))
	for p := range rows {
		names = append(names, p)
	}
	slices.Sort(names)
	for _, p := range names {
		d.Pools = append(d.Pools, *rows[p])
	}
	return d
}

// Jobs.

type jobsData struct {
	Page     Page
	Filter   url.Values
	States   []job.State
	Tenants  []string
	Pools    []string
	Older    string
	Newer    string
	FilterOn bool
}

const pageSize = 50

// Ranges of the jobs page's time filter.
var ranges = map[string]time.Duration{"15m": 15 * time.Minute, "1h": time.Hour, "6h": 6 * time.Hour,
	"24h": 24 * time.Hour, "7d": 7 * 24 * time.Hour}

func parseFilter(q url.Values, now time.Time) (Filter, error) {
	var f Filter
	for _, s := range q["state"] {
		if s == "" {
			continue
		}
		if stateIndex(job.State(s)) < 0 {
			return f, badRequest(fmt.Sprintf("%q is not a job state", s))
		}
		f.States = append(f.States, job.State(s))
	}
	f.Tenant = strings.TrimSpace(q.Get("tenant"))
	f.Pool = strings.TrimSpace(q.Get("pool"))
	f.ID = strings.TrimSpace(q.Get("id"))
	for _, kv := range strings.FieldsFunc(q.Get("label"), func(r rune) bool { return r == ',' || r == ' ' }) {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return f, badRequest(fmt.Sprintf("label %q: write key=value", kv))
		}
		if f.Labels == nil {
			f.Labels = map[string]string{}
		}
		f.Labels[k] = v
	}
	if r := q.Get("range"); r != "" {
		d, ok := ranges[r]
		if !ok {
			return f, badRequest(fmt.Sprintf("range %q: one of 15m, 1h, 6h, 24h, 7d", r))
		}
		f.Since = now.Add(-d)
	}
	for _, b := range []struct {
		name string
		to   *time.Time
	}{{"since", &f.Since}, {"until", &f.Until}} {
		s := q.Get(b.name)
		if s == "" {
			continue
		}
		t, err := parseWhen(s)
		if err != nil {
			return f, badRequest(fmt.Sprintf("%s %q: write 2006-01-02T15:04 (UTC) or RFC 3339", b.name, s))
		}
		*b.to = t
	}
	return f, nil
}

func parseWhen(s string) (time.Time, error) {
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, s, time.UTC); err == nil {
			return t, nil
		}
	}
	return time.Time{}, errors.New("not a time")
}

func (c *Console) jobs(_ context.Context, r *http.Request, v *view) error {
	q := r.URL.Query()
	f, err := parseFilter(q, v.Now)
	if err != nil {
		return err
	}
	before, _ := ParseCursor(q.Get("before"))
	after, _ := ParseCursor(q.Get("after"))
	d := &jobsData{Page: c.index.List(f, before, after, pageSize), States: states, Tenants: c.index.Tenants(),
		Pools: c.index.Pools()}
	base := url.Values{}
	for k, vs := range q {
		if k != "before" && k != "after" && k != "notice" && k != "page" && k != "every" {
			base[k] = vs
		}
	}
	d.Filter = base
	d.FilterOn = len(base) > 0
	link := func(key string, cur Cursor) string {
		if cur.Key.ID == "" {
			return ""
		}
		l := url.Values{}
		for k, vs := range base {
			l[k] = vs
		}
		l.Set(key, cur.String())
		return "/ui/jobs?" + l.Encode()
	}
	d.Older, d.Newer = link("before", d.Page.Older), link("after", d.Page.Newer)
	v.Data = d
	return nil
}

// Job.

type jobData struct {
	Key    queue.JobKey
	Path   string // the job's page
	D      *jobDetail
	Trace  string
	Cancel bool // cancel applies
	Retry  bool // retry applies: the job was dead-lettered
	// Usage is what the running attempt uses, from its worker's heartbeat;
	// empty when it does not run or its backend cannot tell.
	Usage string
}

// jobKey reads a job's place from a request's path or query.
func jobKey(get func(string) string) (queue.JobKey, error) {
	return parseKey(get("tenant"), get("pool"), get("id"))
}

func parseKey(tenant, pool, id string) (queue.JobKey, error) {
	k := queue.JobKey{Tenant: tenant, Pool: pool, ID: id}
	if !job.ValidTenant(k.Tenant) || !job.ValidPool(k.Pool) || !job.ValidID(k.ID) {
		return k, fmt.Errorf("%w: %q/%q/%q", queue.ErrNotFound, k.Tenant, k.Pool, k.ID)
	}
	return k, nil
}

func (c *Console) jobPage(ctx context.Context, r *http.Request, v *view) error {
	k, err := jobKey(r.PathValue)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	fl, err := c.openJob(ctx, k, false)
	if err != nil {
		return err
	}
	c.fillJob(fl, v)
	return nil
}

// defaultTenantJob sends /ui/jobs/{id}, the page of a job before tenants,
// to the page of the default tenant's job of that id.
func (c *Console) defaultTenantJob(w http.ResponseWriter, r *http.Request) {
	if v := c.identify(w, r); !v.ok {
		http.Redirect(w, r, "/ui/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
		return
	}
	id := r.PathValue("id")
	k, ok := c.index.Find(job.DefaultTenant, id)
	if !ok && c.cfg.Status != nil && job.ValidID(id) {
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		if s, err := c.cfg.Status(ctx, job.DefaultTenant, id); err == nil && s.Job != nil {
			k, ok = queue.Key(s.Job), true
		}
	}
	if !ok {
		c.fail(w, fmt.Errorf("%w: %q", queue.ErrNotFound, id))
		return
	}
	to := jobPath(k)
	if r.URL.RawQuery != "" {
		to += "?" + r.URL.RawQuery
	}
	http.Redirect(w, r, to, http.StatusSeeOther)
}

func (c *Console) fillJob(fl *follow, v *view) {
	d := c.detail(fl)
	k := fl.key
	v.Title = "Job " + k.ID
	if k.Tenant != job.DefaultTenant {
		v.Title += " · " + k.Tenant
	}
	jd := &jobData{Key: k, Path: jobPath(k), D: d}
	if c.cfg.TraceURL != "" && d.Record.TraceID != "" {
		jd.Trace = strings.ReplaceAll(c.cfg.TraceURL, "{trace_id}", url.PathEscape(d.Record.TraceID))
	}
	st := d.Record.State
	jd.Cancel = !st.Final() && st != job.StateRejected && !d.Record.CancelRequested
	jd.Retry = (st == job.StateFailed || st == job.StateTimedOut) && (d.Record.DeadLettered || c.dead.find(k) != nil)
	if st == job.StateRunning && c.work != nil {
		live, _, _, _, _ := c.work.snapshot()
		jd.Usage = usageOf(live, d.Record)
	}
	v.Data = jd
}

// usageOf describes what a running job's attempt uses, as its worker's
// heartbeat says.
func usageOf(live []*job.Heartbeat, rec *job.Record) string {
	for _, hb := range live {
		if hb.WorkerID != rec.WorkerID {
			continue
		}
		for _, r := range hb.Running {
			if r.JobID != rec.ID || cmp.Or(r.Tenant, job.DefaultTenant) != cmp.Or(rec.Tenant, job.DefaultTenant) ||
				r.Attempt != rec.Attempt || r.Usage == nil {
				continue
			}
			u := r.Usage
			var parts []string
			if u.CPUPercent != nil {
				parts = append(parts, fmt.Sprintf("cpu %.0f%%", *u.CPUPercent))
			}
			if u.MemoryBytes != nil {
				m := "memory " + job.FormatMemory(*u.MemoryBytes/(1<<20)*(1<<20))
				if u.MemoryLimitBytes != nil {
					m += " of " + job.FormatMemory(*u.MemoryLimitBytes/(1<<20)*(1<<20))
				}
				parts = append(parts, m)
			}
			if u.Pids != nil {
				parts = append(parts, fmt.Sprintf("%d processes", *u.Pids))
			}
			return strings.Join(parts, " · ")
		}
	}
	return ""
}

// Workers.

type workersData struct {
	Live   []*job.Heartbeat
	Pools  []job.PoolCapacity
	Lost   []capacity.LostWorker
	Read   time.Time
	Err    string
	Off    bool
	Expire time.Duration
}

func (c *Console) workersPage(_ context.Context, _ *http.Request, v *view) error {
	live, pools, lost, read, err := c.work.snapshot()
	d := &workersData{Live: live, Pools: pools, Lost: lost, Read: read, Off: c.cfg.Capacity == nil,
		Expire: 3 * c.cfg.HeartbeatInterval}
	if err != nil {
		d.Err = err.Error()
	}
	v.Data = d
	return nil
}

// Dead letters.

type dlqRow struct {
	*deadLetter
	Path    string // the job's page
	Retries []Row
}

type dlqData struct {
	Pool, Tenant string
	Rows         []dlqRow
	Counts       map[string]int
	Pools        []string
	Tenants      []string
	Total        int
	Shown        int
}

const dlqPage = 200

func (c *Console) dlqPage(_ context.Context, r *http.Request, v *view) error {
	q := r.URL.Query()
	pool, tenant := q.Get("pool"), q.Get("tenant")
	list, counts, tenants := c.dead.of(pool, tenant)
	d := &dlqData{Pool: pool, Tenant: tenant, Counts: counts, Tenants: tenants, Shown: min(len(list), dlqPage)}
	for p, n := range counts {
		d.Pools = append(d.Pools, p)
		d.Total += n
	}
	slices.Sort(d.Pools)
	for _, dl := range list[:d.Shown] {
		row := dlqRow{deadLetter: dl, Path: jobPath(dl.key())}
		for k := 1; k <= 100; k++ {
			rk := dl.key()
			rk.ID = job.RetryID(dl.JobID, k)
			retry, _, ok := c.index.Job(rk)
			if !ok {
				break
			}
			row.Retries = append(row.Retries, retry)
		}
		d.Rows = append(d.Rows, row)
	}
	v.Data = d
	return nil
}
