package runs

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// record makes a run's definition from "node<-parent,parent" specs, every
// node in pool p; rule, when set, is a node's when.
func record(specs []string, rule map[string]job.When) *job.RunRecord {
	rec := &job.RunRecord{RunID: "r", Tenant: "t", SubmittedAt: time.Unix(0, 0)}
	for _, s := range specs {
		var n job.RunNodeRecord
		id, after, ok := cut(s, "<-")
		n.ID, n.Pool, n.When = id, "p", rule[id]
		if ok {
			n.After = split(after)
		}
		rec.Nodes = append(rec.Nodes, n)
	}
	return rec
}

func cut(s, sep string) (string, string, bool) {
	for i := 0; i+len(sep) <= len(s); i++ {
		if s[i:i+len(sep)] == sep {
			return s[:i], s[i+len(sep):], true
		}
	}
	return s, "", false
}

func split(s string) []string {
	var out []string
	for s != "" {
		a, b, _ := cut(s, ",")
		out = append(out, a)
		s = b
	}
	return out
}

func end(r *run, node string, state job.State, code job.FailureCode) *job.NodeEnded {
	i := r.index[node]
	return &job.NodeEnded{RunID: r.id, NodeID: node, JobID: r.jobID(i), Pool: "p", Round: r.nodeRound[i], State: state, Code: code}
}

func ids(r *run, is []int) []string {
	var out []string
	for _, i := range is {
		out = append(out, r.rec.Nodes[i].ID)
	}
	return out
}

// A diamond: a first, then b and c, then d. Each node is ready only once
// its parents have all ended, and the round is complete when every node
// has.
func TestADiamondReleasesEachNodeAfterItsParents(t *testing.T) {
	r := newRun(record([]string{"a", "b<-a", "c<-a", "d<-b,c"}, nil), nil, nil)
	if got := ids(r, r.ready()); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("ready at first: %v; want a", got)
	}
	for _, c := range []struct {
		ends  string
		ready []string
		d     verb
	}{
		{"a", []string{"b", "c"}, wait},
		{"b", []string{"c"}, wait},
		{"c", []string{"d"}, release},
		{"d", nil, release},
	} {
		if _, ok := r.apply(end(r, c.ends, job.StateSucceeded, "")); !ok {
			t.Fatalf("the end of %s said nothing new", c.ends)
		}
		if got := ids(r, r.ready()); !slices.Equal(got, c.ready) {
			t.Errorf("after %s ended: ready %v; want %v", c.ends, got, c.ready)
		}
		if v, _, _ := r.verdict(r.index["d"]); v != c.d {
			t.Errorf("after %s ended: d's verdict %v; want %v", c.ends, v, c.d)
		}
	}
	if !r.complete() || r.state() != job.RunSucceeded {
		t.Errorf("complete %v, state %s; want a succeeded run", r.complete(), r.state())
	}
	if _, ok := r.apply(end(r, "d", job.StateSucceeded, "")); ok {
		t.Error("an end applied twice")
	}
}

// Each rule, with parents that succeeded, failed, or were skipped.
func TestTheRules(t *testing.T) {
	for _, c := range []struct {
		rule    job.When
		parents []job.State // of a and b; cancelled with not_triggered is "skipped"
		verb    verb
		code    job.FailureCode
	}{
		{job.WhenAllSucceeded, []job.State{job.StateSucceeded, job.StateSucceeded}, release, ""},
		{job.WhenAllSucceeded, []job.State{job.StateSucceeded, job.StateFailed}, skip, job.CodeUpstreamFailed},
		{job.WhenAllSucceeded, []job.State{job.StateTimedOut, job.StateSucceeded}, skip, job.CodeUpstreamFailed},
		{job.WhenAllSucceeded, []job.State{job.StateCancelled, job.StateSucceeded}, skip, job.CodeUpstreamFailed},
		{job.WhenAllSucceeded, []job.State{"skipped", job.StateSucceeded}, skip, job.CodeNotTriggered},
		{job.WhenAllDone, []job.State{job.StateFailed, job.StateSucceeded}, release, ""},
		{job.WhenAllDone, []job.State{"skipped", job.StateCancelled}, release, ""},
		{job.WhenAnyFailed, []job.State{job.StateSucceeded, job.StateFailed}, release, ""},
		{job.WhenAnyFailed, []job.State{job.StateSucceeded, job.StateSucceeded}, skip, job.CodeNotTriggered},
		{job.WhenAnyFailed, []job.State{"skipped", job.StateSucceeded}, skip, job.CodeNotTriggered},
	} {
		t.Run(fmt.Sprintf("%s %v", c.rule, c.parents), func(t *testing.T) {
			r := newRun(record([]string{"a", "b", "c<-a,b"}, map[string]job.When{"c": c.rule}), nil, nil)
			for i, s := range c.parents {
				node := []string{"a", "b"}[i]
				if s == "skipped" {
					r.apply(end(r, node, job.StateCancelled, job.CodeNotTriggered))
				} else {
					r.apply(end(r, node, s, ""))
				}
			}
			v, code, _ := r.verdict(r.index["c"])
			if v != c.verb || code != c.code {
				t.Errorf("verdict %v %q; want %v %q", v, code, c.verb, c.code)
			}
		})
	}
}

// A cancelled round releases nothing more: a node that would run ends
// cancelled; the run's state is cancelled.
func TestACancelledRoundReleasesNothing(t *testing.T) {
	rounds := &queue.RunRounds{Cancelled: map[int]bool{1: true}, Ended: map[int]*job.RunEnd{}}
	r := newRun(record([]string{"a", "b<-a"}, nil), rounds, nil)
	r.apply(end(r, "a", job.StateSucceeded, ""))
	if v, code, _ := r.verdict(r.index["b"]); v != skip || code != job.CodeCancelled {
		t.Errorf("b's verdict %v %q; want skip, cancelled", v, code)
	}
	r.apply(end(r, "b", job.StateCancelled, job.CodeCancelled))
	if s := r.summary(time.Now()); s.State != job.RunCancelled || s.Nodes[1].Code != job.CodeCancelled {
		t.Errorf("summary %+v", s)
	}
}

// A retry runs again what did not succeed (skipped nodes too) and every
// node after it, as new jobs of the new round; the rest keep theirs.
func TestARetryRunsAgainWhatDidNotSucceedAndWhatComesAfter(t *testing.T) {
	rec := record([]string{"a", "b<-a", "c<-a", "d<-b", "e<-c", "h<-b,c"}, map[string]job.When{"h": job.WhenAnyFailed})
	r := newRun(rec, nil, nil)
	r.apply(end(r, "a", job.StateSucceeded, ""))
	r.apply(end(r, "b", job.StateSucceeded, ""))
	r.apply(end(r, "c", job.StateFailed, ""))
	r.apply(end(r, "d", job.StateSucceeded, ""))
	r.apply(end(r, "e", job.StateCancelled, job.CodeUpstreamFailed))
	r.apply(end(r, "h", job.StateSucceeded, ""))
	if !r.complete() || r.state() != job.RunFailed {
		t.Fatalf("complete %v, state %s; want a failed run", r.complete(), r.state())
	}
	set := r.retrySet()
	if !slices.Equal(set, []string{"c", "e", "h"}) {
		t.Fatalf("retry set %v; want c, e and h", set)
	}
	// Round 2, as the releaser loads it: its retry, and the ends written
	// so far (round 1's).
	var ends []*job.NodeEnded
	for _, e := range r.ends {
		if e != nil {
			ends = append(ends, e)
		}
	}
	rounds := &queue.RunRounds{Retries: []*job.RunRetry{{RunID: "r", Tenant: "t", Round: 2, Nodes: set}},
		Cancelled: map[int]bool{}, Ended: map[int]*job.RunEnd{1: r.summary(time.Now())}}
	r2 := newRun(rec, rounds, ends)
	if r2.round != 2 || r2.ended.Load() || r2.jobID(r2.index["c"]) != "r:c:2" || r2.jobID(r2.index["b"]) != "r:b" {
		t.Fatalf("round %d ended %v, c's job %s, b's %s", r2.round, r2.ended.Load(), r2.jobID(r2.index["c"]), r2.jobID(r2.index["b"]))
	}
	if got := ids(r2, r2.ready()); !slices.Equal(got, []string{"c"}) {
		t.Errorf("ready in round 2: %v; want c alone", got)
	}
	if r2.endedCount != 3 {
		t.Errorf("%d nodes ended in round 2 at its start; want a, b and d", r2.endedCount)
	}
	// A round-1 end of c says nothing of round 2.
	if _, ok := r2.apply(&job.NodeEnded{RunID: "r", NodeID: "c", JobID: "r:c", Pool: "p", State: job.StateFailed}); ok {
		t.Error("an end of round 1's job of c applied to round 2")
	}
}

// An end that is not the node's in its pool and round says nothing.
func TestAnEndOfAnotherPoolOrRunIsIgnored(t *testing.T) {
	r := newRun(record([]string{"a"}, nil), nil, nil)
	for _, e := range []*job.NodeEnded{
		{RunID: "r", NodeID: "a", JobID: "r:a", Pool: "other", State: job.StateSucceeded},
		{RunID: "x", NodeID: "a", JobID: "r:a", Pool: "p", State: job.StateSucceeded},
		{RunID: "r", NodeID: "zz", JobID: "r:zz", Pool: "p", State: job.StateSucceeded},
		{RunID: "r", NodeID: "a", JobID: "r:a", Pool: "p", State: job.StateRunning},
	} {
		if _, ok := r.apply(e); ok {
			t.Errorf("%+v applied", e)
		}
	}
	if r.endedCount != 0 {
		t.Errorf("%d ended", r.endedCount)
	}
}

// A run read from the stream has, for a node, the last end written on
// each pool's subject of it: an end written by another pool's workers,
// after the node's own, hides nothing, whichever order they come in.
func TestAnEndOfAnotherPoolHidesNothingWhenTheRunIsRead(t *testing.T) {
	rec := record([]string{"a", "b<-a"}, nil)
	own := &job.NodeEnded{RunID: "r", NodeID: "a", JobID: "r:a", Pool: "p", Round: 1, State: job.StateSucceeded}
	forged := &job.NodeEnded{RunID: "r", NodeID: "a", JobID: "r:a", Pool: "other", Round: 1, State: job.StateFailed}
	for _, ends := range [][]*job.NodeEnded{{own, forged}, {forged, own}} {
		r := newRun(rec, nil, ends)
		if r.ends[0] != own || r.endedCount != 1 {
			t.Errorf("ends %v: a's end %+v, %d ended", ends, r.ends[0], r.endedCount)
		}
		if v, _, _ := r.verdict(r.index["b"]); v != release {
			t.Errorf("ends %v: b's verdict %v; want release", ends, v)
		}
	}
}
