package historytest

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// Runs: every node of a run is a job, and its history is checked as any
// job's (Check); CheckRun adds the edges. A node's job is queued (its
// first version stored) only after every node it comes after has its
// final version stored, and only when its rule holds for how they ended;
// a node ended without running (its first version a final one, cancelled
// with code upstream_failed or not_triggered) was so only after they had
// ended too, and only when its rule did not hold; every node of the run
// has one job that ended, once; and the run's summary says what the
// nodes' jobs say.

// CheckRun returns what is wrong with a run's first round: rec is its
// definition, end its summary (nil: the run has not ended, which is a
// violation too), and jobs every version of the run's jobs, by tenant/id
// (see Read).
func CheckRun(rec *job.RunRecord, end *job.RunEnd, jobs map[string][]Version) []Violation {
	var out []Violation
	name := rec.Tenant + "/run " + rec.RunID
	bad := func(format string, args ...any) {
		out = append(out, Violation{Job: name, What: fmt.Sprintf(format, args...)})
	}
	type node struct {
		vs    []Version
		final *Version
	}
	nodes := map[string]*node{}
	for _, n := range rec.Nodes {
		id := rec.Tenant + "/" + job.RunJobID(rec.RunID, n.ID, 1)
		vs := jobs[id]
		nd := &node{vs: vs}
		for i := range vs {
			if vs[i].final() {
				nd.final = &vs[i]
				break
			}
		}
		nodes[n.ID] = nd
		out = append(out, Check(id, vs)...)
		if len(vs) == 0 {
			bad("node %s has no job", n.ID)
		} else if nd.final == nil {
			bad("node %s's job %s has not ended", n.ID, id)
		}
	}
	cancelled := end != nil && end.State == job.RunCancelled
	for _, n := range rec.Nodes {
		nd := nodes[n.ID]
		if len(nd.vs) == 0 {
			continue
		}
		first := nd.vs[0]
		ran := strings.HasPrefix(first.Kind, "q")
		var fail, skipped bool
		for _, p := range n.After {
			pn := nodes[p]
			if pn == nil || pn.final == nil {
				if ran || !cancelled {
					bad("node %s's job was queued or ended before node %s, which it comes after, ended", n.ID, p)
				}
				continue
			}
			if pn.final.At.After(first.At) && (ran || !cancelled) {
				bad("node %s's job was %s at %s, before node %s, which it comes after, ended (%s)",
					n.ID, map[bool]string{true: "queued", false: "ended"}[ran], first.At.Format(time.RFC3339Nano), p,
					pn.final.At.Format(time.RFC3339Nano))
			}
			switch e := pn.final.Rec; {
			case e.State == job.StateSucceeded:
			case e.State == job.StateCancelled && e.Failure != nil && e.Failure.Code == job.CodeNotTriggered:
				skipped = true
			default:
				fail = true
			}
		}
		var holds bool
		switch n.When.Or() {
		case job.WhenAllSucceeded:
			holds = !fail && !skipped
		case job.WhenAllDone:
			holds = true
		case job.WhenAnyFailed:
			holds = fail
		}
		switch {
		case ran && !holds:
			bad("node %s ran, though its rule %s did not hold for how the nodes before it ended", n.ID, n.When.Or())
		case !ran && holds && !cancelled:
			bad("node %s did not run, though its rule %s held", n.ID, n.When.Or())
		}
	}
	if end == nil {
		bad("the run has not ended")
		return out
	}
	if len(end.Nodes) != len(rec.Nodes) {
		bad("its summary has %d nodes, its definition %d", len(end.Nodes), len(rec.Nodes))
	}
	for _, s := range end.Nodes {
		nd := nodes[s.ID]
		if nd == nil || nd.final == nil {
			continue
		}
		if f := nd.final.Rec; f.State != s.State || s.JobID != f.ID {
			bad("its summary says node %s's job %s ended %s; its final version says %s %s", s.ID, s.JobID, s.State, f.ID, f.State)
		}
	}
	return out
}

// RequireRun reads a run's definition and first round's summary, and the
// versions of its jobs from the pools' streams, and fails t for every
// violation (see CheckRun). A replica that was behind may answer the
// first reads without the last versions: they are read again for up to
// ten seconds while only that could explain what is missing.
func RequireRun(t testing.TB, js jetstream.JetStream, names queue.Names, tenant, run string) {
	t.Helper()
	rs := queue.NewRuns(js, names)
	var vs []Violation
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		rec, end, jobs, err := readRun(ctx, js, rs, names, tenant, run)
		cancel()
		if err != nil {
			if time.Now().After(deadline) {
				t.Fatalf("history of run %s: %v", run, err)
			}
			time.Sleep(500 * time.Millisecond)
			continue
		}
		vs = CheckRun(rec, end, jobs)
		n := 0
		for _, j := range jobs {
			n += len(j)
		}
		if len(vs) == 0 || time.Now().After(deadline) {
			t.Logf("history of run %s: %d nodes, %d versions of their jobs, %d violations", run, len(rec.Nodes), n, len(vs))
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	for i, v := range vs {
		if i == 50 {
			t.Errorf("… and %d more", len(vs)-i)
			break
		}
		t.Errorf("%s", v)
	}
}

func readRun(ctx context.Context, js jetstream.JetStream, rs *queue.Runs, names queue.Names, tenant, run string) (*job.RunRecord, *job.RunEnd, map[string][]Version, error) {
	rec, err := rs.Def(ctx, tenant, run)
	if err != nil {
		return nil, nil, nil, err
	}
	var end *job.RunEnd
	if m, err := js.Conn().RequestWithContext(ctx, "$JS.API.DIRECT.GET."+names.RunsStream(),
		[]byte(`{"last_by_subj":"`+names.RunEnd(tenant, run, 1)+`"}`)); err == nil && m.Header.Get("Status") == "" {
		end = new(job.RunEnd)
		if err := json.Unmarshal(m.Data, end); err != nil {
			return nil, nil, nil, fmt.Errorf("summary of run %s: %w", run, err)
		}
	}
	pools := map[string]bool{}
	for _, n := range rec.Nodes {
		pools[n.Pool] = true
	}
	jobs := map[string][]Version{}
	for pool := range pools {
		p, err := Read(ctx, js, names, pool, names.PoolJob(pool, "*", tenant, ">"))
		if err != nil {
			return nil, nil, nil, err
		}
		for id, vs := range p.Jobs {
			if strings.HasPrefix(id, tenant+"/"+run+":") {
				jobs[id] = vs
			}
		}
	}
	return rec, end, jobs, nil
}
