package job

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// A run is a graph of jobs submitted at once: its nodes, each a job
// request with an id of its own in the run, the nodes it comes after, and
// which of their outputs become its inputs (schema run-request.v1). The
// fleet queues a node as an ordinary job, with the id RunJobID(run, node),
// the moment the nodes it comes after have ended as its When rule asks.
type RunRequest struct {
	// ID names the run among its tenant's runs and is its idempotency
	// key: a second run with the same id is not run again. Generated when
	// empty.
	ID string `json:"id,omitempty"`
	// Labels go onto every node's job (a node's own label of the same key
	// wins).
	Labels map[string]string `json:"labels,omitempty"`
	Nodes  []RunNode         `json:"nodes"`
}

// RunNode is one node of a run.
type RunNode struct {
	// ID names the node in its run: 1 to 64 characters of [A-Za-z0-9_-].
	ID string `json:"id"`
	// After names the nodes this one comes after: it is queued once they
	// have all ended, as When says.
	After []string `json:"after,omitempty"`
	// InputsFrom makes outputs of the nodes it comes after into inputs of
	// its own, by name: the output, as its job's result holds it (inline
	// text, or a stored object, by reference), becomes the input.
	InputsFrom map[string]OutputOf `json:"inputs_from,omitempty"`
	// When says what the nodes it comes after must have done for this one
	// to run. Defaults to WhenAllSucceeded.
	When When `json:"when,omitempty"`
	// Job is the node's request. Its id, run_id and node_id are the
	// fleet's to set.
	Job *Request `json:"job"`
}

// OutputOf names an output of another node of the run.
type OutputOf struct {
	Node   string `json:"node"`
	Output string `json:"output"`
}

// When is a node's rule over the nodes it comes after.
type When string

// The rules. A node whose rule cannot hold any more ends cancelled without
// running: code upstream_failed under all_succeeded (a node it comes after
// did not succeed), code not_triggered under any_failed (every one of them
// succeeded).
const (
	// WhenAllSucceeded runs the node once every node it comes after
	// succeeded (the default).
	WhenAllSucceeded When = "all_succeeded"
	// WhenAllDone runs it once every one of them has ended, however: a
	// report or a clean-up.
	WhenAllDone When = "all_done"
	// WhenAnyFailed runs it once every one of them has ended and at least
	// one did not succeed (failed, timed out, or cancelled): a handler of
	// failures.
	WhenAnyFailed When = "any_failed"
)

// Or returns w, or the default rule when w is empty.
func (w When) Or() When {
	if w == "" {
		return WhenAllSucceeded
	}
	return w
}

// Failure codes of the nodes a run ends without running them.
const (
	CodeUpstreamFailed FailureCode = "upstream_failed" // a node it comes after did not succeed
	CodeNotTriggered   FailureCode = "not_triggered"   // its rule (any_failed) did not hold: every node before it succeeded
)

// DefaultMaxRunNodes bounds the nodes of one run.
const DefaultMaxRunNodes = 10000

// ValidRunID reports whether s may name a run: 1 to 63 characters of
// [A-Za-z0-9_-] (a node's job id is the run's, a colon, and the node's).
func ValidRunID(s string) bool { return len(s) <= 63 && ValidPool(s) }

// ValidNodeID reports whether s may name a node of a run: 1 to 64
// characters of [A-Za-z0-9_-].
func ValidNodeID(s string) bool { return ValidPool(s) }

// RunJobID is the id of the job of node of run in its round: the run's
// id, a colon and the node's, and for a node run again by a retry of the
// run (round 2 and later), a colon and the round. No id a producer submits
// has a colon, so a run's jobs take no other job's id.
func RunJobID(run, node string, round int) string {
	if round <= 1 {
		return run + ":" + node
	}
	return run + ":" + node + ":" + strconv.Itoa(round)
}

// ParseRunJobID returns the run, node and round a run's job id names.
func ParseRunJobID(id string) (run, node string, round int, ok bool) {
	parts := strings.Split(id, ":")
	switch {
	case len(parts) == 2:
		round = 1
	case len(parts) == 3:
		r, err := strconv.Atoi(parts[2])
		if err != nil || r < 2 || strconv.Itoa(r) != parts[2] {
			return "", "", 0, false
		}
		round = r
	default:
		return "", "", 0, false
	}
	if !ValidRunID(parts[0]) || !ValidNodeID(parts[1]) {
		return "", "", 0, false
	}
	return parts[0], parts[1], round, true
}

// RunLimits bound a run beside the limits of each node's request.
type RunLimits struct {
	// MaxNodes defaults to DefaultMaxRunNodes.
	MaxNodes int
	// MaxBytes bounds the run's document (the server's max payload holds
	// its definition); 0: no bound.
	MaxBytes int
}

// DecodeRunRequest decodes a run strictly: an unknown field, in the run, a
// node or a node's job, is an error that names it.
func DecodeRunRequest(data []byte, l RunLimits) (*RunRequest, error) {
	if l.MaxBytes > 0 && len(data) > l.MaxBytes {
		return nil, &RunError{Problems: []string{fmt.Sprintf("the run is %d bytes, over the limit of %d", len(data), l.MaxBytes)}}
	}
	var r RunRequest
	if err := decodeStrict(data, &r); err != nil {
		return nil, &RunError{Problems: decodeProblems(data, err)}
	}
	return &r, nil
}

// decodeProblems says where in a run a decoding error is: each node is
// decoded again alone, and its job alone, so that a problem names the
// node and the field (nodes[1] (b).job: unknown field "tenant"). err is
// the problem when no node has one.
func decodeProblems(data []byte, err error) []string {
	var doc struct {
		Nodes []json.RawMessage `json:"nodes"`
	}
	if json.Unmarshal(data, &doc) != nil {
		return []string{err.Error()}
	}
	var out []string
	for i, raw := range doc.Nodes {
		var named struct {
			ID string `json:"id"`
		}
		_ = json.Unmarshal(raw, &named)
		where := nodeField(i, named.ID)
		var n struct {
			RunNode
			Job json.RawMessage `json:"job"`
		}
		if err := decodeStrict(raw, &n); err != nil {
			out = append(out, where+": "+err.Error())
			continue
		}
		if len(n.Job) > 0 {
			if err := decodeStrict(n.Job, new(Request)); err != nil {
				out = append(out, where+".job: "+err.Error())
			}
		}
	}
	if len(out) == 0 {
		return []string{err.Error()}
	}
	return out
}

// Validate checks a run whole: its id, every node's id, what it comes
// after and its rule, every node's request against l, that the graph
// has no cycle, and that every input from another node names a node this
// one comes after and an output that node declares. Each problem names
// the node (its index and id) and the field.
func (r *RunRequest) Validate(l Limits, rl RunLimits) error {
	var v validator
	if r.ID != "" && !ValidRunID(r.ID) {
		v.add("id", "%q must be 1 to 63 characters of [A-Za-z0-9_-]", truncate(r.ID, 70))
	}
	for _, k := range slices.Sorted(maps.Keys(r.Labels)) {
		if err := ValidateLabel(k, r.Labels[k]); err != nil {
			v.add("labels", "%v", err)
		}
	}
	if len(r.Labels) > l.WithDefaults().MaxLabels {
		v.add("labels", "%d labels, over the limit of %d", len(r.Labels), l.WithDefaults().MaxLabels)
	}
	max := rl.MaxNodes
	if max <= 0 {
		max = DefaultMaxRunNodes
	}
	switch {
	case len(r.Nodes) == 0:
		v.add("nodes", "a run needs at least one node")
	case len(r.Nodes) > max:
		v.add("nodes", "%d nodes, over the limit of %d", len(r.Nodes), max)
		return v.runErr()
	}
	index := make(map[string]int, len(r.Nodes))
	for i, n := range r.Nodes {
		at := func(field string) string { return nodeField(i, n.ID) + field } // made only for a problem
		switch {
		case !ValidNodeID(n.ID):
			v.add(at(".id"), "%q must be 1 to 64 characters of [A-Za-z0-9_-]", truncate(n.ID, 70))
		default:
			if j, dup := index[n.ID]; dup {
				v.add(at(".id"), "also the id of nodes[%d]: a node's id is unique in its run", j)
			} else {
				index[n.ID] = i
			}
		}
	}
	for i, n := range r.Nodes {
		at := func(field string) string { return nodeField(i, n.ID) + field } // made only for a problem
		seen := make(map[string]bool, len(n.After))
		for _, p := range n.After {
			switch _, ok := index[p]; {
			case p == n.ID:
				v.add(at(".after"), "the node comes after itself")
			case !ok:
				v.add(at(".after"), "%q is not a node of the run", truncate(p, 70))
			case seen[p]:
				v.add(at(".after"), "%q is named twice", p)
			}
			seen[p] = true
		}
		switch n.When {
		case "", WhenAllSucceeded, WhenAllDone, WhenAnyFailed:
		default:
			v.add(at(".when"), "%q is not a rule: all_succeeded, all_done or any_failed", truncate(string(n.When), 40))
		}
		if n.When == WhenAnyFailed && len(n.After) == 0 {
			v.add(at(".when"), "any_failed needs nodes to come after")
		}
		if n.Job == nil {
			v.add(at(".job"), "is required: the node's request")
			continue
		}
		switch {
		case n.Job.ID != "":
			v.add(at(".job.id"), "is the fleet's to set: the node's job is %s", RunJobID(orRun(r.ID), n.ID, 1))
		case n.Job.RunID != "" || n.Job.NodeID != "":
			v.add(at(".job"), "run_id and node_id are the fleet's to set for a run's node")
		}
		// The node's job carries the run's labels and its own: together,
		// a key of both counted once, within a job's limit (each alone
		// over it is a problem of its own).
		if max := l.WithDefaults().MaxLabels; len(r.Labels) <= max && len(n.Job.Labels) <= max {
			all := len(r.Labels)
			for k := range n.Job.Labels {
				if _, ok := r.Labels[k]; !ok {
					all++
				}
			}
			if all > max {
				v.add(at(".job.labels"), "%d labels with the run's, over the limit of %d", all, max)
			}
		}
		var ve *ValidationError
		if err := n.Job.Validate(l); err != nil {
			if errors.As(err, &ve) {
				for _, p := range ve.Problems {
					v.problems = append(v.problems, at(".job.")+p)
				}
			} else {
				v.add(at(".job"), "%v", err)
			}
		}
		for _, name := range slices.Sorted(maps.Keys(n.InputsFrom)) {
			from := n.InputsFrom[name]
			if !validFileName(name) || len(name) > 255 {
				v.add(at(".inputs_from."+name), "%q is not a relative path of [A-Za-z0-9_.-] segments", truncate(name, 70))
			}
			if _, ok := n.Job.Inputs[name]; ok {
				v.add(at(".inputs_from."+name), "is also an inline input of the node's job")
			}
			if _, ok := n.Job.InputRefs[name]; ok {
				v.add(at(".inputs_from."+name), "is also an input by reference of the node's job")
			}
			j, ok := index[from.Node]
			if !ok || !seen[from.Node] {
				v.add(at(".inputs_from."+name+".node"), "%q is not a node this one comes after (its after)", truncate(from.Node, 70))
				continue
			}
			if p := r.Nodes[j].Job; p != nil && !slices.Contains(p.Outputs, from.Output) {
				v.add(at(".inputs_from."+name+".output"), "%q is not an output node %s declares", truncate(from.Output, 70), from.Node)
			}
		}
		if in := len(n.InputsFrom) + len(n.Job.Inputs) + len(n.Job.InputRefs); in > l.WithDefaults().MaxInputs {
			v.add(at(".inputs_from"), "%d inputs in all, over the limit of %d", in, l.WithDefaults().MaxInputs)
		}
	}
	if len(v.problems) == 0 {
		if cycle := r.cycle(index); cycle != nil {
			i := index[cycle[0]]
			v.add(nodeField(i, cycle[0])+".after", "a cycle: %s", strings.Join(cycle, " after "))
		}
	}
	return v.runErr()
}

// RunError lists every problem of a run that was refused, each naming the
// node (its index and id) and the field.
type RunError struct {
	Problems []string
}

func (e *RunError) Error() string { return "invalid run: " + joinProblems(e.Problems) }

func (v *validator) runErr() error {
	if len(v.problems) == 0 {
		return nil
	}
	return &RunError{Problems: v.problems}
}

// orRun is a run id for a message about a run that has none yet.
func orRun(id string) string {
	if id == "" {
		return "<run>"
	}
	return id
}

func nodeField(i int, id string) string {
	if ValidNodeID(id) {
		return fmt.Sprintf("nodes[%d] (%s)", i, id)
	}
	return fmt.Sprintf("nodes[%d]", i)
}

// cycle returns the nodes of a cycle of the graph, each after the next
// and the last after the first again, or nil when it has none.
func (r *RunRequest) cycle(index map[string]int) []string {
	// Kahn's algorithm: what is left once every node whose parents are
	// all gone is taken away is on a cycle, or after one.
	left := make([]int, len(r.Nodes))
	children := make([][]int, len(r.Nodes))
	for i, n := range r.Nodes {
		left[i] = len(n.After)
		for _, p := range n.After {
			children[index[p]] = append(children[index[p]], i)
		}
	}
	var ready []int
	for i, n := range left {
		if n == 0 {
			ready = append(ready, i)
		}
	}
	gone := 0
	for len(ready) > 0 {
		i := ready[len(ready)-1]
		ready = ready[:len(ready)-1]
		gone++
		for _, c := range children[i] {
			if left[c]--; left[c] == 0 {
				ready = append(ready, c)
			}
		}
	}
	if gone == len(r.Nodes) {
		return nil
	}
	// From a node left, follow a parent that is left until one repeats.
	at := slices.IndexFunc(left, func(n int) bool { return n > 0 })
	step := map[int]int{}
	var path []int
	for {
		if k, ok := step[at]; ok {
			path = path[k:]
			break
		}
		step[at] = len(path)
		path = append(path, at)
		for _, p := range r.Nodes[at].After {
			if left[index[p]] > 0 {
				at = index[p]
				break
			}
		}
	}
	out := make([]string, 0, len(path)+1)
	for _, i := range path {
		out = append(out, r.Nodes[i].ID)
	}
	return append(out, out[0])
}

// Order returns the indexes of the nodes in an order where every node
// comes after the nodes it comes after: the order a run's nodes are
// looked at in. The run must have no cycle.
func (r *RunRequest) Order() []int {
	index := make(map[string]int, len(r.Nodes))
	for i, n := range r.Nodes {
		index[n.ID] = i
	}
	left := make([]int, len(r.Nodes))
	children := make([][]int, len(r.Nodes))
	for i, n := range r.Nodes {
		left[i] = len(n.After)
		for _, p := range n.After {
			children[index[p]] = append(children[index[p]], i)
		}
	}
	var out, ready []int
	for i, n := range left {
		if n == 0 {
			ready = append(ready, i)
		}
	}
	for len(ready) > 0 {
		i := ready[0]
		ready = ready[1:]
		out = append(out, i)
		for _, c := range children[i] {
			if left[c]--; left[c] == 0 {
				ready = append(ready, c)
			}
		}
	}
	return out
}

// RunState is the state of a run.
type RunState string

// The states of a run: running until every node of its last round has
// ended; then succeeded when every node succeeded (or was not needed: a
// failure handler that nothing failed for), cancelled when it was
// cancelled, failed otherwise.
const (
	RunRunning   RunState = "running"
	RunSucceeded RunState = "succeeded"
	RunFailed    RunState = "failed"
	RunCancelled RunState = "cancelled"
)

// Final reports whether s is a state a run ends in.
func (s RunState) Final() bool { return s == RunSucceeded || s == RunFailed || s == RunCancelled }

// NodeWaiting is the state of a node not queued yet: it waits for the
// nodes it comes after.
const NodeWaiting State = "waiting"

// RunSubmitReply answers a run's submission (schema run-answer.v1,
// submit_reply): the run's id and state, with Duplicate set when a run
// with that id existed already (and was not run again), or Error when the
// run was refused, with every problem.
type RunSubmitReply struct {
	RunID     string   `json:"run_id,omitempty"`
	Tenant    string   `json:"tenant,omitempty"`
	State     RunState `json:"state,omitempty"`
	Nodes     int      `json:"nodes,omitempty"`
	Duplicate bool     `json:"duplicate,omitempty"`
	Error     string   `json:"error,omitempty"`
	// Problems are the refusal's, one per node and field.
	Problems []string `json:"problems,omitempty"`
}

// Rejected reports whether the run was refused.
func (r *RunSubmitReply) Rejected() bool { return r.Error != "" }

// RunView is what the fleet knows of a run: its definition, round, state,
// and each node's state as it stands: the answer to a run's status,
// <prefix>.t.<tenant>.runs.status.<run>, made from the run's messages
// (schema run-answer.v1, view).
type RunView struct {
	RunID       string            `json:"run_id"`
	Tenant      string            `json:"tenant"`
	State       RunState          `json:"state"`
	Round       int               `json:"round"`
	Labels      map[string]string `json:"labels,omitempty"`
	SubmittedAt time.Time         `json:"submitted_at"`
	FinishedAt  *time.Time        `json:"finished_at,omitempty"`
	// CancelRequested is set once a cancel of the run was asked for.
	CancelRequested bool       `json:"cancel_requested,omitempty"`
	Nodes           []NodeView `json:"nodes"`
}

// End is the summary of the round an ended run's view shows (what its
// end message says, but for the nodes' rounds).
func (v *RunView) End() *RunEnd {
	e := &RunEnd{RunID: v.RunID, Tenant: v.Tenant, Round: v.Round, State: v.State, SubmittedAt: v.SubmittedAt}
	if v.FinishedAt != nil {
		e.FinishedAt = *v.FinishedAt
	}
	for _, n := range v.Nodes {
		e.Nodes = append(e.Nodes, NodeState{ID: n.ID, JobID: n.JobID, Pool: n.Pool, State: n.State, Code: n.Code})
	}
	return e
}

// NodeView is one node of a run as it stands.
type NodeView struct {
	ID    string   `json:"id"`
	After []string `json:"after,omitempty"`
	When  When     `json:"when,omitempty"`
	Pool  string   `json:"pool"`
	// JobID is the node's job in the run's round: RunJobID(run, node,
	// round of the node's last start).
	JobID string `json:"job_id"`
	// State is its job's state, or waiting while it has none.
	State State `json:"state"`
	// WaitingFor lists the nodes it waits for, while it waits.
	WaitingFor []string `json:"waiting_for,omitempty"`
	// Code is the failure code of a node that did not succeed.
	Code FailureCode `json:"code,omitempty"`
	// Round is the round its job was queued in (1 for the run's first).
	Round int `json:"round,omitempty"`
}

// RunRecord is a run as the fleet accepted it: the first message of the
// run, which the dispatchers release its nodes from (schema
// run-record.v1, definition).
type RunRecord struct {
	RunID       string            `json:"run_id"`
	Tenant      string            `json:"tenant"`
	SubmittedAt time.Time         `json:"submitted_at"`
	Labels      map[string]string `json:"labels,omitempty"`
	TraceID     string            `json:"trace_id,omitempty"`
	Nodes       []RunNodeRecord   `json:"nodes"`
}

// RunNodeRecord is one node of a run as accepted: its request as
// submitted, with its pool and priority settled and its env values and
// inline inputs sealed, for its first job (RunJobID(run, node, 1)).
type RunNodeRecord struct {
	ID         string              `json:"id"`
	After      []string            `json:"after,omitempty"`
	InputsFrom map[string]OutputOf `json:"inputs_from,omitempty"`
	When       When                `json:"when,omitempty"`
	Pool       string              `json:"pool"`
	Priority   int                 `json:"priority"`
	Job        *Request            `json:"job"`
	Secrets    string              `json:"secrets,omitempty"`
}

// NodeEnded says a node's job ended (schema run-record.v1, node_ended):
// written once the job's final version is stored, by whoever wrote it.
type NodeEnded struct {
	RunID  string `json:"run_id"`
	NodeID string `json:"node_id"`
	JobID  string `json:"job_id"`
	Pool   string `json:"pool"`
	Round  int    `json:"round"`
	// State is the job's final state; Code its failure's code, when it
	// did not succeed.
	State State       `json:"state"`
	Code  FailureCode `json:"code,omitempty"`
	At    time.Time   `json:"at"`
}

// RunCancel asks for a run's round to be cancelled (schema run-record.v1,
// cancel).
type RunCancel struct {
	RunID       string    `json:"run_id"`
	Tenant      string    `json:"tenant"`
	Round       int       `json:"round"`
	RequestedAt time.Time `json:"requested_at"`
}

// RunRetry starts a round of a run: its nodes that failed or were
// cancelled, and every node after them, run again as new jobs (schema
// run-record.v1, retry).
type RunRetry struct {
	RunID       string    `json:"run_id"`
	Tenant      string    `json:"tenant"`
	Round       int       `json:"round"`
	Nodes       []string  `json:"nodes"`
	RequestedAt time.Time `json:"requested_at"`
}

// RunEnd is the summary a round of a run ends with, once (schema
// run-record.v1, end): the run's state, and each node's.
type RunEnd struct {
	RunID       string      `json:"run_id"`
	Tenant      string      `json:"tenant"`
	Round       int         `json:"round"`
	State       RunState    `json:"state"`
	SubmittedAt time.Time   `json:"submitted_at"`
	FinishedAt  time.Time   `json:"finished_at"`
	Nodes       []NodeState `json:"nodes"`
}

// NodeState is a node's state in a run's summary: its job (which holds
// its result) and how it ended.
type NodeState struct {
	ID    string      `json:"id"`
	JobID string      `json:"job_id"`
	Pool  string      `json:"pool"`
	State State       `json:"state"`
	Code  FailureCode `json:"code,omitempty"`
}

// RunReply answers a cancel or a retry of a run (schema run-answer.v1,
// reply): the round it is about, whether it was cancelled, the nodes a
// retry runs again, and what happened, in words.
type RunReply struct {
	RunID     string   `json:"run_id"`
	Round     int      `json:"round"`
	Cancelled bool     `json:"cancelled,omitempty"`
	Retried   []string `json:"retried,omitempty"`
	Message   string   `json:"message,omitempty"`
}

// RunList answers a list of a tenant's runs (schema run-answer.v1, list):
// their ids, oldest first.
type RunList struct {
	Runs []string `json:"runs"`
}

// EndOf is the end of a run's node that rec, the final version of the
// node's job, says: false when rec is not the final version of a run's
// node's job.
func EndOf(rec *Record) (*NodeEnded, bool) {
	run, node, round, ok := ParseRunJobID(rec.ID)
	if !ok || rec.RunID != run || rec.NodeID != node || !rec.State.Final() {
		return nil, false
	}
	e := &NodeEnded{RunID: run, NodeID: node, JobID: rec.ID, Pool: rec.Pool, Round: round, State: rec.State, At: rec.UpdatedAt}
	if rec.Failure != nil && rec.State != StateSucceeded {
		e.Code = rec.Failure.Code
	}
	return e, true
}
