package console

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// entry is what the index keeps of one job: its latest record version's
// fields that a row, a filter or a count needs. Times are Unix
// nanoseconds, 0 for none.
type entry struct {
	key         queue.JobKey // tenant, pool, id
	priority    int
	state       job.State
	attempt     int
	maxAttempts int
	worker      string
	submitted   int64
	updated     int64
	started     int64
	finished    int64
	next        int64
	exitCode    int
	hasExit     bool
	failure     *job.Failure
	cancelReq   bool
	labels      []label // sorted by key
	rev         uint64  // the version's sequence in its pool's stream
	gen         uint64  // the replay that last saw it
}

// label is one of a job's labels.
type label struct{ K, V string }

// setLabel sets a label in a list sorted by key.
func setLabel(ls []label, k, v string) []label {
	i, found := slices.BinarySearchFunc(ls, k, func(l label, k string) int { return strings.Compare(l.K, k) })
	if found {
		ls[i].V = v
		return ls
	}
	return slices.Insert(ls, i, label{k, v})
}

func (e *entry) final() bool { return e.state.Final() }

// before orders entries by submission time, then id, tenant and pool.
func (e *entry) before(o *entry) bool { return cmpEntry(e, o) < 0 }

func cmpEntry(a, b *entry) int {
	switch {
	case a.submitted < b.submitted:
		return -1
	case a.submitted > b.submitted:
		return 1
	}
	return cmp.Or(strings.Compare(a.key.ID, b.key.ID), strings.Compare(a.key.Tenant, b.key.Tenant),
		strings.Compare(a.key.Pool, b.key.Pool))
}

// Index keeps a summary of every job in the pools' streams, ordered by
// submission, and per-pool aggregates, updated from the streams (see
// feed.go). Lists, filters and counts are served from it; nothing reads a
// stream per request. It is safe for concurrent use.
type Index struct {
	mu      sync.RWMutex
	byKey   map[queue.JobKey]*entry
	order   []*entry // by (submitted, id, tenant, pool), oldest first
	pools   map[string]*poolAgg
	tenants map[string]int // jobs per tenant
	// names interns the strings many entries share (tenants, pools,
	// workers, failure codes, labels) while decoding, so that 100,000
	// entries do not hold 100,000 copies.
	names interner
	gen   uint64

	retention time.Duration
	maxJobs   int

	version atomic.Uint64 // bumped by every change
	ready   atomic.Bool   // the first replay of the streams is complete
	applied atomic.Uint64
}

// NewIndex returns an empty index that forgets jobs whose record is older
// than retention, and keeps at most maxJobs (dropping the oldest finished
// ones first).
func NewIndex(retention time.Duration, maxJobs int) *Index {
	return &Index{byKey: map[queue.JobKey]*entry{}, pools: map[string]*poolAgg{}, tenants: map[string]int{},
		retention: retention, maxJobs: maxJobs}
}

// recordView is the part of a job.Record version the index keeps: the
// scanner of decode.go fills it from a record's JSON, and viewOf from a
// decoded job.Record, so that the record's fields and their names are
// written once, in package job. Times are Unix nanoseconds, 0 for none.
type recordView struct {
	ID, Tenant, Pool string
	Priority         int
	State            job.State
	Attempt          int
	MaxAttempts      int
	WorkerID         string
	SubmittedAt      int64
	UpdatedAt        int64
	StartedAt        int64
	FinishedAt       int64
	NextAttemptAt    int64
	Failure          *job.Failure
	ExitCode         int
	HasExit          bool
	CancelRequested  bool
	Labels           []label // sorted by key
}

// viewOf is the part of r the index keeps.
func viewOf(r *job.Record) recordView {
	v := recordView{ID: r.ID, Tenant: r.Tenant, Pool: r.Pool, Priority: r.Priority, State: r.State, Attempt: r.Attempt,
		MaxAttempts: r.MaxAttempts, WorkerID: r.WorkerID, SubmittedAt: nanos(r.SubmittedAt), UpdatedAt: nanos(r.UpdatedAt),
		StartedAt: nanosOf(r.StartedAt), FinishedAt: nanosOf(r.FinishedAt), NextAttemptAt: nanosOf(r.NextAttemptAt),
		Failure: r.Failure, CancelRequested: r.CancelRequested}
	if r.ExitCode != nil {
		v.ExitCode, v.HasExit = *r.ExitCode, true
	}
	for k, val := range r.Labels {
		v.Labels = setLabel(v.Labels, k, val)
	}
	return v
}

func nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func nanosOf(t *time.Time) int64 {
	if t == nil {
		return 0
	}
	return nanos(*t)
}

// maxMessage bounds a failure message kept per job.
const maxMessage = 300

// Update is one record version of a pool's stream: its job's place (from
// its subject), the version's JSON and its sequence in the stream.
type Update struct {
	Key  queue.JobKey
	Data []byte
	Seq  uint64
}

// Apply takes one record version.
func (ix *Index) Apply(u Update) error {
	errs := ix.ApplyAll([]Update{u})
	if len(errs) > 0 {
		return errs[0]
	}
	return nil
}

// ApplyAll takes a batch of record versions, in order: they are decoded
// first, then applied under one lock. It returns the versions it could
// not read.
func (ix *Index) ApplyAll(us []Update) []error {
	if len(us) == 0 {
		return nil
	}
	views := make([]recordView, len(us))
	read := make([]bool, len(us))
	var errs []error
	for i := range us {
		if err := decodeRecord(us[i].Data, &views[i], &ix.names); err != nil {
			errs = append(errs, fmt.Errorf("record of job %s/%s/%s: %w", us[i].Key.Tenant, us[i].Key.Pool, us[i].Key.ID, err))
			continue
		}
		read[i] = true
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for i := range us {
		if read[i] {
			ix.apply(us[i].Key, &views[i], us[i].Seq)
		}
	}
	return errs
}

func (ix *Index) apply(k queue.JobKey, r *recordView, seq uint64) {
	e := ix.byKey[k]
	fresh := e == nil
	if fresh {
		e = &entry{key: k}
	} else if seq <= e.rev {
		e.gen = ix.gen
		return // an older version, or this one again (a replay)
	}
	old := *e
	e.priority, e.state = r.Priority, r.State
	e.attempt, e.maxAttempts, e.worker = r.Attempt, r.MaxAttempts, r.WorkerID
	e.submitted, e.updated = r.SubmittedAt, r.UpdatedAt
	e.started, e.finished, e.next = r.StartedAt, r.FinishedAt, r.NextAttemptAt
	e.exitCode, e.hasExit = r.ExitCode, r.HasExit
	e.failure = nil
	if f := r.Failure; f != nil {
		short := job.Failure{Class: f.Class, Code: f.Code, Message: f.Message}
		if len(short.Message) > maxMessage {
			short.Message = short.Message[:maxMessage] + "…"
		}
		if old.failure != nil && *old.failure == short {
			e.failure = old.failure // the version before failed the same way
		} else {
			e.failure = &short
		}
	}
	e.cancelReq = r.CancelRequested
	if !slices.Equal(e.labels, r.Labels) { // every version repeats the job's labels
		e.labels = r.Labels
	}
	e.rev, e.gen = seq, ix.gen

	if fresh {
		ix.byKey[k] = e
		ix.insert(e)
		ix.pool(k.Pool).add(e, nil)
		ix.tenants[k.Tenant]++
	} else {
		if old.submitted != e.submitted {
			ix.remove(&old, e)
			ix.insert(e)
		}
		ix.pool(k.Pool).add(e, &old)
	}
	ix.applied.Add(1)
	ix.version.Add(1)
}

func (ix *Index) forget(e *entry) {
	delete(ix.byKey, e.key)
	ix.remove(e, e)
	ix.pool(e.key.Pool).drop(e)
	ix.untenant(e.key.Tenant)
}

func (ix *Index) untenant(t string) {
	if ix.tenants[t]--; ix.tenants[t] <= 0 {
		delete(ix.tenants, t)
	}
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

func (ix *Index) pool(name string) *poolAgg {
	p := ix.pools[name]
	if p == nil {
		p = &poolAgg{name: name}
		ix.pools[name] = p
	}
	return p
}

// BeginReplay marks the start of a replay of the streams (the feed
// started again); EndReplay then forgets what the replay did not bring.
func (ix *Index) BeginReplay() {
	ix.mu.Lock()
	ix.gen++
	ix.mu.Unlock()
}

// EndReplay forgets the jobs the last replay did not bring (gone while
// the feed was down), and marks the index ready.
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

// ForgetPool forgets the jobs of a pool whose stream is gone.
func (ix *Index) ForgetPool(pool string) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	var gone []*entry
	for _, e := range ix.order {
		if e.key.Pool == pool {
			gone = append(gone, e)
		}
	}
	for _, e := range gone {
		ix.forget(e)
	}
	delete(ix.pools, pool)
	ix.version.Add(1)
}

// Ready reports whether the index holds every job of the streams.
func (ix *Index) Ready() bool { return ix.ready.Load() }

// Version changes whenever the index does.
func (ix *Index) Version() uint64 { return ix.version.Load() }

// Len is the number of jobs in the index.
func (ix *Index) Len() int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return len(ix.order)
}

// Sweep forgets jobs whose record expired from their stream (older than
// the retention), then, over maxJobs, the oldest finished ones.
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
			delete(ix.byKey, e.key)
			ix.pool(e.key.Pool).drop(e)
			ix.untenant(e.key.Tenant)
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
