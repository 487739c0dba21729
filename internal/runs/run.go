// Package runs releases the nodes of runs: a run is a graph of jobs
// submitted at once (job.RunRequest), whose every node is queued as an
// ordinary job the moment the nodes it comes after have ended as its rule
// asks, by the fleet itself, from the messages of the runs' stream
// (queue.Runs): a node's job's end is the event that releases the nodes
// after it. See Releaser.
package runs

import (
	"sync/atomic"
	"time"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// run is what the releaser knows of one run: its graph, its round, and
// which of its nodes' jobs in that round have ended. Everything it
// decides is decided here, without reading or writing anything, so that
// each rule is a unit test.
type run struct {
	tenant, id string
	rec        *job.RunRecord
	index      map[string]int
	parents    [][]int
	children   [][]int
	order      []int

	// round is the run's last; nodeRound the round each node's job was
	// last queued in (a retry runs some nodes again, as new jobs).
	round     int
	nodeRound []int
	// cancelled: the round was cancelled; ended: it has its summary
	// (written by the work a message called for, beside the next
	// messages).
	cancelled bool
	ended     atomic.Bool
	// ends are the ends of the nodes' jobs of the round, as said by
	// their NodeEnded messages; endedParents counts, per node, its
	// parents whose job in the round has ended.
	ends         []*job.NodeEnded
	endedCount   int
	endedParents []int
}

// newRun builds what is known of a run from its definition, what its
// rounds say, and the last end written on each subject of its nodes'
// ends (the ends of a node written on another pool's subject than the
// node's are ignored).
func newRun(rec *job.RunRecord, rounds *queue.RunRounds, ends []*job.NodeEnded) *run {
	n := len(rec.Nodes)
	r := &run{tenant: rec.Tenant, id: rec.RunID, rec: rec, index: make(map[string]int, n),
		parents: make([][]int, n), children: make([][]int, n), nodeRound: make([]int, n),
		ends: make([]*job.NodeEnded, n), endedParents: make([]int, n), round: 1}
	for i, nd := range rec.Nodes {
		r.index[nd.ID] = i
		r.nodeRound[i] = 1
	}
	for i, nd := range rec.Nodes {
		for _, p := range nd.After {
			j := r.index[p]
			r.parents[i] = append(r.parents[i], j)
			r.children[j] = append(r.children[j], i)
		}
	}
	req := &job.RunRequest{Nodes: make([]job.RunNode, n)}
	for i, nd := range rec.Nodes {
		req.Nodes[i] = job.RunNode{ID: nd.ID, After: nd.After}
	}
	r.order = req.Order()
	if rounds != nil {
		for _, rt := range rounds.Retries {
			for _, id := range rt.Nodes {
				if i, ok := r.index[id]; ok {
					r.nodeRound[i] = rt.Round
				}
			}
			r.round = max(r.round, rt.Round)
		}
		r.cancelled = rounds.Cancelled[r.round]
		r.ended.Store(rounds.Ended[r.round] != nil)
	}
	for _, e := range ends {
		r.apply(e)
	}
	return r
}

// jobID is the id of node i's job in the run's round.
func (r *run) jobID(i int) string { return job.RunJobID(r.id, r.rec.Nodes[i].ID, r.nodeRound[i]) }

// key is the job key of node i's job.
func (r *run) key(i int) queue.JobKey {
	return queue.JobKey{Tenant: r.tenant, Pool: r.rec.Nodes[i].Pool, ID: r.jobID(i)}
}

// apply notes that a node's job ended, and returns the node; false when
// the end says nothing new: a node not of the run, a job of another round
// or pool than the node's, or an end known already.
func (r *run) apply(e *job.NodeEnded) (int, bool) {
	i, ok := r.index[e.NodeID]
	if !ok || e.RunID != r.id || e.Pool != r.rec.Nodes[i].Pool || e.JobID != r.jobID(i) || !e.State.Final() {
		return 0, false
	}
	if r.ends[i] != nil {
		return i, false
	}
	r.ends[i] = e
	r.endedCount++
	for _, c := range r.children[i] {
		r.endedParents[c]++
	}
	return i, true
}

// outcome is what a node's end means to the nodes after it.
type outcome int

const (
	succeeded outcome = iota
	// skipped: not run because its rule did not hold (not_triggered):
	// neither a success nor a failure.
	skipped
	failed // failed, timed out, or cancelled
)

func outcomeOf(e *job.NodeEnded) outcome {
	switch {
	case e.State == job.StateSucceeded:
		return succeeded
	case e.State == job.StateCancelled && e.Code == job.CodeNotTriggered:
		return skipped
	}
	return failed
}

// verb is what happens to a node whose parents have all ended.
type verb int

const (
	wait    verb = iota // a parent has not ended yet
	release             // queue its job
	skip                // end it without running it, with a code
)

// verdict is what becomes of node i as its parents stand: wait while one
// has not ended; then, by its rule, release it or skip it, with the code
// and message its end says. A cancelled round releases nothing more: its
// nodes that had not ended end cancelled, whatever their parents did.
func (r *run) verdict(i int) (verb, job.FailureCode, string) {
	if r.endedParents[i] < len(r.parents[i]) {
		return wait, "", ""
	}
	var fail, skipOf string
	for _, p := range r.parents[i] {
		switch outcomeOf(r.ends[p]) {
		case failed:
			if fail == "" {
				fail = r.rec.Nodes[p].ID
			}
		case skipped:
			if skipOf == "" {
				skipOf = r.rec.Nodes[p].ID
			}
		}
	}
	v, code, why := release, job.FailureCode(""), ""
	switch r.rec.Nodes[i].When.Or() {
	case job.WhenAllSucceeded:
		switch {
		case fail != "":
			v, code, why = skip, job.CodeUpstreamFailed, "node "+fail+" did not succeed"
		case skipOf != "":
			v, code, why = skip, job.CodeNotTriggered, "node "+skipOf+" was not run"
		}
	case job.WhenAnyFailed:
		if fail == "" {
			v, code, why = skip, job.CodeNotTriggered, "every node it comes after succeeded"
		}
	}
	if r.cancelled {
		// Every node of a cancelled round that had not ended ends so.
		return skip, job.CodeCancelled, "the run was cancelled"
	}
	return v, code, why
}

// ready lists the nodes of the round that are not ended and whose parents
// all have: what a run's definition, or a retry, starts with.
func (r *run) ready() []int {
	var out []int
	for _, i := range r.order {
		if r.ends[i] == nil && r.endedParents[i] == len(r.parents[i]) {
			out = append(out, i)
		}
	}
	return out
}

// complete reports whether every node of the round has ended.
func (r *run) complete() bool { return r.endedCount == len(r.rec.Nodes) }

// state is the state the round ends in (see job.RunState).
func (r *run) state() job.RunState {
	if r.cancelled {
		return job.RunCancelled
	}
	for _, e := range r.ends {
		if e == nil || outcomeOf(e) == failed {
			return job.RunFailed
		}
	}
	return job.RunSucceeded
}

// summary is the round's end, once complete.
func (r *run) summary(now time.Time) *job.RunEnd {
	e := &job.RunEnd{RunID: r.id, Tenant: r.tenant, Round: r.round, State: r.state(), SubmittedAt: r.rec.SubmittedAt,
		FinishedAt: now, Nodes: make([]job.NodeState, len(r.rec.Nodes))}
	for i, nd := range r.rec.Nodes {
		s := job.NodeState{ID: nd.ID, JobID: r.jobID(i), Pool: nd.Pool}
		if end := r.ends[i]; end != nil {
			s.State, s.Code = end.State, end.Code
		}
		e.Nodes[i] = s
	}
	return e
}

// retrySet is what a retry of the run's ended round runs again: its nodes
// that did not succeed (skipped ones too), and every node after them; the
// others keep their jobs and results.
func (r *run) retrySet() []string {
	again := make([]bool, len(r.rec.Nodes))
	for _, i := range r.order {
		if e := r.ends[i]; e == nil || outcomeOf(e) != succeeded {
			again[i] = true
		}
		for _, p := range r.parents[i] {
			again[i] = again[i] || again[p]
		}
	}
	var out []string
	for _, i := range r.order {
		if again[i] {
			out = append(out, r.rec.Nodes[i].ID)
		}
	}
	return out
}
