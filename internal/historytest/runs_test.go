package historytest

import (
	"strings"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/job"
)

// runOf makes the first round of run r: nodes a, b after a, c after b
// with rule when; each node's versions as the script says, at the times
// given: "q@1 r:succeeded@3" is queued at t0+1s, succeeded at t0+3s;
// "r:cancelled/upstream_failed@4" ends it without running.
func runOf(when job.When, scripts map[string]string) (*job.RunRecord, *job.RunEnd, map[string][]Version) {
	rec := &job.RunRecord{RunID: "r", Tenant: "t", Nodes: []job.RunNodeRecord{
		{ID: "a", Pool: "p"}, {ID: "b", After: []string{"a"}, Pool: "p"}, {ID: "c", After: []string{"b"}, When: when, Pool: "p"}}}
	end := &job.RunEnd{RunID: "r", Tenant: "t", Round: 1, State: job.RunSucceeded}
	jobs := map[string][]Version{}
	t0 := time.Unix(1000, 0)
	seq := uint64(0)
	for _, n := range rec.Nodes {
		id := job.RunJobID("r", n.ID, 1)
		var prev uint64
		for _, step := range strings.Fields(scripts[n.ID]) {
			what, at, _ := strings.Cut(step, "@")
			secs := time.Duration(at[0]-'0') * time.Second
			seq++
			rec := &job.Record{ID: id, Tenant: "t", Pool: "p", RunID: "r", NodeID: n.ID}
			kind := "q3"
			if what != "q" {
				kind = "r"
				state, code, _ := strings.Cut(strings.TrimPrefix(what, "r:"), "/")
				rec.State = job.State(state)
				if code != "" {
					rec.Failure = job.Failf(job.ClassCancelled, job.FailureCode(code), "x")
				}
				if rec.State != job.StateSucceeded {
					end.State = job.RunFailed
				}
				end.Nodes = append(end.Nodes, job.NodeState{ID: n.ID, JobID: id, Pool: "p", State: rec.State})
			} else {
				rec.State = job.StateQueued
			}
			jobs["t/"+id] = append(jobs["t/"+id], Version{Seq: seq, Kind: kind, Expected: prev, CAS: true, Rec: rec, At: t0.Add(secs)})
			prev = seq
		}
	}
	return rec, end, jobs
}

func TestCheckRun(t *testing.T) {
	for _, c := range []struct {
		name    string
		when    job.When
		scripts map[string]string
		want    string // a violation's words; "" for none
	}{
		{"a chain that ran in order", "", map[string]string{"a": "q@0 r:succeeded@1", "b": "q@2 r:succeeded@3", "c": "q@4 r:succeeded@5"}, ""},
		{"a node queued before its parent ended", "", map[string]string{"a": "q@0 r:succeeded@3", "b": "q@2 r:succeeded@4", "c": "q@5 r:succeeded@6"},
			"node b's job was queued at"},
		{"a node run after a failure under all_succeeded", "", map[string]string{"a": "q@0 r:succeeded@1", "b": "q@2 r:failed@3", "c": "q@4 r:succeeded@5"},
			"node c ran, though its rule all_succeeded did not hold"},
		{"a node cancelled after a failure", "", map[string]string{"a": "q@0 r:succeeded@1", "b": "q@2 r:failed@3", "c": "r:cancelled/upstream_failed@4"}, ""},
		{"a failure handler not run", job.WhenAnyFailed, map[string]string{"a": "q@0 r:succeeded@1", "b": "q@2 r:failed@3", "c": "r:cancelled/not_triggered@4"},
			"node c did not run, though its rule any_failed held"},
		{"a node that ran twice", "", map[string]string{"a": "q@0 r:succeeded@1 r:succeeded@2", "b": "q@3 r:succeeded@4", "c": "q@5 r:succeeded@6"},
			"a second final version"},
		{"a node never queued", "", map[string]string{"a": "q@0 r:succeeded@1", "b": "q@2 r:succeeded@3"}, "node c has no job"},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec, end, jobs := runOf(c.when, c.scripts)
			vs := CheckRun(rec, end, jobs)
			var all []string
			for _, v := range vs {
				all = append(all, v.String())
			}
			got := strings.Join(all, "\n")
			switch {
			case c.want == "" && len(vs) > 0:
				t.Errorf("violations:\n%s", got)
			case c.want != "" && !strings.Contains(got, c.want):
				t.Errorf("violations:\n%s\nwant one with %q", got, c.want)
			}
		})
	}
}
