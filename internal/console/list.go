package console

import (
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fleet-dev/fleet/job"
)

// Listing the index: filters, cursors and pages.

// Filter selects jobs in a list.
type Filter struct {
	States []job.State
	Pool   string
	// Labels must all match (key=value).
	Labels map[string]string
	// ID matches a job id exactly or, failing that, as a prefix.
	ID string
	// Since and Until bound the submission time (Until excluded).
	Since, Until time.Time
}

// Cursor is a position in the list: a job's submission time and id.
type Cursor struct {
	At int64
	ID string
}

func (c Cursor) String() string {
	if c.ID == "" {
		return ""
	}
	return strconv.FormatInt(c.At, 36) + "." + c.ID
}

// ParseCursor reads a Cursor written by String.
func ParseCursor(s string) (Cursor, bool) {
	at, id, ok := strings.Cut(s, ".")
	if !ok || id == "" {
		return Cursor{}, false
	}
	n, err := strconv.ParseInt(at, 36, 64)
	if err != nil {
		return Cursor{}, false
	}
	return Cursor{At: n, ID: id}, true
}

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
	ID, Pool, Worker   string
	State              job.State
	Attempt, Max       int
	Submitted, Started time.Time
	Finished           time.Time
	ExitCode           *int
	Failure            *job.Failure
	Labels             map[string]string
	CancelRequested    bool
}

func (e *entry) row() Row {
	r := Row{ID: e.id, Pool: e.pool, Worker: e.worker, State: e.state, Attempt: e.attempt, Max: e.maxAttempts,
		Submitted: time.Unix(0, e.submitted), Failure: e.failure, Labels: e.labels, CancelRequested: e.cancelReq}
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

func (f *Filter) match(e *entry) bool {
	if f.Pool != "" && e.pool != f.Pool {
		return false
	}
	if len(f.States) > 0 && !slices.Contains(f.States, e.state) {
		return false
	}
	if f.ID != "" && !strings.HasPrefix(e.id, f.ID) {
		return false
	}
	for k, v := range f.Labels {
		if got, ok := e.labels[k]; !ok || got != v {
			return false
		}
	}
	return true
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
		if e := ix.byID[f.ID]; e != nil {
			exact := f
			exact.ID = ""
			if exact.match(e) && inRange(e, f) {
				page.Rows, page.Total = []Row{e.row()}, 1
			}
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
		i, _ := slices.BinarySearchFunc(window, &entry{submitted: c.At, id: c.ID}, cmpEntry)
		return i
	}
	unfiltered := len(f.States) == 0 && f.Pool == "" && f.ID == "" && len(f.Labels) == 0
	var rows []*entry
	switch {
	case after.ID != "":
		// The page just newer than after: walk up from it, then show newest first.
		start := pos(after)
		if start < len(window) && window[start].id == after.ID {
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
		if before.ID != "" {
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
		for i := pos(Cursor{At: first.submitted, ID: first.id}) + 1; i < len(window); i++ {
			if unfiltered || f.match(window[i]) {
				page.Newer = Cursor{At: first.submitted, ID: first.id}
				break
			}
		}
		for i := pos(Cursor{At: last.submitted, ID: last.id}) - 1; i >= 0; i-- {
			if unfiltered || f.match(window[i]) {
				page.Older = Cursor{At: last.submitted, ID: last.id}
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

// Job returns the summary of one job.
func (ix *Index) Job(id string) (Row, uint64, bool) {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	e := ix.byID[id]
	if e == nil {
		return Row{}, 0, false
	}
	return e.row(), e.rev, true
}

// Has reports whether the index holds a job.
func (ix *Index) Has(id string) bool {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return ix.byID[id] != nil
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

func sortStrings(s []string) { slices.Sort(s) }
