package job

import (
	"errors"
	"fmt"
	"math"
)

// The messages of a run that the runs' stream keeps (schema
// run-record.v1): its definition (RunRecord), the ends of its nodes
// (NodeEnded), its cancels (RunCancel), retries (RunRetry) and the
// summaries its rounds end with (RunEnd). The decoders below read them
// strictly and check them as the schema does, and for what it cannot say:
// a definition's graph, as a run request's, and that a job id names the
// run, node and round of the document it is in.

// DecodeRunRecord decodes and validates a run's definition (schema
// run-record.v1, definition).
func DecodeRunRecord(data []byte) (*RunRecord, error) {
	return decodeRunMessage[RunRecord]("run record", data, "run_id", "tenant", "submitted_at", "nodes")
}

// DecodeNodeEnded decodes and validates the end of a run's node (schema
// run-record.v1, node_ended).
func DecodeNodeEnded(data []byte) (*NodeEnded, error) {
	return decodeRunMessage[NodeEnded]("node end", data, "run_id", "node_id", "job_id", "pool", "round", "state", "at")
}

// DecodeRunCancel decodes and validates a cancel of a run's round (schema
// run-record.v1, cancel).
func DecodeRunCancel(data []byte) (*RunCancel, error) {
	return decodeRunMessage[RunCancel]("run cancel", data, "run_id", "tenant", "round", "requested_at")
}

// DecodeRunRetry decodes and validates the retry that starts a run's
// round (schema run-record.v1, retry).
func DecodeRunRetry(data []byte) (*RunRetry, error) {
	return decodeRunMessage[RunRetry]("run retry", data, "run_id", "tenant", "round", "nodes", "requested_at")
}

// DecodeRunEnd decodes and validates the summary of a run's round (schema
// run-record.v1, end).
func DecodeRunEnd(data []byte) (*RunEnd, error) {
	return decodeRunMessage[RunEnd]("run end", data, "run_id", "tenant", "round", "state", "submitted_at", "finished_at", "nodes")
}

// decodeRunMessage decodes data strictly into a T, checks that it has the
// required keys, and validates it.
func decodeRunMessage[T any, P interface {
	*T
	Validate() error
}](what string, data []byte, required ...string) (*T, error) {
	var m T
	if err := decodeStrict(data, &m); err != nil {
		return nil, fmt.Errorf("invalid %s: %w", what, err)
	}
	if err := requireKeys(data, required...); err != nil {
		return nil, fmt.Errorf("invalid %s: %w", what, err)
	}
	if err := P(&m).Validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

// Validate checks a run's definition: its id, tenant and time, the rules
// of the run request it was accepted as (its nodes' jobs to the values of
// their fields, not to sizes, which a fleet's limits may raise), and each
// node's pool, priority and secrets.
func (r *RunRecord) Validate() error {
	var v validator
	v.runID("run_id", r.RunID)
	v.tenant("tenant", r.Tenant)
	if r.SubmittedAt.IsZero() {
		v.add("submitted_at", "is required")
	}
	v.traceID(r.TraceID)
	// The rules of a run request; its id is run_id, checked above.
	req := &RunRequest{Labels: r.Labels, Nodes: make([]RunNode, len(r.Nodes))}
	if ValidRunID(r.RunID) {
		req.ID = r.RunID
	}
	for i, n := range r.Nodes {
		req.Nodes[i] = RunNode{ID: n.ID, After: n.After, InputsFrom: n.InputsFrom, When: n.When, Job: n.Job}
	}
	var re *RunError
	if err := req.Validate(recordLimits, RunLimits{MaxNodes: math.MaxInt}); errors.As(err, &re) {
		v.problems = append(v.problems, re.Problems...)
	}
	for i, n := range r.Nodes {
		where := nodeField(i, n.ID)
		if !ValidPool(n.Pool) {
			v.add(where+".pool", "%q must be 1 to 64 characters of [A-Za-z0-9_-]", truncate(n.Pool, 70))
		}
		if n.Priority < HighestPriority || n.Priority > LowestPriority {
			v.add(where+".priority", "%d must be from %d (highest) to %d (lowest)", n.Priority, HighestPriority, LowestPriority)
		}
		if n.Job != nil && n.Job.Pool != "" && n.Job.Pool != n.Pool {
			v.add(where+".job.pool", "%q is not the node's pool %q", truncate(n.Job.Pool, 70), truncate(n.Pool, 70))
		}
		if n.Job != nil && n.Job.Priority != 0 && n.Job.Priority != n.Priority {
			v.add(where+".job.priority", "%d is not the node's priority %d", n.Job.Priority, n.Priority)
		}
		if n.Secrets != "" && !secretsRE.MatchString(n.Secrets) {
			v.add(where+".secrets", "is not a sealed text")
		}
	}
	return v.errAs("run record")
}

// Validate checks the end of a run's node: its job's id names the run,
// the node and the round, and its state is final, with a code unless it
// succeeded.
func (e *NodeEnded) Validate() error {
	var v validator
	v.runID("run_id", e.RunID)
	if !ValidNodeID(e.NodeID) {
		v.add("node_id", "%q must be 1 to 64 characters of [A-Za-z0-9_-]", truncate(e.NodeID, 70))
	}
	if !ValidPool(e.Pool) {
		v.add("pool", "%q must be 1 to 64 characters of [A-Za-z0-9_-]", truncate(e.Pool, 70))
	}
	if e.Round < 1 {
		v.add("round", "%d must be at least 1", e.Round)
	}
	if round, ok := v.nodeJob("job_id", e.JobID, e.RunID, e.NodeID); ok && e.Round >= 1 && round != e.Round {
		v.add("job_id", "%s is the job of round %d, not of round %d", e.JobID, round, e.Round)
	}
	v.nodeOutcome("", e.State, e.Code)
	if e.At.IsZero() {
		v.add("at", "is required")
	}
	return v.errAs("node end")
}

// Validate checks a cancel of a run's round.
func (c *RunCancel) Validate() error {
	var v validator
	v.runID("run_id", c.RunID)
	v.tenant("tenant", c.Tenant)
	if c.Round < 1 {
		v.add("round", "%d must be at least 1", c.Round)
	}
	if c.RequestedAt.IsZero() {
		v.add("requested_at", "is required")
	}
	return v.errAs("run cancel")
}

// Validate checks a retry of a run: it starts round 2 or a later one, and
// names the nodes it runs again, each once.
func (rt *RunRetry) Validate() error {
	var v validator
	v.runID("run_id", rt.RunID)
	v.tenant("tenant", rt.Tenant)
	if rt.Round < 2 {
		v.add("round", "%d must be at least 2: a retry starts the round after the first, or a later one", rt.Round)
	}
	if len(rt.Nodes) == 0 {
		v.add("nodes", "a retry runs at least one node again")
	}
	seen := map[string]bool{}
	for i, id := range rt.Nodes {
		switch {
		case !ValidNodeID(id):
			v.add(fmt.Sprintf("nodes[%d]", i), "%q must be 1 to 64 characters of [A-Za-z0-9_-]", truncate(id, 70))
		case seen[id]:
			v.add(fmt.Sprintf("nodes[%d]", i), "%q is named twice", id)
		}
		seen[id] = true
	}
	if rt.RequestedAt.IsZero() {
		v.add("requested_at", "is required")
	}
	return v.errAs("run retry")
}

// Validate checks the summary of a run's round: every node once, each
// with a job of the run and the node from this round or an earlier one,
// ended; and the run's state as its nodes' ends make it (see RunState).
func (e *RunEnd) Validate() error {
	var v validator
	v.runID("run_id", e.RunID)
	v.tenant("tenant", e.Tenant)
	if e.Round < 1 {
		v.add("round", "%d must be at least 1", e.Round)
	}
	if !e.State.Final() {
		v.add("state", "%q is not a state a run ends in: succeeded, failed or cancelled", truncate(string(e.State), 40))
	}
	if e.SubmittedAt.IsZero() {
		v.add("submitted_at", "is required")
	}
	if e.FinishedAt.IsZero() {
		v.add("finished_at", "is required")
	}
	if len(e.Nodes) == 0 {
		v.add("nodes", "a run has at least one node")
	}
	seen := map[string]int{}
	failed := ""
	for i, n := range e.Nodes {
		where := nodeField(i, n.ID)
		if !ValidNodeID(n.ID) {
			v.add(where+".id", "%q must be 1 to 64 characters of [A-Za-z0-9_-]", truncate(n.ID, 70))
		} else if j, dup := seen[n.ID]; dup {
			v.add(where+".id", "also the id of nodes[%d]", j)
		} else {
			seen[n.ID] = i
		}
		if round, ok := v.nodeJob(where+".job_id", n.JobID, e.RunID, n.ID); ok && e.Round >= 1 && round > e.Round {
			v.add(where+".job_id", "%s is a job of round %d, after this round %d", n.JobID, round, e.Round)
		}
		if !ValidPool(n.Pool) {
			v.add(where+".pool", "%q must be 1 to 64 characters of [A-Za-z0-9_-]", truncate(n.Pool, 70))
		}
		v.nodeOutcome(where+".", n.State, n.Code)
		if failed == "" && !notFailed(n.State, n.Code) {
			failed = n.ID
		}
	}
	switch {
	case e.State == RunSucceeded && failed != "":
		v.add("state", "succeeded, but node %s did not", failed)
	case e.State == RunFailed && failed == "" && len(e.Nodes) > 0:
		v.add("state", "failed, but every node succeeded or was not needed")
	}
	return v.errAs("run end")
}

// notFailed reports whether a node that ended so counts as done for its
// run: it succeeded, or was not needed (its rule did not hold).
func notFailed(s State, c FailureCode) bool {
	return s == StateSucceeded || s == StateCancelled && c == CodeNotTriggered
}

func (v *validator) runID(field, id string) {
	if !ValidRunID(id) {
		v.add(field, "%q must be 1 to 63 characters of [A-Za-z0-9_-]", truncate(id, 70))
	}
}

func (v *validator) tenant(field, t string) {
	if !ValidTenant(t) {
		v.add(field, "%q must be 1 to 64 characters of [A-Za-z0-9_-]", truncate(t, 70))
	}
}

// nodeJob checks that id is the id of a job of node of run, and returns
// its round.
func (v *validator) nodeJob(field, id, run, node string) (int, bool) {
	r, n, round, ok := ParseRunJobID(id)
	switch {
	case !ok:
		v.add(field, "%q is not the id of a run's node's job: <run>:<node>, or <run>:<node>:<round> from round 2 on", truncate(id, 140))
		return 0, false
	case r != run || n != node:
		v.add(field, "%s is a job of node %s of run %s, not of node %s of run %s", id, n, r, truncate(node, 70), truncate(run, 70))
		return 0, false
	}
	return round, true
}

// nodeOutcome checks how a node's job ended: a final state, with the code
// of its failure unless it succeeded.
func (v *validator) nodeOutcome(prefix string, s State, c FailureCode) {
	switch {
	case !s.Final():
		v.add(prefix+"state", "%q is not a final state of a job", truncate(string(s), 40))
	case s == StateSucceeded && c != "":
		v.add(prefix+"code", "must be absent when the job succeeded")
	case s != StateSucceeded && c == "":
		v.add(prefix+"code", "is required when the job did not succeed")
	}
}
