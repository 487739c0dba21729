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

// Record is the latest state of one job, stored under its id in the
// fleet-jobs bucket. It never holds the request's environment.
type Record struct {
	ID          string     `json:"id"`
	Pool        string     `json:"pool"`
	State       State      `json:"state"`
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
}
