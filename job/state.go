package job

import "time"

// State is where a job stands, as kept in the jobs key-value bucket.
type State string

// Job states. The four after retrying are final. A rejected request keeps a
// record so that its id answers with the reason, but a later valid request
// with the same id replaces it.
const (
	StateRejected  State = "rejected"
	StateQueued    State = "queued"
	StateRunning   State = "running"
	StateRetrying  State = "retrying"
	StateSucceeded State = "succeeded"
	StateFailed    State = "failed"
	StateTimedOut  State = "timed_out"
	StateCancelled State = "cancelled"
)

// Final reports whether s ends the job.
func (s State) Final() bool {
	switch s {
	case StateSucceeded, StateFailed, StateTimedOut, StateCancelled:
		return true
	}
	return false
}

// Record is the state of one job (schema job-record.v2). Every version of
// it is a message of the job's pool's stream, so the versions of a job's
// record are its lifecycle: the first queues the job and carries its
// request, each later one says what happened (Event), and the final one
// carries the job's one result. A record never holds an env value or an
// input's contents in clear: the first version's request has them sealed
// in Secrets, which only dispatchers and workers can open.
//
// In schema v1, the latest version of each job's record was kept in the
// fleet-jobs bucket, without the fields marked v2.
type Record struct {
	ID string `json:"id"`
	// Tenant owns the job: its producer submitted it as that tenant (v2).
	Tenant   string `json:"tenant,omitempty"`
	Pool     string `json:"pool"`
	Priority int    `json:"priority,omitempty"` // v2
	State    State  `json:"state"`
	// Event says what this version records: queued, started,
	// retry_scheduled, rejected, a final event, or heartbeat with a Phase
	// (adopted, awaiting_owner); Message says more, for people (v2).
	Event       EventType  `json:"event,omitempty"`
	Phase       string     `json:"phase,omitempty"`
	Message     string     `json:"message,omitempty"`
	Attempt     int        `json:"attempt"`
	MaxAttempts int        `json:"max_attempts"`
	WorkerID    string     `json:"worker_id,omitempty"`
	Backend     string     `json:"backend,omitempty"`
	SubmittedAt time.Time  `json:"submitted_at"`
	UpdatedAt   time.Time  `json:"updated_at"`
	StartedAt   *time.Time `json:"started_at,omitempty"`
	FinishedAt  *time.Time `json:"finished_at,omitempty"`
	// NextAttemptAt is set while the job waits for a retry, or for its
	// not_before.
	NextAttemptAt *time.Time `json:"next_attempt_at,omitempty"`
	Failure       *Failure   `json:"failure,omitempty"`
	// ExitCode is the last attempt's exit code, once the job has ended
	// with one.
	ExitCode *int `json:"exit_code,omitempty"`
	// CancelRequested is set by a cancel; the worker holding the job stops it.
	CancelRequested bool `json:"cancel_requested,omitempty"`
	// Handbacks counts deliveries a draining worker gave back unfinished;
	// they are not attempts.
	Handbacks int `json:"handbacks,omitempty"`
	// SubmitSeq is the submission's sequence in the submit stream, which
	// tells a redelivered submission from a new one with the same id.
	SubmitSeq uint64 `json:"submit_seq,omitempty"`
	// AwaitingSince is set while the job waits for the worker that started
	// its running attempt to come back, the only one that can reach it (a
	// Docker host): after the worker's --adopt-wait the attempt is lost.
	AwaitingSince *time.Time `json:"awaiting_since,omitempty"`
	// Adoptions counts how many times a running attempt of the job was
	// adopted by a worker other than the one, or the life of it, that
	// started it.
	Adoptions int `json:"adoptions,omitempty"`
	// MemoryOverride is the memory limit raised by an OOM retry, if any.
	MemoryOverride string            `json:"memory_override,omitempty"`
	TraceID        string            `json:"trace_id,omitempty"`
	RunID          string            `json:"run_id,omitempty"`
	NodeID         string            `json:"node_id,omitempty"`
	Labels         map[string]string `json:"labels,omitempty"`
	// History lists finished attempts that did not end the job.
	History []Attempt `json:"history,omitempty"`
	// Request is the job's request, in the version that queues the job
	// only: its env keeps its names with empty values, and its inputs their
	// names with empty contents; the values are in Secrets (v2).
	Request *Request `json:"request,omitempty"`
	// Secrets seals the request's env values and inputs' contents
	// (AES-256-GCM, with the fleet's key; see queue.Sealer) (v2).
	Secrets string `json:"secrets,omitempty"`
	// Result is the job's one result, in its final version only (v2).
	Result *Result `json:"result,omitempty"`
	// DeadLettered is set on the final version of a job that failed or
	// timed out: its request was copied to its pool's dead letters first
	// (v2).
	DeadLettered bool `json:"dead_lettered,omitempty"`
	// AttemptStarted says this version also records the start of its
	// attempt: the attempt ended (or was retried) before its worker
	// recorded it as running, which a worker does once an attempt has run
	// a moment (its --running-after). The attempt's started event comes
	// with this version's own (v2).
	AttemptStarted bool `json:"attempt_started,omitempty"`
}

// Version returns the record without what only its first or final
// version carries (the request, its secrets, the result) and what only
// one version says (its phase and message, that it records its attempt's
// start): what a later version starts from.
func (r *Record) Version() *Record {
	c := *r
	c.Request, c.Secrets, c.Result, c.AttemptStarted = nil, "", nil, false
	c.History = append([]Attempt(nil), r.History...)
	c.Phase, c.Message = "", ""
	return &c
}

// EventsOf is the lifecycle events a record version stands for: its
// event, after a dead_lettered one for a final version that says the job
// was dead-lettered (the final event is always a job's last), and after
// the started event of its attempt when the version records that start
// too (AttemptStarted).
func EventsOf(r *Record) []*Event {
	var out []*Event
	if r.AttemptStarted {
		out = append(out, startOf(r))
	}
	e := EventOf(r)
	if r.DeadLettered {
		dl := *e
		dl.Type, dl.ExitCode = EventDeadLettered, nil
		out = append(out, &dl)
	}
	return append(out, e)
}

// startOf is the started event of the attempt a version ends, for a
// version that records that start (see AttemptStarted): at the attempt's
// start, as its result or its entry in the history says.
func startOf(r *Record) *Event {
	at := r.UpdatedAt
	switch {
	case r.Result != nil && r.Result.StartedAt != nil:
		at = *r.Result.StartedAt
	case len(r.History) > 0 && r.History[len(r.History)-1].Attempt == r.Attempt && r.History[len(r.History)-1].StartedAt != nil:
		at = *r.History[len(r.History)-1].StartedAt
	case r.StartedAt != nil:
		at = *r.StartedAt
	}
	return &Event{JobID: r.ID, Tenant: r.Tenant, Attempt: r.Attempt, Type: EventStarted, Time: at, WorkerID: r.WorkerID,
		Pool: r.Pool, Backend: r.Backend, TraceID: r.TraceID}
}

// EventOf is the lifecycle event a record version stands for (schema
// lifecycle-event.v1): what Event says happened, with the record's
// attempt, worker, failure and message.
func EventOf(r *Record) *Event {
	e := &Event{JobID: r.ID, Tenant: r.Tenant, Attempt: r.Attempt, Type: r.Event, Time: r.UpdatedAt, WorkerID: r.WorkerID,
		Pool: r.Pool, Backend: r.Backend, TraceID: r.TraceID, Message: r.Message, Phase: r.Phase}
	switch {
	case r.State.Final():
		e.ExitCode, e.Failure = r.ExitCode, r.Failure
	case r.State == StateRetrying:
		e.ExitCode, e.Failure, e.NextAttemptAt = r.ExitCode, r.Failure, r.NextAttemptAt
		if r.NextAttemptAt != nil {
			d := Duration(r.NextAttemptAt.Sub(r.UpdatedAt))
			e.Delay = &d
		}
	case r.State == StateRejected:
		e.Failure = r.Failure
	case r.State == StateQueued:
		e.NextAttemptAt = r.NextAttemptAt
	}
	if r.Event == EventQueued {
		e.Priority = r.Priority
	}
	return e
}
