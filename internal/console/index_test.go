package console

import (
	"cmp"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// put applies a version of rec's record at sequence seq (of the default
// tenant unless rec names one).
func put(t testing.TB, ix *Index, rec *job.Record, seq uint64) {
	t.Helper()
	rec.Tenant = cmp.Or(rec.Tenant, job.DefaultTenant)
	data, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	if err := ix.Apply(Update{Key: queue.Key(rec), Data: data, Seq: seq}); err != nil {
		t.Fatal(err)
	}
}

func key(pool, id string) queue.JobKey {
	return queue.JobKey{Tenant: job.DefaultTenant, Pool: pool, ID: id}
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
	row, rev, ok := ix.Job(key("gpu", "j1"))
	if !ok || rev != 3 || row.ExitCode == nil || *row.ExitCode != 3 || row.Failure.Code != job.CodeExitCode || row.Worker != "w1" {
		t.Fatalf("row: %+v rev %d", row, rev)
	}
	ix.ForgetPool("gpu")
	if ix.Len() != 0 || ix.Stats(now)[0].ByState[string(job.StateFailed)] != 0 {
		t.Errorf("a job of a pool forgotten is still counted")
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
	if p.Total != 1001 || len(p.Rows) != 50 || p.Rows[0].ID != "job-000999" || p.Rows[49].ID != "job-000950" || p.Newer.Key.ID != "" {
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
		if pg.Older.Key.ID == "" {
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
	if ix.Has(key("p", "b")) || !ix.Has(key("p", "a")) || ix.Len() != 2 {
		t.Fatalf("after the replay: b kept or a lost (%d jobs)", ix.Len())
	}
	if n := ix.Sweep(now); n != 1 || ix.Has(key("p", "c")) {
		t.Errorf("sweep dropped %d; c kept: %v", n, ix.Has(key("p", "c")))
	}
	if st := ix.Stats(now); st[0].ByState[string(job.StateQueued)] != 1 {
		t.Errorf("queued after the sweep: %d", st[0].ByState[string(job.StateQueued)])
	}
}

// BenchmarkIndexApply measures what the index costs the dispatcher per
// record version: decoding it and updating the summaries.
func BenchmarkIndexApply(b *testing.B) {
	ix := NewIndex(0, 0)
	us := fleetVersions(4096)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		k := i % len(us)
		if k == 0 && i > 0 {
			b.StopTimer()
			ix = NewIndex(0, 0)
			b.StartTimer()
		}
		if err := ix.Apply(us[k]); err != nil {
			b.Fatal(err)
		}
	}
}

// fleetVersions is the record versions of n no-op jobs as a fleet writes
// them: queued (with the request and its sealed secrets), running,
// succeeded (with the result), in the order they were submitted.
func fleetVersions(n int) []Update {
	now := time.Now()
	out := make([]Update, 0, 3*n)
	code := 0
	for i := range n {
		id := job.NewID()
		sub := now.Add(time.Duration(i) * time.Microsecond)
		q := &job.Record{ID: id, Tenant: job.DefaultTenant, Pool: job.DefaultPool, Priority: job.DefaultPriority,
			State: job.StateQueued, Event: job.EventQueued, MaxAttempts: 3, SubmittedAt: sub, UpdatedAt: sub,
			TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", Labels: map[string]string{"team": "build"},
			Request: &job.Request{ID: id, Command: []string{"make", "test"}, Env: map[string]string{"CI_TOKEN": ""},
				Labels: map[string]string{"team": "build"}}, Secrets: strings.Repeat("x", 88)}
		s := q.Version()
		s.State, s.Event, s.Attempt, s.WorkerID, s.Backend, s.StartedAt = job.StateRunning, job.EventStarted, 1, "worker-1", "process", &sub
		r := s.Version()
		r.State, r.Event, r.FinishedAt, r.ExitCode = job.StateSucceeded, job.EventSucceeded, &sub, &code
		r.Result = &job.Result{JobID: id, Pool: job.DefaultPool, Status: job.StatusSucceeded, Attempts: 1, ExitCode: &code,
			StartedAt: &sub, FinishedAt: sub, WorkerID: "worker-1", Stdout: "ok\n"}
		for v, rec := range []*job.Record{q, s, r} {
			data, _ := json.Marshal(rec)
			out = append(out, Update{Key: queue.Key(rec), Data: data, Seq: uint64(3*i + v + 1)})
		}
	}
	return out
}

// TestIndexKeepsTenantsApart: a job is its tenant's, pool's and id's; the
// same id in two tenants (or two pools) is two jobs, each found, listed
// and filtered by its tenant.
func TestIndexKeepsTenantsApart(t *testing.T) {
	ix := NewIndex(0, 0)
	now := time.Now()
	put(t, ix, &job.Record{ID: "build-1", Tenant: "acme", Pool: "default", State: job.StateQueued, SubmittedAt: now,
		Labels: map[string]string{"team": "a"}}, 1)
	put(t, ix, &job.Record{ID: "build-1", Pool: "default", State: job.StateQueued, SubmittedAt: now.Add(time.Millisecond)}, 2)
	put(t, ix, &job.Record{ID: "build-1", Tenant: "acme", Pool: "gpu", State: job.StateQueued, SubmittedAt: now.Add(2 * time.Millisecond)}, 1)
	put(t, ix, &job.Record{ID: "build-1", Tenant: "acme", Pool: "default", State: job.StateRunning, SubmittedAt: now, Attempt: 1,
		Labels: map[string]string{"team": "a"}}, 3)
	if ix.Len() != 3 {
		t.Fatalf("%d jobs, want 3", ix.Len())
	}
	if got := ix.Tenants(); len(got) != 2 || got[0] != "acme" || got[1] != "default" {
		t.Errorf("tenants %v", got)
	}
	acme := ix.List(Filter{Tenant: "acme"}, Cursor{}, Cursor{}, 10)
	if acme.Total != 2 || acme.Rows[0].Pool != "gpu" || acme.Rows[1].State != job.StateRunning || acme.Rows[1].Tenant != "acme" {
		t.Errorf("tenant acme: %+v", acme)
	}
	if p := ix.List(Filter{ID: "build-1"}, Cursor{}, Cursor{}, 10); p.Total != 3 {
		t.Errorf("id build-1 in every tenant: %d", p.Total)
	}
	if p := ix.List(Filter{ID: "build-1", Tenant: "default"}, Cursor{}, Cursor{}, 10); p.Total != 1 || p.Rows[0].Tenant != "default" {
		t.Errorf("id build-1 of the default tenant: %+v", p)
	}
	if p := ix.List(Filter{Tenant: "acme", Labels: map[string]string{"team": "a"}}, Cursor{}, Cursor{}, 10); p.Total != 1 ||
		p.Rows[0].Labels["team"] != "a" || p.Rows[0].Path() != "/ui/jobs/acme/default/build-1" {
		t.Errorf("tenant acme, label team=a: %+v", p)
	}
	if k, ok := ix.Find("acme", "build-1"); !ok || k.Pool != "gpu" {
		t.Errorf("find acme's build-1: %v %v, want the newest, in gpu", k, ok)
	}
	if _, ok := ix.Find("nobody", "build-1"); ok {
		t.Error("found another tenant's job")
	}
	// Paging by cursor keeps the three apart even at one submission time.
	same := NewIndex(0, 0)
	for i, tenant := range []string{"a", "b", "c", "d", "e"} {
		put(t, same, &job.Record{ID: "x", Tenant: tenant, Pool: "p", State: job.StateQueued, SubmittedAt: now}, uint64(i+1))
	}
	seen := map[string]bool{}
	for c := (Cursor{}); ; {
		pg := same.List(Filter{}, c, Cursor{}, 2)
		for _, r := range pg.Rows {
			seen[r.Tenant] = true
		}
		if pg.Older.Key.ID == "" {
			break
		}
		back, ok := ParseCursor(pg.Older.String())
		if !ok || back != pg.Older {
			t.Fatalf("cursor %q reads back as %+v", pg.Older.String(), back)
		}
		c = back
	}
	if len(seen) != 5 {
		t.Errorf("paging saw %d of 5 tenants", len(seen))
	}
}
