package historytest

import (
	"slices"
	"strings"
	"testing"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// v is one version of a history under test: its record's state, attempt
// and handbacks, and what its write is.
type v struct {
	state     job.State
	attempt   int
	handbacks int
	// event is the record's event; heartbeat versions (adopted, awaiting
	// the owner, cancel requested) keep the state running.
	event job.EventType
	phase string
	// expect, when set, is the revision the version names (0 for the
	// first version); otherwise the one before it.
	expect *uint64
	noCAS  bool
	// kind, when set, is its subject's kind; otherwise the one the fleet
	// writes for its record (see queue.Jobs).
	kind string
}

func at(rev uint64) *uint64 { return &rev }

// history builds versions at sequences 10, 20, 30 …, each written with a
// compare-and-set against the one before it unless it says otherwise.
func history(vs ...v) []Version {
	var out []Version
	for i, x := range vs {
		seq := uint64(10 * (i + 1))
		rec := &job.Record{ID: "j", Tenant: job.DefaultTenant, Pool: "default", State: x.state, Attempt: x.attempt,
			Handbacks: x.handbacks, Event: x.event, Phase: x.phase, Priority: 3}
		kind := x.kind
		switch {
		case kind != "":
		case x.state.Final():
			kind = queue.KindResult
		case x.state == job.StateRejected:
			kind = queue.KindRejected
		case x.state == job.StateQueued && i == 0, x.state == job.StateQueued && vs[i-1].state == job.StateRejected:
			kind = queue.KindQueued(3)
			rec.Request = &job.Request{Command: []string{"true"}}
		default:
			kind = queue.KindState
		}
		ver := Version{Seq: seq, Kind: kind, Rec: rec, CAS: !x.noCAS}
		switch {
		case x.noCAS:
		case x.expect != nil:
			ver.Expected = *x.expect
		case i > 0:
			ver.Expected = out[i-1].Seq
		}
		out = append(out, ver)
	}
	return out
}

var (
	queued   = v{state: job.StateQueued, event: job.EventQueued}
	rejected = v{state: job.StateRejected, event: job.EventRejected}
	// rejectedBefore is a rejection as dispatchers wrote it before kind x.
	rejectedBefore = v{state: job.StateRejected, event: job.EventRejected, kind: queue.KindState}
)

func running(n int) v { return v{state: job.StateRunning, attempt: n, event: job.EventStarted} }
func retrying(n int) v {
	return v{state: job.StateRetrying, attempt: n, event: job.EventRetryScheduled}
}

// heartbeat is a version that keeps attempt n running: adopted, awaiting
// its owner, a cancel requested.
func heartbeat(n int, phase string) v {
	return v{state: job.StateRunning, attempt: n, event: job.EventHeartbeat, phase: phase}
}

func adopted(n int) v   { return heartbeat(n, job.PhaseAdopted) }
func awaiting(n int) v  { return heartbeat(n, job.PhaseAwaitingOwner) }
func cancelAsk(n int) v { return heartbeat(n, job.PhaseCancelRequested) }

// requeued is what a draining worker writes when it gives its attempt
// back: the job queued at attempt n, its handbacks counted.
func requeued(n, handbacks int) v {
	return v{state: job.StateQueued, attempt: n, handbacks: handbacks, event: job.EventQueued}
}

func succeeded(n int) v { return v{state: job.StateSucceeded, attempt: n, event: job.EventSucceeded} }
func failed(n int) v    { return v{state: job.StateFailed, attempt: n, event: job.EventFailed} }
func cancelled(n int) v { return v{state: job.StateCancelled, attempt: n, event: job.EventCancelled} }

// with returns x changed by f.
func with(x v, f func(*v)) v { f(&x); return x }

// handedBack is a version a requeue writes, with its handbacks counted
// from the history before it.
func handedBack(x v, handbacks int) v { x.handbacks = handbacks; return x }

// TestCheck holds Check to each rule: the histories the fleet writes pass,
// and each way of breaking the promise is caught, with what it says.
func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name string
		vs   []Version
		// want are the beginnings of the violations, in order; none for
		// a legitimate history.
		want []string
	}{
		// Legitimate histories.
		{"succeeded at once", history(queued, running(1), succeeded(1)), nil},
		{"failed, retried, then failed for good", history(queued, running(1), retrying(1), running(2), failed(2)), nil},
		{"an attempt lost with its worker, run again", history(queued, running(1), running(2), succeeded(2)), nil},
		{"lost more than max_lost: the last lost attempt is the result's",
			history(queued, running(1), running(2), failed(2)), nil},
		{"cancelled while queued", history(queued, cancelled(0)), nil},
		{"cancelled while running", history(queued, running(1), cancelAsk(1), cancelled(1)), nil},
		{"timed out in the queue", history(queued, v{state: job.StateTimedOut, event: job.EventTimedOut}), nil},
		{"a rejection replaced by a submission", history(rejected, queued, running(1), succeeded(1)), nil},
		{"a rejection replaced by another", history(rejected, rejected), nil},
		{"a rejection of kind s, written before kind x, replaced", history(rejectedBefore, rejected, queued, running(1), succeeded(1)), nil},
		{"a first attempt handed back by a draining worker",
			history(queued, running(1), requeued(0, 1), running(1), succeeded(1)), nil},
		{"a second attempt handed back", history(queued, running(1), retrying(1), running(2), requeued(1, 1), running(2), succeeded(2)), nil},
		{"a delivery handed back before it ran (nothing given back)",
			history(queued, handedBack(queued, 1), running(1), succeeded(1)), nil},
		{"adopted: the attempt keeps its number",
			history(queued, running(1), adopted(1), succeeded(1)), nil},
		{"adopted, and the attempt had ended meanwhile (it failed)",
			history(queued, running(1), adopted(1), failed(1)), nil},
		{"adopted twice", history(queued, running(1), adopted(1), adopted(1), succeeded(1)), nil},
		{"a draining worker hands back a delivery of another's attempt, which is then adopted",
			history(queued, running(1), v{state: job.StateRunning, attempt: 1, handbacks: 1, event: job.EventQueued}, adopted(1), succeeded(1)), nil},
		{"awaiting its owner, then lost and run again", history(queued, running(1), awaiting(1), running(2), succeeded(2)), nil},
		{"awaiting its owner, which came back and adopted it", history(queued, running(1), awaiting(1), adopted(1), succeeded(1)), nil},
		{"not finished yet (Violations says whether it must be)", history(queued, running(1)), nil},
		{"a malformed job message refused", history(queued, failed(0)), nil},

		// Violations.
		{"a second final version", history(queued, running(1), succeeded(1), succeeded(1)),
			[]string{"a second final version: 40 r succeeded attempt 1 (expecting 30) after 30 r succeeded"}},
		{"a second final version with another outcome", history(queued, running(1), succeeded(1), running(2), failed(2)),
			[]string{"a running version written against its final version", "a second final version: 50 r failed"}},
		{"a version after the final one", history(queued, running(1), succeeded(1), retrying(1)),
			[]string{"a version after its final one: 40 s retrying"}},
		{"a running version against the final one", history(queued, running(1), succeeded(1), running(2)),
			[]string{"a running version written against its final version: 40 s running attempt 2 (expecting 30) over 30 r succeeded"}},
		{"a running version after the final one, against another", history(queued, running(1), succeeded(1), with(running(2), func(x *v) { x.expect = at(20) })),
			[]string{"version 40 s running attempt 2 (expecting 20) was written against 20", "a version after its final one: 40 s running"}},
		{"an attempt number going back", history(queued, running(1), retrying(1), running(2), running(1), succeeded(1)),
			[]string{"its attempt number goes back from 2 to 1 at version 50 s running attempt 1"}},
		{"a requeue without a handback counted", history(queued, running(1), requeued(0, 0), running(1), succeeded(1)),
			[]string{"its attempt number goes back from 1 to 0 at version 30 s queued"}},
		{"a requeue giving back two attempts", history(queued, running(1), running(2), requeued(0, 1), running(1), succeeded(1)),
			[]string{"its attempt number goes back from 2 to 0"}},
		{"a handback that is not a requeue", history(queued, running(1), retrying(1), running(2), handedBack(retrying(1), 1), running(2), succeeded(2)),
			[]string{"its attempt number goes back from 2 to 1 at version 50 s retrying"}},
		{"an adoption of an earlier attempt", history(queued, running(1), retrying(1), running(2), adopted(1), succeeded(1)),
			[]string{"its attempt number goes back from 2 to 1 at version 50 s running"}},
		{"a final version with fewer attempts than ran", history(queued, running(1), running(2), succeeded(1)),
			[]string{"its attempt number goes back from 2 to 1 at version 40 r succeeded"}},
		{"a version without a compare-and-set", history(queued, with(running(1), func(x *v) { x.noCAS = true }), succeeded(1)),
			[]string{"version 20 s running attempt 1 (expecting 0) was written without a compare-and-set"}},
		{"a version against an older one", history(queued, running(1), with(succeeded(1), func(x *v) { x.expect = at(10) })),
			[]string{"version 30 r succeeded attempt 1 (expecting 10) was written against 10, not against the version before it (20)"}},
		{"a first version that does not queue the job", history(running(1), succeeded(1)),
			[]string{"its first version is not the one that queued it: 10 s running"}},
		{"a first version that is final", history(succeeded(1)),
			[]string{"its first version is not the one that queued it: 10 r succeeded"}},
		{"a version of kind x that is not a rejection", history(queued, with(running(1), func(x *v) { x.kind = queue.KindRejected }), succeeded(1)),
			[]string{"version 20 x running attempt 1 (expecting 10) is of kind x, which only rejections are"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Check("default/j", tc.vs)
			if len(got) != len(tc.want) {
				t.Fatalf("%d violations, want %d:\n%s", len(got), len(tc.want), lines(got))
			}
			for i, w := range tc.want {
				if got[i].Job != "default/j" || !strings.HasPrefix(got[i].What, w) {
					t.Errorf("violation %d: %s; want %q", i, got[i], w)
				}
			}
		})
	}
}

func lines(vs []Violation) string {
	var s []string
	for _, v := range vs {
		s = append(s, "  "+v.String())
	}
	return strings.Join(s, "\n")
}

// TestViolationsOfAPool: a job of ids with no final version, or no version
// at all, is caught; one not among ids may be unfinished.
func TestViolationsOfAPool(t *testing.T) {
	p := &Pool{Jobs: map[string][]Version{
		"default/done":    history(queued, running(1), succeeded(1)),
		"default/running": history(queued, running(1)),
		"default/twice":   history(queued, running(1), succeeded(1), succeeded(1)),
	}}
	var got []string
	for _, v := range p.Violations([]string{"default/done", "default/running", "default/lost"}) {
		got = append(got, v.String())
	}
	want := []string{
		"default/twice: a second final version",
		"default/running: no final version; its last is 20 s running attempt 1 (expecting 10)",
		"default/lost: lost: no version of it in the stream",
	}
	if len(got) != len(want) {
		t.Fatalf("violations:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("violation %d: %s; want %s", i, got[i], want[i])
		}
	}
	if vs := p.Violations(nil); len(vs) != 1 {
		t.Errorf("without ids: %v; want only the second final version", vs)
	}
	if onlyUnfinished(p.Violations([]string{"default/running"})) {
		t.Error("a second final version is not explained by a replica that was behind")
	}
	if !onlyUnfinished((&Pool{Jobs: map[string][]Version{"default/running": history(queued, running(1))}}).Violations([]string{"default/running", "default/lost"})) {
		t.Error("an unfinished and a lost job may be a replica that was behind")
	}
}

// TestEar: two results of a job are two stream sequences; one heard again
// with its sequence is one result, republished.
func TestEar(t *testing.T) {
	e := &Ear{heard: map[string]map[string]int{}}
	hear := func(id, seq string) {
		if e.heard[id] == nil {
			e.heard[id] = map[string]int{}
		}
		e.heard[id][seq]++
	}
	hear("once", "30")
	hear("again", "31")
	hear("again", "31")
	hear("twice", "32")
	hear("twice", "40")
	if got := e.Twice(); !slices.Equal(got, []string{"twice"}) {
		t.Errorf("Twice: %v, want [twice]", got)
	}
	if e.Heard("once") != 1 || e.Heard("again") != 1 || e.Heard("twice") != 2 || e.Heard("none") != 0 {
		t.Errorf("Heard: once %d, again %d, twice %d, none %d", e.Heard("once"), e.Heard("again"), e.Heard("twice"), e.Heard("none"))
	}
	if n := e.Repeats(); n != 1 {
		t.Errorf("Repeats: %d, want 1", n)
	}
}
