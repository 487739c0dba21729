package console

import (
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// Listing the index: filters, cursors and pages.

// Filter selects jobs in a list.
type Filter struct {
	Tenant string
	States []job.State
	Pool   string
	// Labels must all match (key=value).
	Labels map[string]string
	// ID matches a job id exactly or, failing that, as a prefix.
	ID string
	// Since and Until bound the submission time (Until excluded).
	Since, Until time.Time
}

func (f *Filter) none() bool {
	return f.Tenant == "" && len(f.States) == 0 && f.Pool == "" && f.ID == "" && len(f.Labels) == 0
}

// Cursor is a position in the list: a job's submission time and place.
type Cursor struct {
	At  int64
	Key queue.JobKey
}

func (c Cursor) String() string {
	if c.Key.ID == "" {
		return ""
	}
	return strconv.FormatInt(c.At, 36) + "." + c.Key.Tenant + "." + c.Key.Pool + "." + c.Key.ID
}

// ParseCursor reads a Cursor written by String (tenants and pools have no
// dots; ids may).
func ParseCursor(s string) (Cursor, bool) {
	parts := strings.SplitN(s, ".", 4)
	if len(parts) != 4 || parts[3] == "" {
		return Cursor{}, false
	}
	n, err := strconv.ParseInt(parts[0], 36, 64)
	if err != nil {
		return Cursor{}, false
	}
	return Cursor{At: n, Key: queue.JobKey{Tenant: parts[1], Pool: parts[2], ID: parts[3]}}, true
}

func (c Cursor) entry() *entry { return &entry{submitted: c.At, key: c.Key} }

// Page is one page of a list, newest first.
type Page struct {
	Rows []Row
	// Total counts every job that matches the filter.
	Total int
	// Newer and Older are the cursors of the neighbouring pages, empty at
	// either end.
	Newer, Older Cursor
}

// Row is one job in a list.
type Row struct {
	Tenant, Pool, ID   string
	Priority           int
	Worker             string
	State              job.State
	Attempt, Max       int
	Submitted, Started time.Time
	Finished           time.Time
	ExitCode           *int
	Failure            *job.Failure
	Labels             map[string]string
	CancelRequested    bool
}

// Path is the job's page.
func (r Row) Path() string { return jobPath(queue.JobKey{Tenant: r.Tenant, Pool: r.Pool, ID: r.ID}) }

// Key is the job's place.
func (r Row) Key() queue.JobKey { return queue.JobKey{Tenant: r.Tenant, Pool: r.Pool, ID: r.ID} }

// jobPath is the page of a job: /ui/jobs/<tenant>/<pool>/<id>.
func jobPath(k queue.JobKey) string {
	return "/ui/jobs/" + url.PathEscape(k.Tenant) + "/" + url.PathEscape(k.Pool) + "/" + url.PathEscape(k.ID)
}

func (e *entry) row() Row {
	r := Row{Tenant: e.key.Tenant, Pool: e.key.Pool, ID: e.key.ID, Priority: e.priority, Worker: e.worker, State: e.state,
		Attempt: e.attempt, Max: e.maxAttempts, Submitted: time.Unix(0, e.submitted), Failure: e.failure,
		CancelRequested: e.cancelReq}
	if len(e.labels) > 0 {
		r.Labels = make(map[string]string, len(e.labels))
		for _, l := range e.labels {
			r.Labels[l.K] = l.V
		}
	}
	if e.started != 0 {
		r.Started = time.Unix(0, e.started)
	}
	if e.finished != 0 {
		r.Finished = time.Unix(0, e.finished)
	}
	if e.hasExit {
		c := e.exitCode
		r.ExitCode = &c
	}
	return r
}

func (e *entry) label(k string) (string, bool) {
	i, found := slices.BinarySearchFunc(e.labels, k, func(l label, k string) int { return strings.Compare(l.K, k) })
	if !found {
		return "", false
	}
	return e.labels[i].V, true
}

func (f *Filter) match(e *entry) bool {
	if f.Tenant != "" && e.key.Tenant != f.Tenant {
		return false
	}
	if f.Pool != "" && e.key.Pool != f.Pool {
		return false
	}
	if len(f.States) > 0 && !slices.Contains(f.States, e.state) {
		return false
	}
	if f.ID != "" && !strings.HasPrefix(e.key.ID, f.ID) {
		return false
	}
	for k, v := range f.Labels {
		if got, ok := e.label(k); !ok || got != v {
			return false
		}
	}
	return true
}

// exact returns the jobs whose id is f.ID, in f's tenant and pool if it
// names them.
func (ix *Index) exact(f Filter) []*entry {
	var out []*entry
	for t := range ix.tenants {
		if f.Tenant != "" && t != f.Tenant {
			continue
		}
		for p := range ix.pools {
			if f.Pool != "" && p != f.Pool {
				continue
			}
			if e := ix.byKey[queue.JobKey{Tenant: t, Pool: p, ID: f.ID}]; e != nil {
				out = append(out, e)
			}
		}
	}
	slices.SortFunc(out, func(a, b *entry) int { return cmpEntry(b, a) })
	return out
}

// List returns a page of at most limit jobs matching f, newest first:
// the newest ones, those older than before, or those newer than after.
// It scans the jobs submitted within f's time range once, so that it stays
// fast whatever the page.
func (ix *Index) List(f Filter, before, after Cursor, limit int) Page {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	var page Page
	if f.ID != "" {
		if exact := ix.exact(f); len(exact) > 0 {
			rest := f
			rest.ID = ""
			for _, e := range exact {
				if rest.match(e) && inRange(e, f) && len(page.Rows) < limit {
					page.Rows = append(page.Rows, e.row())
				}
			}
			page.Total = len(page.Rows)
			return page
		}
	}
	lo, hi := 0, len(ix.order)
	if !f.Since.IsZero() {
		lo, _ = slices.BinarySearchFunc(ix.order, f.Since.UnixNano(), func(e *entry, t int64) int { return cmpInt(e.submitted, t) })
	}
	if !f.Until.IsZero() {
		hi, _ = slices.BinarySearchFunc(ix.order, f.Until.UnixNano(), func(e *entry, t int64) int { return cmpInt(e.submitted, t) })
	}
	if hi < lo {
		hi = lo
	}
	window := ix.order[lo:hi]
	// pos is where the cursor sorts in window.
	pos := func(c Cursor) int {
		i, _ := slices.BinarySearchFunc(window, c.entry(), cmpEntry)
		return i
	}
	unfiltered := f.none()
	var rows []*entry
	switch {
	case after.Key.ID != "":
		// The page just newer than after: walk up from it, then show newest first.
		start := pos(after)
		if start < len(window) && window[start].key == after.Key {
			start++
		}
		for i := start; i < len(window) && len(rows) < limit; i++ {
			if unfiltered || f.match(window[i]) {
				rows = append(rows, window[i])
			}
		}
		slices.Reverse(rows)
	default:
		end := len(window)
		if before.Key.ID != "" {
			end = pos(before)
		}
		for i := end - 1; i >= 0 && len(rows) < limit; i-- {
			if unfiltered || f.match(window[i]) {
				rows = append(rows, window[i])
			}
		}
	}
	if unfiltered {
		page.Total = len(window)
	} else {
		for _, e := range window {
			if f.match(e) {
				page.Total++
			}
		}
	}
	page.Rows = make([]Row, len(rows))
	for i, e := range rows {
		page.Rows[i] = e.row()
	}
	if len(rows) > 0 {
		first, last := rows[0], rows[len(rows)-1]
		// Is there anything newer than the first row, older than the last?
		for i := pos(Cursor{At: first.submitted, Key: first.key}) + 1; i < len(window); i++ {
			if unfiltered || f.match(window[i]) {
				page.Newer = Cursor{At: first.submitted, Key: first.key}
				break
			}
		}
		for i := pos(Cursor{At: last.submitted, Key: last.key}) - 1; i >= 0; i-- {
			if unfiltered || f.match(window[i]) {
				page.Older = Cursor{At: last.submitted, Key: last.key}
				break
			}
		}
	}
	return page
}

func inRange(e *entry, f Filter) bool {
	if !f.Since.IsZero() && e.submitted < f.Since.UnixNano() {
		return false
	}
	return f.Until.IsZero() || e.submitted < f.Until.UnixNano()
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Job returns the summary of one job, and the sequence of the version it
// comes from.
func (ix *Index) Job(k queue.JobKey) (Row, uint64, bool) {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	e := ix.byKey[k]
	if e == nil {
		return Row{}, 0, false
	}
	return e.row(), e.rev, true
}

// Has reports whether the index holds a job.
func (ix *Index) Has(k queue.JobKey) bool {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return ix.byKey[k] != nil
}

// Find returns the place of a tenant's job id: in whichever pool has it,
// the most recently submitted when several do.
func (ix *Index) Find(tenant, id string) (queue.JobKey, bool) {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	if found := ix.exact(Filter{Tenant: tenant, ID: id}); len(found) > 0 {
		return found[0].key, true
	}
	return queue.JobKey{}, false
}

// Pools lists the pools the index has seen jobs of.
func (ix *Index) Pools() []string {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	out := make([]string, 0, len(ix.pools))
	for name, p := range ix.pools {
		if p.total() > 0 {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// Tenants lists the tenants the index holds jobs of.
func (ix *Index) Tenants() []string {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	out := make([]string, 0, len(ix.tenants))
	for t := range ix.tenants {
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}

func sortStrings(s []string) { slices.Sort(s) }

// jobState is what a run's page needs of a job the index holds.
type jobState struct {
	state job.State
	code  job.FailureCode // its failure's, once it ended without succeeding
	ok    bool            // the index holds the job
}

// states returns the state of each job of keys, under one lock.
func (ix *Index) states(keys []queue.JobKey) []jobState {
	out := make([]jobState, len(keys))
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	for i, k := range keys {
		e := ix.byKey[k]
		if e == nil {
			continue
		}
		out[i] = jobState{state: e.state, ok: true}
		if e.failure != nil && e.state.Final() && e.state != job.StateSucceeded {
			out[i].code = e.failure.Code
		}
	}
	return out
}
