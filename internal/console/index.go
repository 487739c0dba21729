package console

import (
	"fmt"
	"slices"
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

// recordView is the part of a job.Record the index keeps: the scanner of
// decode.go fills it from a record's JSON, and viewOf from a decoded
// job.Record, so that the record's fields and their names are written once,
// in package job.
type recordView struct {
	ID              string // the key
	Pool            string
	State           job.State
	Attempt         int
	MaxAttempts     int
	WorkerID        string
	Backend         string
	SubmittedAt     time.Time
	UpdatedAt       time.Time
	StartedAt       time.Time
	FinishedAt      time.Time
	NextAttemptAt   time.Time
	Failure         *job.Failure
	ExitCode        *int
	CancelRequested bool
	TraceID         string
	Labels          map[string]string
}

// viewOf is the part of r the index keeps.
func viewOf(r *job.Record) recordView {
	v := recordView{Pool: r.Pool, State: r.State, Attempt: r.Attempt, MaxAttempts: r.MaxAttempts, WorkerID: r.WorkerID,
		Backend: r.Backend, SubmittedAt: r.SubmittedAt, UpdatedAt: r.UpdatedAt, Failure: r.Failure, ExitCode: r.ExitCode,
		CancelRequested: r.CancelRequested, TraceID: r.TraceID, Labels: r.Labels}
	for _, t := range []struct {
		from *time.Time
		to   *time.Time
	}{{r.StartedAt, &v.StartedAt}, {r.FinishedAt, &v.FinishedAt}, {r.NextAttemptAt, &v.NextAttemptAt}} {
		if t.from != nil {
			*t.to = *t.from
		}
	}
	return v
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
