// Package historytest checks the fleet's first promise from the outside:
// each job ends with one result, whatever died on the way. It reads every
// version of every job's record from a pool's stream, as stored, and fails
// on a second final version, a version after the final one, a running
// version written against a final one, an attempt number that goes back,
// a version written without a compare-and-set on the one before it, a
// version of kind x (a rejection's) that is not a rejection, a job without
// a final version, or a result heard twice by a subscriber.
//
// Every test that kills a process or a server while jobs run calls Require
// (or Check, on histories of its own making) at its end: no test allows any
// of these, not even once a run.
package historytest

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// Version is one stored version of a job's record.
type Version struct {
	Seq  uint64 // its stream sequence: its revision
	Kind string // q1 … q5, s, r or x, from its subject
	// Expected is the revision its compare-and-set named
	// (Nats-Expected-Last-Subject-Sequence); CAS says whether it had one.
	Expected uint64
	CAS      bool
	Rec      *job.Record
	At       time.Time // when the stream stored it
}

// final reports whether v is a final version: of kind r, with a final state.
func (v Version) final() bool { return v.Kind == queue.KindResult || v.Rec.State.Final() }

func (v Version) String() string {
	return fmt.Sprintf("%d %s %s attempt %d (expecting %d)", v.Seq, v.Kind, v.Rec.State, v.Rec.Attempt, v.Expected)
}

// Violation is one way a job's history breaks the promise.
type Violation struct {
	Job  string // tenant/id
	What string
}

func (v Violation) String() string { return v.Job + ": " + v.What }

// Check returns what is wrong with one job's versions, oldest first. A
// job's first version queues it (or rejects it, and a later submission may
// queue it over the rejection; a version of kind x is a rejection, and
// nothing else is); each later one is written with a
// compare-and-set on the one before it; the first final version is its
// last; an attempt number never goes back, but for a delivery handed back
// before its attempt counted (a requeue gives back exactly that attempt).
func Check(name string, vs []Version) []Violation {
	var out []Violation
	bad := func(format string, args ...any) {
		out = append(out, Violation{Job: name, What: fmt.Sprintf(format, args...)})
	}
	if len(vs) == 0 {
		return nil
	}
	if first := vs[0]; !strings.HasPrefix(first.Kind, "q") && first.Rec.State != job.StateRejected && !unrun(first) {
		bad("its first version is not the one that queued it: %s", first)
	}
	finalAt := -1
	for i, v := range vs {
		if i > 0 {
			prev := vs[i-1]
			switch {
			case !v.CAS:
				bad("version %s was written without a compare-and-set", v)
			case v.Expected != prev.Seq:
				bad("version %s was written against %d, not against the version before it (%d)", v, v.Expected, prev.Seq)
			}
			if finalAt < 0 {
				back := v.Rec.Attempt < prev.Rec.Attempt
				handback := v.Rec.State == job.StateQueued && v.Rec.Attempt == prev.Rec.Attempt-1 && v.Rec.Handbacks > prev.Rec.Handbacks
				if back && !handback {
					bad("its attempt number goes back from %d to %d at version %s", prev.Rec.Attempt, v.Rec.Attempt, v)
				}
			}
		}
		if v.Kind == queue.KindRejected && v.Rec.State != job.StateRejected {
			bad("version %s is of kind %s, which only rejections are", v, queue.KindRejected)
		}
		if finalAt >= 0 {
			f := vs[finalAt]
			switch {
			case v.final():
				bad("a second final version: %s after %s", v, f)
			case v.Rec.State == job.StateRunning && v.Expected == f.Seq:
				bad("a running version written against its final version: %s over %s", v, f)
			default:
				bad("a version after its final one: %s after %s", v, f)
			}
			continue
		}
		if v.final() {
			finalAt = i
		}
	}
	return out
}

// unrun reports whether v ends a run's node that never ran, as its first
// version: a final version, cancelled (see CheckRun for when it may be).
func unrun(v Version) bool {
	_, _, _, node := job.ParseRunJobID(v.Rec.ID)
	return node && v.final() && v.Rec.State == job.StateCancelled && v.Rec.Failure != nil
}

// Pool is the history of every job of a pool's stream, by tenant/id.
type Pool struct {
	Jobs map[string][]Version
	// Forged counts versions whose body names another job than their
	// subject: the readers of the fleet ignore them (see queue.Jobs).
	Forged int
}

// Read reads every version of every job of pool whose subject matches
// filter (a subject under the pool's, "" for all), in stream order.
func Read(ctx context.Context, js jetstream.JetStream, names queue.Names, pool, filter string) (*Pool, error) {
	if filter == "" {
		filter = names.PoolSubjects(pool)
	}
	c, err := js.OrderedConsumer(ctx, names.PoolStreamV2(pool), jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		return nil, fmt.Errorf("read pool %s: %w", pool, err)
	}
	p := &Pool{Jobs: map[string][]Version{}}
	for {
		// A fetch that waits: an ordered consumer just made may not
		// deliver at once, and an empty first answer is not an empty pool.
		batch, err := c.Fetch(1024, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return nil, fmt.Errorf("read pool %s: %w", pool, err)
		}
		n, done := 0, false
		for m := range batch.Messages() {
			n++
			md, err := m.Metadata()
			if err != nil {
				return nil, fmt.Errorf("read pool %s: %w", pool, err)
			}
			kind, k, ok := names.ParsePoolJob(m.Subject())
			if !ok {
				return nil, fmt.Errorf("read pool %s: %s is not the subject of a job", pool, m.Subject())
			}
			var rec job.Record
			if err := json.Unmarshal(m.Data(), &rec); err != nil {
				return nil, fmt.Errorf("read pool %s: version %d of %s: %w", pool, md.Sequence.Stream, k.ID, err)
			}
			if rec.ID != k.ID || rec.Tenant != k.Tenant || rec.Pool != k.Pool {
				p.Forged++
				continue
			}
			v := Version{Seq: md.Sequence.Stream, Kind: kind, Rec: &rec, At: md.Timestamp}
			if h := m.Headers().Get(jetstream.ExpectedLastSubjSeqHeader); h != "" {
				v.Expected, _ = strconv.ParseUint(h, 10, 64)
				v.CAS = m.Headers().Get(jetstream.ExpectedLastSubjSeqSubjHeader) == names.PoolJobAll(k.Pool, k.Tenant, k.ID)
			}
			name := k.Tenant + "/" + k.ID
			p.Jobs[name] = append(p.Jobs[name], v)
			done = md.NumPending == 0
		}
		if done {
			return p, nil
		}
		if n == 0 {
			// Nothing came within the wait: done if the consumer has
			// nothing left to deliver.
			info, err := c.Info(ctx)
			if err != nil {
				return nil, fmt.Errorf("read pool %s: %w", pool, err)
			}
			if info.NumPending == 0 {
				return p, nil
			}
		}
	}
}

// Violations checks every job of the pool; ids, when given, are the jobs
// (tenant/id) that must each have exactly one final version.
func (p *Pool) Violations(ids []string) []Violation {
	var out []Violation
	names := make([]string, 0, len(p.Jobs))
	for n := range p.Jobs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		out = append(out, Check(n, p.Jobs[n])...)
	}
	for _, id := range ids {
		vs := p.Jobs[id]
		if len(vs) == 0 {
			out = append(out, Violation{Job: id, What: "lost: no version of it in the stream"})
			continue
		}
		if !vs[len(vs)-1].final() && !hasFinal(vs) {
			out = append(out, Violation{Job: id, What: fmt.Sprintf("no final version; its last is %s", vs[len(vs)-1])})
		}
	}
	return out
}

func hasFinal(vs []Version) bool {
	for _, v := range vs {
		if v.final() {
			return true
		}
	}
	return false
}

// Ear hears the final versions of a tenant's jobs of a pool as a
// subscriber does, on fleet.t.<tenant>.job.<pool>.r.> (the results; the
// rejections, on kind x, are not results, and a later submission of the
// id may replace them), and counts them by
// job id and by the stream sequence each copy carries (Nats-Sequence):
// two sequences for one job are two results; one sequence heard twice is
// one result, republished again by a stream's new leader (see Repeats).
type Ear struct {
	mu    sync.Mutex
	heard map[string]map[string]int // id: sequence: copies
	sub   *nats.Subscription
	strip string
}

// Listen starts an ear on nc; it stops when the test ends.
func Listen(t testing.TB, nc *nats.Conn, names queue.Names, tenant, pool string) *Ear {
	t.Helper()
	e := &Ear{heard: map[string]map[string]int{}, strip: names.JobLive(tenant, pool, queue.KindResult, "")}
	sub, err := nc.Subscribe(names.JobLive(tenant, pool, queue.KindResult, ">"), func(m *nats.Msg) {
		id := strings.TrimPrefix(m.Subject, e.strip)
		seq := m.Header.Get(jetstream.SequenceHeader)
		e.mu.Lock()
		if e.heard[id] == nil {
			e.heard[id] = map[string]int{}
		}
		e.heard[id][seq]++
		e.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	e.sub = sub
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return e
}

// Heard returns how many results of job id the ear heard: its copies of
// distinct stream sequences.
func (e *Ear) Heard(id string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.heard[id])
}

// Twice returns the ids of the jobs the ear heard two results of.
func (e *Ear) Twice() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for id, seqs := range e.heard {
		if len(seqs) > 1 {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out
}

// Repeats counts the results the ear heard again with the sequence it
// had heard: a copy a stream's leader republished, and then its next
// leader again (it republishes what it applies once elected).
func (e *Ear) Repeats() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, seqs := range e.heard {
		for _, k := range seqs {
			n += k - 1
		}
	}
	return n
}

// Require reads pool's history (every job of tenant whose id starts with
// prefix) and fails t for every violation, for every job of ids (plain ids
// of tenant) that has no final version, and for every result an ear heard
// twice. A replica that was behind may answer the first read without the
// last versions: a job without a final version is read again for up to ten
// seconds. It returns the history read.
func Require(t testing.TB, js jetstream.JetStream, names queue.Names, tenant, pool, prefix string, ids []string, ears ...*Ear) *Pool {
	t.Helper()
	filter := names.PoolJob(pool, "*", tenant, ">")
	want := make([]string, len(ids))
	for i, id := range ids {
		want[i] = tenant + "/" + id
	}
	var (
		p   *Pool
		vs  []Violation
		err error
	)
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		p, err = Read(ctx, js, names, pool, filter)
		cancel()
		if err == nil {
			for name := range p.Jobs {
				if !strings.HasPrefix(name, tenant+"/"+prefix) {
					delete(p.Jobs, name)
				}
			}
			vs = p.Violations(want)
			if !onlyUnfinished(vs) || time.Now().After(deadline) {
				break
			}
		} else if time.Now().After(deadline) {
			t.Fatalf("history of pool %s: %v", pool, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	versions := 0
	for _, j := range p.Jobs {
		versions += len(j)
	}
	t.Logf("history of pool %s: %d jobs, %d versions, %d violations", pool, len(p.Jobs), versions, len(vs))
	for i, v := range vs {
		if i == 50 {
			t.Errorf("… and %d more", len(vs)-i)
			break
		}
		t.Errorf("%s", v)
		if hs := p.Jobs[v.Job]; len(hs) > 0 && i < 10 {
			for _, h := range hs {
				t.Logf("    %s", h)
			}
		}
	}
	for i, e := range ears {
		for _, id := range e.Twice() {
			t.Errorf("subscriber %d heard %d results of %s", i, e.Heard(id), id)
		}
		if n := e.Repeats(); n > 0 {
			t.Logf("subscriber %d heard %d results again, with the stream sequence it had heard them with", i, n)
		}
	}
	return p
}

// onlyUnfinished reports whether every violation is of a job without a
// final version yet, which a replica that was behind may explain.
func onlyUnfinished(vs []Violation) bool {
	if len(vs) == 0 {
		return false
	}
	for _, v := range vs {
		if !strings.HasPrefix(v.What, "no final version") && !strings.HasPrefix(v.What, "lost:") {
			return false
		}
	}
	return true
}
