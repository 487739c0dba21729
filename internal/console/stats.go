package console

import (
	"math"
	"math/bits"
	"time"

	"github.com/fleet-dev/fleet/job"
)

// states are the job states the index counts, in the order pages show them.
var states = []job.State{job.StateQueued, job.StateRunning, job.StateRetrying, job.StateSucceeded,
	job.StateFailed, job.StateTimedOut, job.StateCancelled, job.StateRejected}

func stateIndex(s job.State) int {
	for i, v := range states {
		if v == s {
			return i
		}
	}
	return -1
}

// latencyBuckets is the number of buckets of the submit → start
// histogram: bucket 0 holds under a millisecond, bucket i from 2^(i-1) to
// 2^i milliseconds, the last everything longer (about 9 hours).
const latencyBuckets = 26

// minute holds what happened in one pool in one minute.
type minute struct {
	at        int64 // minutes since the epoch; a stale slot is reset
	succeeded int
	failed    int // failed and timed out
	cancelled int
	started   int // jobs whose first attempt started
	latency   [latencyBuckets]uint32
}

// poolAgg is one pool's aggregates: jobs by state, the oldest queued job,
// and the last hour minute by minute.
type poolAgg struct {
	name    string
	byState [8]int
	oldest  *entry // the oldest queued job, when known
	dirty   bool   // oldest left the queue: look for the next
	minutes [60]minute
}

func (p *poolAgg) total() int {
	n := 0
	for _, c := range p.byState {
		n += c
	}
	return n
}

func (p *poolAgg) slot(at int64) *minute {
	m := &p.minutes[at%60]
	if m.at != at {
		*m = minute{at: at}
	}
	return m
}

// hourAgo is the first minute that counts in "the last hour".
func hourAgo(now time.Time) int64 { return now.Unix()/60 - 59 }

// add counts e, which was old before this change (nil if new).
func (p *poolAgg) add(e, old *entry) {
	if old != nil {
		if i := stateIndex(old.state); i >= 0 {
			p.byState[i]--
		}
	}
	if i := stateIndex(e.state); i >= 0 {
		p.byState[i]++
	}
	// The oldest queued job.
	switch {
	case e.state == job.StateQueued && (p.oldest == nil && !p.dirty || p.oldest != nil && e.before(p.oldest)):
		p.oldest = e
	case p.oldest == e && e.state != job.StateQueued:
		p.oldest, p.dirty = nil, true
	}
	now := time.Now()
	first := hourAgo(now)
	// A job that ended now (or ended within the hour, seen first in a
	// replay) counts once in its minute.
	if e.final() && (old == nil || !old.final()) && e.finished != 0 {
		if at := e.finished / int64(time.Minute); at >= first {
			m := p.slot(at)
			switch e.state {
			case job.StateSucceeded:
				m.succeeded++
			case job.StateCancelled:
				m.cancelled++
			default:
				m.failed++
			}
		}
	}
	// Its first start, with how long it waited for it.
	if e.started != 0 && (old == nil || old.started == 0) {
		if at := e.started / int64(time.Minute); at >= first {
			m := p.slot(at)
			m.started++
			m.latency[latencyBucket(time.Duration(e.started-e.submitted))]++
		}
	}
}

// drop uncounts e, which leaves the index.
func (p *poolAgg) drop(e *entry) {
	if i := stateIndex(e.state); i >= 0 {
		p.byState[i]--
	}
	if p.oldest == e {
		p.oldest, p.dirty = nil, true
	}
}

func latencyBucket(d time.Duration) int {
	ms := d.Milliseconds()
	if ms <= 0 {
		return 0
	}
	return min(bits.Len64(uint64(ms)), latencyBuckets-1)
}

// bucketUpper is the upper bound of a latency bucket.
func bucketUpper(i int) time.Duration {
	if i == 0 {
		return time.Millisecond
	}
	return time.Duration(1<<i) * time.Millisecond
}

// PoolStats is a pool's counts and its last hour.
type PoolStats struct {
	Pool string
	// ByState counts the retained jobs in each state.
	ByState map[string]int
	// OldestQueued is when the oldest queued job was submitted (zero if
	// none is queued).
	OldestQueued time.Time
	// The last hour: jobs that ended, and first starts.
	Succeeded, Failed, Cancelled, Started int
	// Minutes are the last 60 minutes, oldest first.
	Minutes []MinuteStats
	// P50 and P95 of submit → start over the hour (upper bounds of
	// power-of-two buckets).
	P50, P95 time.Duration
}

// MinuteStats is one minute of a pool.
type MinuteStats struct {
	At        time.Time
	Finished  int
	Succeeded int
	Started   int
	P50, P95  time.Duration
}

// Stats returns every pool's counts and last hour, sorted by pool, with
// the sum of every pool first under the name "".
func (ix *Index) Stats(now time.Time) []PoolStats {
	ix.mu.Lock() // the oldest queued job may need looking up
	defer ix.mu.Unlock()
	first := hourAgo(now)
	all := PoolStats{ByState: map[string]int{}, Minutes: make([]MinuteStats, 60)}
	var allHist [latencyBuckets]uint64
	names := make([]string, 0, len(ix.pools))
	for name := range ix.pools {
		names = append(names, name)
	}
	sortStrings(names)
	out := []PoolStats{}
	for _, name := range names {
		p := ix.pools[name]
		if p.total() == 0 {
			continue
		}
		ps := PoolStats{Pool: name, ByState: map[string]int{}, Minutes: make([]MinuteStats, 60)}
		for i, s := range states {
			ps.ByState[string(s)] = p.byState[i]
			all.ByState[string(s)] += p.byState[i]
		}
		if o := ix.oldestQueued(p); o != nil {
			ps.OldestQueued = time.Unix(0, o.submitted)
			if all.OldestQueued.IsZero() || ps.OldestQueued.Before(all.OldestQueued) {
				all.OldestQueued = ps.OldestQueued
			}
		}
		var hist [latencyBuckets]uint64
		for k := range 60 {
			at := first + int64(k)
			ms := &ps.Minutes[k]
			ms.At = time.Unix(at*60, 0)
			all.Minutes[k].At = ms.At
			m := &p.minutes[at%60]
			if m.at != at {
				continue
			}
			ms.Succeeded, ms.Finished, ms.Started = m.succeeded, m.succeeded+m.failed+m.cancelled, m.started
			ms.P50, ms.P95 = quantile(m.latency[:], 0.5), quantile(m.latency[:], 0.95)
			ps.Succeeded += m.succeeded
			ps.Failed += m.failed
			ps.Cancelled += m.cancelled
			ps.Started += m.started
			a := &all.Minutes[k]
			a.Succeeded += ms.Succeeded
			a.Finished += ms.Finished
			a.Started += ms.Started
			for i, c := range m.latency {
				hist[i] += uint64(c)
				allHist[i] += uint64(c)
			}
		}
		ps.P50, ps.P95 = quantile(hist[:], 0.5), quantile(hist[:], 0.95)
		all.Succeeded += ps.Succeeded
		all.Failed += ps.Failed
		all.Cancelled += ps.Cancelled
		all.Started += ps.Started
		out = append(out, ps)
	}
	// Per-minute quantiles of all pools together.
	for k := range 60 {
		at := first + int64(k)
		var h [latencyBuckets]uint64
		for _, name := range names {
			m := &ix.pools[name].minutes[at%60]
			if m.at == at {
				for i, c := range m.latency {
					h[i] += uint64(c)
				}
			}
		}
		all.Minutes[k].P50, all.Minutes[k].P95 = quantile(h[:], 0.5), quantile(h[:], 0.95)
	}
	all.P50, all.P95 = quantile(allHist[:], 0.5), quantile(allHist[:], 0.95)
	return append([]PoolStats{all}, out...)
}

// oldestQueued returns the pool's oldest queued job, looking it up when
// the last one left the queue.
func (ix *Index) oldestQueued(p *poolAgg) *entry {
	if p.dirty {
		p.dirty, p.oldest = false, nil
		if p.byState[stateIndex(job.StateQueued)] > 0 {
			for _, e := range ix.order {
				if e.key.Pool == p.name && e.state == job.StateQueued {
					p.oldest = e
					break
				}
			}
		}
	}
	return p.oldest
}

func quantile[T uint32 | uint64](h []T, q float64) time.Duration {
	var n uint64
	for _, c := range h {
		n += uint64(c)
	}
	if n == 0 {
		return 0
	}
	want := uint64(math.Ceil(q * float64(n)))
	var seen uint64
	for i, c := range h {
		seen += uint64(c)
		if seen >= want {
			return bucketUpper(i)
		}
	}
	return bucketUpper(len(h) - 1)
}
