package job

import "time"

// Status is the final status of a job.
type Status string

// Final statuses.
const (
	StatusSucceeded Status = "succeeded"
	StatusFailed    Status = "failed"
	StatusTimedOut  Status = "timed_out"
	StatusCancelled Status = "cancelled"
)

// EventType returns the final event that announces s.
func (s Status) EventType() EventType {
	switch s {
	case StatusSucceeded:
		return EventSucceeded
	case StatusTimedOut:
		return EventTimedOut
	case StatusCancelled:
		return EventCancelled
	}
	return EventFailed
}

// Result is the one final result of a job (schema result.v1), published on
// <prefix>.results.<job_id>.
type Result struct {
	JobID    string `json:"job_id"`
	Pool     string `json:"pool"`
	Status   Status `json:"status"`
	Attempts int    `json:"attempts"`
	ExitCode *int   `json:"exit_code,omitempty"`
	// Outputs holds each declared output file that was found, by name.
	Outputs map[string]string `json:"outputs,omitempty"`
	// Artifacts holds each declared output that was stored as an object
	// instead: one too large for the result, or not UTF-8 text.
	Artifacts map[string]Artifact `json:"artifacts,omitempty"`
	// Log is set when the last attempt's log was truncated.
	Log *LogInfo `json:"log,omitempty"`
	// Stdout and Stderr are the tails of the last attempt's output.
	Stdout     string     `json:"stdout,omitempty"`
	Stderr     string     `json:"stderr,omitempty"`
	StartedAt  *time.Time `json:"started_at,omitempty"`
	FinishedAt time.Time  `json:"finished_at"`
	WorkerID   string     `json:"worker_id,omitempty"`
	Backend    string     `json:"backend,omitempty"`
	Failure    *Failure   `json:"failure,omitempty"`
	TraceID    string     `json:"trace_id,omitempty"`
	RunID      string     `json:"run_id,omitempty"`
	NodeID     string     `json:"node_id,omitempty"`
	// History lists the attempts before the last one, oldest first.
	History []Attempt `json:"history,omitempty"`
}

// Attempt summarises one attempt of a job.
type Attempt struct {
	Attempt    int        `json:"attempt"`
	WorkerID   string     `json:"worker_id,omitempty"`
	StartedAt  *time.Time `json:"started_at,omitempty"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
	ExitCode   *int       `json:"exit_code,omitempty"`
	Failure    *Failure   `json:"failure,omitempty"`
	// Log is set when the attempt's log was truncated.
	Log *LogInfo `json:"log,omitempty"`
}
