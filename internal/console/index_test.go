package console

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/job"
)

func put(t testing.TB, ix *Index, rec *job.Record, rev uint64) {
	t.Helper()
	data, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	if err := ix.Apply(rec.ID, data, rev); err != nil {
		t.Fatal(err)
	}
}

func ptrTime(t time.Time) *time.Time { return &t }

func TestIndexFollowsAJobThroughItsStates(t *testing.T) {
	ix := NewIndex(time.Hour, 0)
	now := time.Now()
	rec := &job.Record{ID: "j1", Pool: "gpu", State: job.StateQueued, SubmittedAt: now.Add(-3 * time.Second),
		UpdatedAt: now, Labels: map[string]string{"team": "ml"}}
	put(t, ix, rec, 1)
	st := ix.Stats(now)
	if len(st) != 2 || st[1].Pool != "gpu" || st[1].ByState[string(job.StateQueued)] != 1 || !st[1].OldestQueued.Equal(rec.SubmittedAt.Truncate(0)) {
		t.Fatalf("after queued: %+v", st)
	}
	rec.State, rec.Attempt, rec.WorkerID, rec.StartedAt = job.StateRunning, 1, "w1", ptrTime(now)
	put(t, ix, rec, 2)
	st = ix.Stats(now)
	if st[1].ByState[string(job.StateQueued)] != 0 || st[1].ByState[string(job.StateRunning)] != 1 || !st[1].OldestQueued.IsZero() || st[1].Started != 1 {
		t.Fatalf("after running: %+v", st[1])
	}
	// Three seconds waiting: in the bucket up to 4.096 s.
	if st[1].P50 != 4096*time.Millisecond {
		t.Errorf("p50 of submit → start = %s", st[1].P50)
	}
	code := 3
	rec.State, rec.FinishedAt, rec.ExitCode = job.StateFailed, ptrTime(now), &code
	rec.Failure = &job.Failure{Class: job.ClassExecution, Code: job.CodeExitCode, Message: "exit status 3"}
	put(t, ix, rec, 3)
	put(t, ix, rec, 3)                                                                                       // a replay of the same revision counts nothing twice
	put(t, ix, &job.Record{ID: "j1", Pool: "gpu", State: job.StateRunning, SubmittedAt: rec.SubmittedAt}, 2) // older: ignored
	st = ix.Stats(now)
	if st[1].ByState[string(job.StateFailed)] != 1 || st[1].ByState[string(job.StateRunning)] != 0 || st[1].Failed != 1 || st[1].Started != 1 || st[0].Failed != 1 {
		t.Fatalf("after failed: %+v", st)
	}
	row, rev, ok := ix.Job("j1")
	if !ok || rev != 3 || row.ExitCode == nil || *row.ExitCode != 3 || row.Failure.Code != job.CodeExitCode || row.Worker != "w1" {
		t.Fatalf("row: %+v rev %d", row, rev)
	}
	ix.Delete("j1")
	if ix.Len() != 0 || ix.Stats(now)[0].ByState[string(job.StateFailed)] != 0 {
		t.Errorf("a deleted job is still counted")
	}
}

func fill(t testing.TB, ix *Index, n int, base time.Time) {
	pools := []string{"default", "gpu", "k8s"}
	stateOf := []job.State{job.StateSucceeded, job.StateSucceeded, job.StateFailed, job.StateQueued, job.StateRunning}
	for i := range n {
		rec := &job.Record{ID: fmt.Sprintf("job-%06d", i), Pool: pools[i%3], State: stateOf[i%5],
			SubmittedAt: base.Add(time.Duration(i) * time.Millisecond), UpdatedAt: base,
			Labels: map[string]string{"team": fmt.Sprint("t", i%7)}}
		put(t, ix, rec, uint64(i+1))
	}
}

func TestIndexListsFiltersAndPages(t *testing.T) {
	ix := NewIndex(0, 0)
	base := time.Now().Add(-time.Hour)
	// Applied out of order, as a replay of the bucket delivers them.
	fill(t, ix, 1000, base)
	put(t, ix, &job.Record{ID: "late-arrival", Pool: "default", State: job.StateQueued, SubmittedAt: base.Add(-time.Minute)}, 5000)

	p := ix.List(Filter{}, Cursor{}, Cursor{}, 50)
	if p.Total != 1001 || len(p.Rows) != 50 || p.Rows[0].ID != "job-000999" || p.Rows[49].ID != "job-000950" || p.Newer.ID != "" {
		t.Fatalf("first page: total %d, %d rows, %s..%s, newer %v", p.Total, len(p.Rows), p.Rows[0].ID, p.Rows[len(p.Rows)-1].ID, p.Newer)
	}
	seen := map[string]bool{}
	pages := 0
	for c := (Cursor{}); ; pages++ {
		pg := ix.List(Filter{}, c, Cursor{}, 50)
		for _, r := range pg.Rows {
			if seen[r.ID] {
				t.Fatalf("%s on two pages", r.ID)
			}
			seen[r.ID] = true
		}
		if pg.Older.ID == "" {
			if pg.Rows[len(pg.Rows)-1].ID != "late-arrival" {
				t.Errorf("the oldest job is not last: %s", pg.Rows[len(pg.Rows)-1].ID)
			}
			break
		}
		c = pg.Older
	}
	if len(seen) != 1001 {
		t.Errorf("paging saw %d jobs", len(seen))
	}
	// Back one page from the second.
	second := ix.List(Filter{}, p.Older, Cursor{}, 50)
	back := ix.List(Filter{}, Cursor{}, second.Newer, 50)
	if back.Rows[0].ID != p.Rows[0].ID || back.Rows[49].ID != p.Rows[49].ID {
		t.Errorf("newer page of the second is not the first: %s..%s", back.Rows[0].ID, back.Rows[49].ID)
	}

	f := Filter{States: []job.State{job.StateFailed}, Pool: "gpu", Labels: map[string]string{"team": "t3"}}
	got := ix.List(f, Cursor{}, Cursor{}, 1000)
	want := 0
	for i := range 1000 {
		if i%5 == 2 && i%3 == 1 && i%7 == 3 {
			want++
		}
	}
	if got.Total != want || len(got.Rows) != want {
		t.Fatalf("filtered: %d/%d rows, want %d", got.Total, len(got.Rows), want)
	}
	for _, r := range got.Rows {
		if r.State != job.StateFailed || r.Pool != "gpu" || r.Labels["team"] != "t3" {
			t.Errorf("row %+v does not match", r)
		}
	}
	if g := ix.List(Filter{ID: "job-00012"}, Cursor{}, Cursor{}, 100); g.Total != 10 {
		t.Errorf("prefix job-00012: %d", g.Total)
	}
	if g := ix.List(Filter{ID: "job-000123"}, Cursor{}, Cursor{}, 100); g.Total != 1 || g.Rows[0].ID != "job-000123" {
		t.Errorf("exact id: %+v", g)
	}
	if g := ix.List(Filter{Since: base.Add(100 * time.Millisecond), Until: base.Add(200 * time.Millisecond)}, Cursor{}, Cursor{}, 500); g.Total != 100 ||
		g.Rows[0].ID != "job-000199" {
		t.Errorf("time range: %d", g.Total)
	}
}

func TestIndexReplayForgetsDeletedJobsAndSweepExpires(t *testing.T) {
	ix := NewIndex(time.Hour, 0)
	now := time.Now()
	for _, id := range []string{"a", "b", "c"} {
		put(t, ix, &job.Record{ID: id, Pool: "p", State: job.StateQueued, SubmittedAt: now, UpdatedAt: now}, 1)
	}
	ix.EndReplay()
	ix.BeginReplay()
	put(t, ix, &job.Record{ID: "a", Pool: "p", State: job.StateQueued, SubmittedAt: now, UpdatedAt: now}, 1)
	put(t, ix, &job.Record{ID: "c", Pool: "p", State: job.StateQueued, SubmittedAt: now, UpdatedAt: now.Add(-2 * time.Hour)}, 2)
	ix.EndReplay()
	if ix.Has("b") || !ix.Has("a") || ix.Len() != 2 {
		t.Fatalf("after the replay: b kept or a lost (%d jobs)", ix.Len())
	}
	if n := ix.Sweep(now); n != 1 || ix.Has("c") {
		t.Errorf("sweep dropped %d; c kept: %v", n, ix.Has("c"))
	}
	if st := ix.Stats(now); st[0].ByState[string(job.StateQueued)] != 1 {
		t.Errorf("queued after the sweep: %d", st[0].ByState[string(job.StateQueued)])
	}
}

// BenchmarkIndexApply measures what the index costs the dispatcher per
// record write: decoding the record and updating the summaries.
func BenchmarkIndexApply(b *testing.B) {
	ix := NewIndex(0, 0)
	now := time.Now()
	// Each job is written three times (queued, running, succeeded), in
	// the order they were submitted, as a fleet writes them.
	const jobs = 4096
	recs := make([][]byte, 3*jobs)
	ids := make([]string, jobs)
	code := 0
	for n := range jobs {
		ids[n] = job.NewID()
		sub := now.Add(time.Duration(n) * time.Microsecond)
		for i, s := range []job.State{job.StateQueued, job.StateRunning, job.StateSucceeded} {
			r := &job.Record{ID: ids[n], Pool: "default", State: s, Attempt: 1, MaxAttempts: 3,
				WorkerID: "worker-1", Backend: "process", SubmittedAt: sub, UpdatedAt: sub, TraceID: "4bf92f3577b34da6a3ce929d0e0e4736",
				Labels: map[string]string{"team": "build"}}
			if s != job.StateQueued {
				r.StartedAt = &sub
			}
			if s == job.StateSucceeded {
				r.FinishedAt, r.ExitCode = &sub, &code
			}
			recs[3*n+i], _ = json.Marshal(r)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		k := i % len(recs)
		if k == 0 && i > 0 {
			b.StopTimer()
			ix = NewIndex(0, 0)
			b.StartTimer()
		}
		if err := ix.Apply(ids[k/3], recs[k], uint64(i+1)); err != nil {
			b.Fatal(err)
		}
	}
}
