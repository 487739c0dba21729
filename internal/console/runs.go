package console

// The runs pages: a tenant's runs, newest first, and a run's page, which
// draws the run's graph (see graph.go), with cancel and retry as the
// run's tenant.
//
// A run is read through the dispatcher (Config.RunStatus) when a page
// first shows it, and again only when a message about its round comes
// (its cancel, a retry, its summary: the runs' live subjects, which the
// console follows), or once its read is runFresh old. Between reads its
// nodes' states come from the index, which follows every job, so that an
// open page of a run of 10,000 nodes costs no read through the
// dispatcher at each update, only a look-up of its nodes' jobs.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

const (
	// runFresh is how long a run's read, or a tenant's list of runs, is
	// shown without a message about it before it is read again: what a
	// message missed (the console's connection was away) is read then.
	runFresh = 30 * time.Second
	// maxKeptNodes and maxKeptRuns bound the runs the console keeps read;
	// the least recently shown go first.
	maxKeptNodes = 200_000
	maxKeptRuns  = 5000
	// maxKeptLists bounds the tenants whose lists of runs are kept.
	maxKeptLists = 1000
	// runsPageSize is the runs a page of the list shows.
	runsPageSize = 25
	// runReaders bounds the runs a list reads side by side.
	runReaders = 4
	// maxFailedShown bounds the nodes that did not succeed listed under
	// a run drawn by layers.
	maxFailedShown = 100
)

type runKey struct{ tenant, id string }

// runBook keeps the runs read through the dispatcher, and each tenant's
// list of runs, shared by every page, and marks them stale as messages
// about them come.
type runBook struct {
	status func(ctx context.Context, tenant, id string) (*job.RunView, error)
	list   func(ctx context.Context, tenant string) (*job.RunList, error)

	mu    sync.Mutex
	runs  map[runKey]*runEntry
	lists map[string]*runIDs // by tenant
	nodes int                // the nodes of the runs kept
	subs  []*nats.Subscription

	// version moves with every message about a run's round, and with
	// every new run.
	version atomic.Uint64
}

// runEntry is a run as last read.
type runEntry struct {
	changed atomic.Uint64 // moves with every message about its round
	used    atomic.Int64  // when a page last showed it, Unix nanoseconds
	size    int           // its nodes, under runBook.mu

	mu     sync.Mutex // held while reading: one read at a time
	view   *job.RunView
	layout *layout
	read   time.Time
	seen   uint64 // changed, when read
}

// runIDs is a tenant's list of runs as last read.
type runIDs struct {
	changed atomic.Uint64 // moves with every new run of the tenant

	mu   sync.Mutex
	ids  []string // oldest first
	read time.Time
	seen uint64
	err  error
}

func newRunBook(cfg Config) *runBook {
	return &runBook{status: cfg.RunStatus, list: cfg.ListRuns, runs: map[runKey]*runEntry{}, lists: map[string]*runIDs{}}
}

// follow subscribes to the live copies of the messages that change a
// run's round or state, and of the new runs' definitions.
func (b *runBook) follow(nc *nats.Conn, names queue.Names) error {
	for _, subject := range names.AllRunRoundsLive() {
		sub, err := nc.Subscribe(subject, func(m *nats.Msg) { b.receive(names, m.Subject) })
		if err != nil {
			b.stop()
			return fmt.Errorf("follow the runs: %w", err)
		}
		b.mu.Lock()
		b.subs = append(b.subs, sub)
		b.mu.Unlock()
	}
	return nil
}

func (b *runBook) stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, s := range b.subs {
		_ = s.Unsubscribe()
	}
	b.subs = nil
}

// receive marks what a message on subject makes stale.
func (b *runBook) receive(names queue.Names, subject string) {
	rm, ok := names.ParseRunLive(subject)
	if !ok || rm.What == "node" {
		return
	}
	b.mu.Lock()
	e := b.runs[runKey{rm.Tenant, rm.Run}]
	l := b.lists[rm.Tenant]
	b.mu.Unlock()
	if e != nil {
		e.changed.Add(1)
	}
	if l != nil && rm.What == "def" {
		l.changed.Add(1)
	}
	b.version.Add(1)
}

// forget makes the next view of a run read it again: an action's page
// shows what the action did.
func (b *runBook) forget(tenant, id string) {
	b.mu.Lock()
	e := b.runs[runKey{tenant, id}]
	b.mu.Unlock()
	if e != nil {
		e.changed.Add(1)
	}
	b.version.Add(1)
}

// view returns a run and its layout as last read, reading the run again
// when a message about its round came since, or when the read is
// runFresh old. The view is shared: it is not to be changed.
func (b *runBook) view(ctx context.Context, tenant, id string) (*job.RunView, *layout, error) {
	k := runKey{tenant, id}
	b.mu.Lock()
	e := b.runs[k]
	if e == nil {
		e = &runEntry{}
		b.runs[k] = e
	}
	b.mu.Unlock()
	e.used.Store(time.Now().UnixNano())
	e.mu.Lock()
	defer e.mu.Unlock()
	seen := e.changed.Load()
	if e.view != nil && e.seen == seen && time.Since(e.read) < runFresh {
		return e.view, e.layout, nil
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	v, err := b.status(rctx, tenant, id)
	if err == nil && v == nil {
		err = fmt.Errorf("%w: run %s", queue.ErrNotFound, id)
	}
	if err != nil {
		if e.view == nil {
			b.mu.Lock()
			if b.runs[k] == e {
				delete(b.runs, k)
			}
			b.mu.Unlock()
		}
		return nil, nil, fmt.Errorf("read run %s of %s: %w", id, tenant, err)
	}
	// The graph of a run never changes: its layout is made once.
	if e.layout == nil || len(e.layout.Layer) != len(v.Nodes) {
		e.layout = layOut(v.Nodes)
	}
	e.view, e.read, e.seen = v, time.Now(), seen
	b.mu.Lock()
	if b.runs[k] == e {
		b.nodes += len(v.Nodes) - e.size
		e.size = len(v.Nodes)
	}
	b.evict(e)
	b.mu.Unlock()
	return e.view, e.layout, nil
}

// evict forgets the runs least recently shown, but keep, while more than
// maxKeptNodes nodes or maxKeptRuns runs are kept. The caller holds mu.
func (b *runBook) evict(keep *runEntry) {
	if b.nodes <= maxKeptNodes && len(b.runs) <= maxKeptRuns {
		return
	}
	type aged struct {
		k    runKey
		used int64
	}
	all := make([]aged, 0, len(b.runs))
	for k, e := range b.runs {
		if e != keep {
			all = append(all, aged{k, e.used.Load()})
		}
	}
	slices.SortFunc(all, func(a, b aged) int { return cmp.Compare(a.used, b.used) })
	// Down to nine tenths, so that the next runs read do not each sort.
	for _, a := range all {
		if b.nodes <= maxKeptNodes*9/10 && len(b.runs) <= maxKeptRuns*9/10 {
			break
		}
		b.nodes -= b.runs[a.k].size
		delete(b.runs, a.k)
	}
}

// ids returns a tenant's runs, oldest first, as last listed, listing them
// again when a run of the tenant was defined since, or when the list is
// runFresh old (runs leave with the stream's retention); at most once
// every snapshotEvery.
func (b *runBook) ids(ctx context.Context, tenant string) ([]string, error) {
	b.mu.Lock()
	l := b.lists[tenant]
	if l == nil {
		if len(b.lists) >= maxKeptLists {
			clear(b.lists) // read again as asked
		}
		l = &runIDs{}
		b.lists[tenant] = l
	}
	b.mu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	seen := l.changed.Load()
	age := time.Since(l.read)
	if !l.read.IsZero() && (age < snapshotEvery || (l.seen == seen && age < runFresh)) {
		return l.ids, l.err
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	list, err := b.list(rctx, tenant)
	l.read, l.seen = time.Now(), seen
	if err != nil {
		l.err = fmt.Errorf("list the runs of %s: %w", tenant, err)
		return l.ids, l.err
	}
	l.ids, l.err = list.Runs, nil
	return l.ids, nil
}

// liveNodes returns v's nodes with each one's state as the index holds
// its job now: a node that had ended when the run was read keeps its
// end; a node waiting then takes its job's state once it has one; a
// waiting node waits for those of the nodes it comes after that have not
// ended.
func (c *Console) liveNodes(v *job.RunView, l *layout) []job.NodeView {
	keys := make([]queue.JobKey, len(v.Nodes))
	for i, nd := range v.Nodes {
		keys[i] = queue.JobKey{Tenant: v.Tenant, Pool: nd.Pool, ID: nd.JobID}
	}
	st := c.index.states(keys)
	out := slices.Clone(v.Nodes)
	for i := range out {
		if s := st[i]; s.ok && !out[i].State.Final() {
			out[i].State, out[i].Code = s.state, s.code
		}
	}
	for i := range out {
		nd := &out[i]
		nd.WaitingFor = nil
		if nd.State != job.NodeWaiting {
			continue
		}
		for _, p := range l.Parents[i] {
			if !out[p].State.Final() {
				nd.WaitingFor = append(nd.WaitingFor, out[p].ID)
			}
		}
	}
	return out
}

// runPath is the page of a run: /ui/runs/<tenant>/<id>.
func runPath(tenant, id string) string {
	return "/ui/runs/" + url.PathEscape(tenant) + "/" + url.PathEscape(id)
}

// runJobsPath lists a run's jobs on the jobs page: their ids start with
// the run's and a colon.
func runJobsPath(tenant, id string) string {
	return "/ui/jobs?" + url.Values{"tenant": {tenant}, "id": {id + ":"}}.Encode()
}

// A run's page.

// nodeRow is a node listed under a run drawn by layers.
type nodeRow struct {
	job.NodeView
	Path string // its job's page
}

type runData struct {
	Tenant, ID string
	Path       string // the run's page
	JobsPath   string // its jobs on the jobs page
	View       *job.RunView
	Nodes      []job.NodeView // as they stand now
	Counts     []stateCount
	Layers     int
	Edges      int
	Graph      template.HTML
	// Summarised: the run is drawn by layers, its nodes counted.
	Summarised bool
	MaxNodes   int
	MaxEdges   int
	// Failed lists, for a run drawn by layers, its nodes that did not
	// succeed, at most maxFailedShown of the More.
	Failed []nodeRow
	More   int
	Cancel bool // cancel applies
	Retry  bool // retry applies
	// sum tells one drawing of the page from another, for its stream.
	sum uint64
}

func (c *Console) runPage(ctx context.Context, r *http.Request, v *view) error {
	d, err := c.runData(ctx, r.PathValue("tenant"), r.PathValue("id"))
	if err != nil {
		return err
	}
	c.fillRun(d, v)
	return nil
}

func (c *Console) fillRun(d *runData, v *view) {
	v.Title = "Run " + d.ID
	if d.Tenant != job.DefaultTenant {
		v.Title += " · " + d.Tenant
	}
	v.Data = d
}

// runData is what a run's page shows now.
func (c *Console) runData(ctx context.Context, tenant, id string) (*runData, error) {
	if !job.ValidTenant(tenant) || !job.ValidRunID(id) {
		return nil, fmt.Errorf("%w: run %q/%q", queue.ErrNotFound, tenant, id)
	}
	if c.cfg.RunStatus == nil {
		return nil, fmt.Errorf("%w: this console cannot read runs", queue.ErrNotFound)
	}
	rv, l, err := c.runs.view(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	nodes := c.liveNodes(rv, l)
	d := &runData{Tenant: tenant, ID: id, Path: runPath(tenant, id), JobsPath: runJobsPath(tenant, id), View: rv, Nodes: nodes,
		Counts: countStates(nodes, nil), Layers: len(l.Layers), Edges: len(l.Edges), Summarised: l.summarised(),
		MaxNodes: maxDrawnNodes, MaxEdges: maxDrawnEdges}
	d.Cancel = !rv.State.Final() && !rv.CancelRequested && c.cfg.CancelRun != nil
	d.Retry = rv.State.Final() && rv.State != job.RunSucceeded && c.cfg.RetryRun != nil
	path := func(nd job.NodeView) string {
		return jobPath(queue.JobKey{Tenant: tenant, Pool: nd.Pool, ID: nd.JobID})
	}
	if d.Summarised {
		d.Graph = drawBands(l, nodes)
		for _, nd := range nodes {
			if !nd.State.Final() || nd.State == job.StateSucceeded {
				continue
			}
			if len(d.Failed) < maxFailedShown {
				d.Failed = append(d.Failed, nodeRow{NodeView: nd, Path: path(nd)})
			} else {
				d.More++
			}
		}
	} else {
		d.Graph = drawNodes(l, nodes, path)
	}
	d.sum = runSum(rv, nodes)
	return d, nil
}

// runSum sums up what a run's page shows of the run, to tell when its
// stream has something new to send.
func runSum(v *job.RunView, nodes []job.NodeView) uint64 {
	h := newSum()
	h.add(fmt.Sprintf("%s %d %t %v", v.State, v.Round, v.CancelRequested, v.FinishedAt))
	for _, nd := range nodes {
		h.add(string(nd.State))
		h.add(string(nd.Code))
		h.add(nd.JobID)
		h.addInt(len(nd.WaitingFor))
	}
	return uint64(h)
}

// sum is an FNV-1a hash of strings, each ended by a zero byte, without
// the allocations of hash.Hash64's Write.
type sum uint64

func newSum() sum { return 14695981039346656037 }

func (s *sum) add(str string) {
	for i := 0; i < len(str); i++ {
		*s = (*s ^ sum(str[i])) * 1099511628211
	}
	*s *= 1099511628211
}

func (s *sum) addInt(n int) {
	for range 8 {
		*s = (*s ^ sum(n&0xff)) * 1099511628211
		n >>= 8
	}
}

// The list of runs.

// runRow is one run in the list.
type runRow struct {
	ID, Path        string
	State           job.RunState
	Round           int
	Nodes           int
	Counts          []stateCount
	Submitted       time.Time
	Finished        *time.Time
	CancelRequested bool
	Err             string // the run could not be read
}

type runsData struct {
	Off     bool // the console was given no way to read runs
	Tenant  string
	Tenants []string
	Rows    []runRow
	Total   int
	Older   string
	Newer   string
	Err     string
	sum     uint64
}

func (c *Console) runsPage(ctx context.Context, r *http.Request, v *view) error {
	d, err := c.runsData(ctx, r.URL.Query())
	if err != nil {
		return err
	}
	v.Data = d
	if d.Tenant != job.DefaultTenant {
		v.Title = "Runs · " + d.Tenant
	}
	return nil
}

// runsData is a page of a tenant's runs, newest first: the tenant query's
// (the default tenant's without one), from the run before the query's
// before, or after its after.
func (c *Console) runsData(ctx context.Context, q url.Values) (*runsData, error) {
	tenant := cmp.Or(strings.TrimSpace(q.Get("tenant")), job.DefaultTenant)
	if !job.ValidTenant(tenant) {
		return nil, badRequest(fmt.Sprintf("tenant %q: 1 to 64 characters of [A-Za-z0-9_-]", tenant))
	}
	d := &runsData{Off: c.cfg.ListRuns == nil || c.cfg.RunStatus == nil, Tenant: tenant, Tenants: c.index.Tenants()}
	if !slices.Contains(d.Tenants, tenant) {
		d.Tenants = append(d.Tenants, tenant)
		slices.Sort(d.Tenants)
	}
	if d.Off {
		return d, nil
	}
	ids, err := c.runs.ids(ctx, tenant)
	if err != nil {
		d.Err = err.Error()
	}
	newest := slices.Clone(ids)
	slices.Reverse(newest)
	d.Total = len(newest)
	from := 0
	if b := q.Get("before"); b != "" {
		if i := slices.Index(newest, b); i >= 0 {
			from = i + 1
		}
	} else if a := q.Get("after"); a != "" {
		if i := slices.Index(newest, a); i >= 0 {
			from = max(0, i-runsPageSize)
		}
	}
	shown := newest[min(from, len(newest)):min(from+runsPageSize, len(newest))]
	link := func(key, id string) string {
		return "/ui/runs?" + url.Values{"tenant": {tenant}, key: {id}}.Encode()
	}
	if from > 0 && len(shown) > 0 {
		d.Newer = link("after", shown[0])
	}
	if from+len(shown) < len(newest) && len(shown) > 0 {
		d.Older = link("before", shown[len(shown)-1])
	}
	d.Rows = make([]runRow, len(shown))
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(runReaders, len(shown)) {
		wg.Go(func() {
			for i := range next {
				d.Rows[i] = c.runRow(ctx, tenant, shown[i])
			}
		})
	}
	for i := range shown {
		next <- i
	}
	close(next)
	wg.Wait()
	h := newSum()
	h.add(fmt.Sprintf("%s %d %s", d.Err, d.Total, strings.Join(shown, ",")))
	for _, r := range d.Rows {
		h.add(fmt.Sprintf("%s %d %t %v %s", r.State, r.Round, r.CancelRequested, r.Counts, r.Err))
	}
	d.sum = uint64(h)
	return d, nil
}

// runRow reads a run for the list: its nodes counted by state as they
// stand now (an ended run's as its read says: they do not move).
func (c *Console) runRow(ctx context.Context, tenant, id string) runRow {
	row := runRow{ID: id, Path: runPath(tenant, id)}
	v, l, err := c.runs.view(ctx, tenant, id)
	if err != nil {
		if errors.Is(err, queue.ErrNotFound) {
			row.Err = "no longer kept"
		} else {
			row.Err = err.Error()
		}
		return row
	}
	nodes := v.Nodes
	if !v.State.Final() {
		nodes = c.liveNodes(v, l)
	}
	row.State, row.Round, row.Nodes, row.Counts = v.State, v.Round, len(v.Nodes), countStates(nodes, nil)
	row.Submitted, row.Finished, row.CancelRequested = v.SubmittedAt, v.FinishedAt, v.CancelRequested
	return row
}

// Actions, as the run's tenant.

func (c *Console) cancelRun(_ http.ResponseWriter, r *http.Request) (string, error) {
	return c.runAction(r, "cancel", c.cfg.CancelRun)
}

func (c *Console) retryRun(_ http.ResponseWriter, r *http.Request) (string, error) {
	return c.runAction(r, "retry", c.cfg.RetryRun)
}

func (c *Console) runAction(r *http.Request, action string, do func(ctx context.Context, tenant, id string) (*job.RunReply, error)) (string, error) {
	tenant, id := r.PathValue("tenant"), r.PathValue("id")
	if do == nil {
		return "", badRequest("this console cannot " + action + " runs")
	}
	if !job.ValidTenant(tenant) || !job.ValidRunID(id) {
		return "", fmt.Errorf("%w: run %q/%q", queue.ErrNotFound, tenant, id)
	}
	ctx, cancel := context.WithTimeout(r.Context(), 20*time.Second)
	defer cancel()
	reply, err := do(ctx, tenant, id)
	if err != nil {
		return "", fmt.Errorf("%s run %s of %s: %w", action, id, tenant, err)
	}
	c.runs.forget(tenant, id)
	c.m.actions.Add(ctx, 1, metric.WithAttributes(attribute.String("action", action+"_run")))
	c.log.Info("console: "+action+" a run", "tenant", tenant, "run", id, "round", reply.Round, "message", reply.Message)
	return runPath(tenant, id) + "?notice=" + url.QueryEscape(reply.Message), nil
}
