package console

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleet-dev/fleet/job"
)

// entry is what the index keeps of one job: its record's fields that a
// row, a filter or a count needs. Times are Unix nanoseconds, 0 for none.
type entry struct {
	id          string
	pool        string
	state       job.State
	attempt     int
	maxAttempts int
	worker      string
	backend     string
	submitted   int64
	updated     int64
	started     int64
	finished    int64
	next        int64
	exitCode    int
	hasExit     bool
	failure     *job.Failure
	cancelReq   bool
	labels      map[string]string
	traceID     string
	rev         uint64 // the record's revision in the bucket
	gen         uint64 // the replay of the bucket that last saw it
}

func (e *entry) final() bool { return e.state.Final() }

// before orders entries by submission time, then id.
func (e *entry) before(o *entry) bool {
	if e.submitted != o.submitted {
		return e.submitted < o.submitted
	}
	return e.id < o.id
}

// Index keeps a summary of every job in the jobs bucket, ordered by
// submission, and per-pool aggregates, updated from the bucket's watch.
// Lists, filters and counts are served from it; nothing reads the bucket
// per request. It is safe for concurrent use.
type Index struct {
	mu    sync.RWMutex
	byID  map[string]*entry
	order []*entry // by (submitted, id), oldest first
	pools map[string]*poolAgg
	// strs interns the strings many entries share (pools, workers,
	// failure codes), so that 100,000 entries do not hold 100,000 copies.
	strs map[string]string
	// names interns them while decoding, before a record is applied.
	names interner
	gen   uint64

	retention time.Duration
	maxJobs   int

	version atomic.Uint64 // bumped by every change
	ready   atomic.Bool   // the first replay of the bucket is complete
	applied atomic.Uint64
}

// NewIndex returns an empty index that forgets jobs whose record is older
// than retention, and keeps at most maxJobs (dropping the oldest finished
// ones first).
func NewIndex(retention time.Duration, maxJobs int) *Index {
	return &Index{byID: map[string]*entry{}, pools: map[string]*poolAgg{}, strs: map[string]string{},
		retention: retention, maxJobs: maxJobs}
}

func (ix *Index) intern(s string) string {
	if s == "" {
		return ""
	}
	if v, ok := ix.strs[s]; ok {
		return v
	}
	if len(ix.strs) < 100_000 {
		ix.strs[s] = s
	}
	return s
}

// recordView is the part of a job.Record the index decodes.
type recordView struct {
	ID              string            `json:"-"` // the key
	Pool            string            `json:"pool"`
	State           job.State         `json:"state"`
	Attempt         int               `json:"attempt"`
	MaxAttempts     int               `json:"max_attempts"`
	WorkerID        string            `json:"worker_id"`
	Backend         string            `json:"backend"`
	SubmittedAt     time.Time         `json:"submitted_at"`
	UpdatedAt       time.Time         `json:"updated_at"`
	StartedAt       time.Time         `json:"started_at"`
	FinishedAt      time.Time         `json:"finished_at"`
	NextAttemptAt   time.Time         `json:"next_attempt_at"`
	Failure         *job.Failure      `json:"failure"`
	ExitCode        *int              `json:"exit_code"`
	CancelRequested bool              `json:"cancel_requested"`
	TraceID         string            `json:"trace_id"`
	Labels          map[string]string `json:"labels"`
}

func nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// maxMessage bounds a failure message kept per job.
const maxMessage = 300

// Apply takes one record as stored under its key at revision rev.
func (ix *Index) Apply(key string, data []byte, rev uint64) error {
	var r recordView
	if err := decodeRecord(data, &r, &ix.names); err != nil {
		return fmt.Errorf("record %s: %w", key, err)
	}
	r.ID = key // the key is the job's id
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.apply(&r, rev)
	return nil
}

func (ix *Index) apply(r *recordView, rev uint64) {
	e := ix.byID[r.ID]
	fresh := e == nil
	if fresh {
		e = &entry{id: r.ID}
	} else if rev != 0 && rev < e.rev {
		e.gen = ix.gen
		return // an older copy, from a replay
	}
	old := *e
	e.pool, e.state = ix.intern(r.Pool), r.State
	e.attempt, e.maxAttempts = r.Attempt, r.MaxAttempts
	e.worker, e.backend = ix.intern(r.WorkerID), ix.intern(r.Backend)
	e.submitted, e.updated = r.SubmittedAt.UnixNano(), r.UpdatedAt.UnixNano()
	e.started, e.finished, e.next = nanos(r.StartedAt), nanos(r.FinishedAt), nanos(r.NextAttemptAt)
	e.hasExit = r.ExitCode != nil
	if e.hasExit {
		e.exitCode = *r.ExitCode
	}
	e.failure = nil
	if f := r.Failure; f != nil {
		msg := f.Message
		if len(msg) > maxMessage {
			msg = msg[:maxMessage] + "…"
		}
		e.failure = &job.Failure{Class: job.FailureClass(ix.intern(string(f.Class))), Code: job.FailureCode(ix.intern(string(f.Code))), Message: msg}
	}
	e.cancelReq, e.traceID, e.labels = r.CancelRequested, r.TraceID, r.Labels
	e.rev, e.gen = rev, ix.gen

	if fresh {
		ix.byID[e.id] = e
		ix.insert(e)
		ix.pool(e.pool).add(e, nil)
	} else {
		if old.submitted != e.submitted || old.id != e.id {
			ix.remove(&old, e)
			ix.insert(e)
		}
		if old.pool != e.pool {
			ix.pool(old.pool).drop(&old)
			ix.pool(e.pool).add(e, nil)
		} else {
			ix.pool(e.pool).add(e, &old)
		}
	}
	ix.applied.Add(1)
	ix.version.Add(1)
}

// Update is one write of the jobs bucket: a record, or a deletion.
type Update struct {
	Key     string
	Data    []byte
	Rev     uint64
	Deleted bool
}

// ApplyAll takes a batch of writes, in order: the records are decoded
// first, then applied under one lock. It returns the records it could not
// read.
func (ix *Index) ApplyAll(us []Update) []error {
	if len(us) == 0 {
		return nil
	}
	views := make([]recordView, len(us))
	read := make([]bool, len(us))
	var errs []error
	for i := range us {
		if us[i].Deleted {
			continue
		}
		if err := decodeRecord(us[i].Data, &views[i], &ix.names); err != nil {
			errs = append(errs, fmt.Errorf("record %s: %w", us[i].Key, err))
			continue
		}
		views[i].ID, read[i] = us[i].Key, true
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for i := range us {
		switch {
		case us[i].Deleted:
			if e := ix.byID[us[i].Key]; e != nil {
				ix.forget(e)
				ix.version.Add(1)
			}
		case read[i]:
			ix.apply(&views[i], us[i].Rev)
		}
	}
	return errs
}

// Delete forgets a job whose key was deleted or purged.
func (ix *Index) Delete(key string) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if e := ix.byID[key]; e != nil {
		ix.forget(e)
		ix.version.Add(1)
	}
}

func (ix *Index) forget(e *entry) {
	delete(ix.byID, e.id)
	ix.remove(e, e)
	ix.pool(e.pool).drop(e)
}

// insert places e in order; new jobs arrive in about the order they were
// submitted, so the search starts from the end.
func (ix *Index) insert(e *entry) {
	n := len(ix.order)
	if n == 0 || ix.order[n-1].before(e) {
		ix.order = append(ix.order, e)
		return
	}
	i, _ := slices.BinarySearchFunc(ix.order, e, cmpEntry)
	ix.order = slices.Insert(ix.order, i, e)
}

// remove takes out of order the entry p points to, found where key (its
// ordering fields as they were) sorts.
func (ix *Index) remove(key, p *entry) {
	i, _ := slices.BinarySearchFunc(ix.order, key, cmpEntry)
	for j := i; j < len(ix.order) && j <= i+1; j++ {
		if ix.order[j] == p {
			ix.order = slices.Delete(ix.order, j, j+1)
			return
		}
	}
	if k := slices.Index(ix.order, p); k >= 0 { // not where expected: look everywhere
		ix.order = slices.Delete(ix.order, k, k+1)
	}
}

func cmpEntry(a, b *entry) int {
	switch {
	case a.submitted < b.submitted:
		return -1
	case a.submitted > b.submitted:
		return 1
	}
	return strings.Compare(a.id, b.id)
}

func (ix *Index) pool(name string) *poolAgg {
	p := ix.pools[name]
	if p == nil {
		p = &poolAgg{name: name}
		ix.pools[name] = p
	}
	return p
}

// BeginReplay marks the start of a replay of the bucket (the watch
// started again); EndReplay then forgets what the replay did not bring.
func (ix *Index) BeginReplay() {
	ix.mu.Lock()
	ix.gen++
	ix.mu.Unlock()
}

// EndReplay forgets the jobs the last replay did not bring (deleted while
// the watch was down), and marks the index ready.
func (ix *Index) EndReplay() {
	ix.mu.Lock()
	var gone []*entry
	for _, e := range ix.order {
		if e.gen != ix.gen {
			gone = append(gone, e)
		}
	}
	for _, e := range gone {
		ix.forget(e)
	}
	ix.mu.Unlock()
	ix.ready.Store(true)
	ix.version.Add(1)
}

// Ready reports whether the index holds every job of the bucket.
func (ix *Index) Ready() bool { return ix.ready.Load() }

// Version changes whenever the index does.
func (ix *Index) Version() uint64 { return ix.version.Load() }

// Len is the number of jobs in the index.
func (ix *Index) Len() int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return len(ix.order)
}

// Sweep forgets jobs whose record expired from the bucket (older than the
// retention), then, over maxJobs, the oldest finished ones.
func (ix *Index) Sweep(now time.Time) int {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	cut := now.Add(-ix.retention).UnixNano()
	over := len(ix.order) - ix.maxJobs
	kept := ix.order[:0]
	dropped := 0
	for _, e := range ix.order {
		expired := ix.retention > 0 && e.updated < cut
		if expired || (ix.maxJobs > 0 && over > 0 && (e.final() || e.state == job.StateRejected)) {
			delete(ix.byID, e.id)
			ix.pool(e.pool).drop(e)
			dropped++
			over--
			continue
		}
		kept = append(kept, e)
	}
	clear(ix.order[len(kept):])
	ix.order = kept
	if dropped > 0 {
		ix.version.Add(1)
	}
	return dropped
}

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
