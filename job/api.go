package job

import (
	"encoding/json"
	"fmt"
	"time"
)

// The answers the fleet gives, on NATS and over HTTP. Producers decode them
// with these types; fleetctl prints them with -o json.

// SubmitReply is a dispatcher's answer to a submission: the job's id and
// state, or the reason it was rejected.
type SubmitReply struct {
	JobID string `json:"job_id,omitempty"`
	State State  `json:"state,omitempty"`
	// Duplicate is set when a job with this id already exists; the request
	// was not run again.
	Duplicate bool   `json:"duplicate,omitempty"`
	Warning   string `json:"warning,omitempty"`
	// Error is the reason a request was rejected.
	Error string `json:"error,omitempty"`
	// Stream and Seq make the answer to a JetStream publish on the submit
	// subject a valid publish acknowledgement, so that js.Publish works as a
	// producer too.
	Stream string `json:"stream,omitempty"`
	Seq    uint64 `json:"seq,omitempty"`
}

// Rejected reports whether the submission was refused.
func (r *SubmitReply) Rejected() bool { return r.Error != "" }

// CancelReply is the answer to a cancel.
type CancelReply struct {
	JobID string `json:"job_id"`
	State State  `json:"state"`
	// Cancelled is true when this call cancelled the job or asked its
	// worker to stop it; false when there was nothing to cancel.
	Cancelled bool   `json:"cancelled"`
	Message   string `json:"message"`
}

// StatusReply is what the fleet knows of a job: its record and, once it
// has one, its result.
type StatusReply struct {
	Job    *Record `json:"job"`
	Result *Result `json:"result,omitempty"`
}

// NewStatusReply joins a job's record with its result. A worker publishes the
// result just before it records the end, and a reader may come in between:
// when the record still says the job runs, the result is the truth.
func NewStatusReply(rec *Record, res *Result) *StatusReply {
	if res != nil && !rec.State.Final() {
		rec.State, rec.Attempt, rec.Failure = State(res.Status), res.Attempts, res.Failure
		rec.FinishedAt, rec.UpdatedAt, rec.NextAttemptAt = &res.FinishedAt, res.FinishedAt, nil
		rec.ExitCode = res.ExitCode
	}
	return &StatusReply{Job: rec, Result: res}
}

// NeedsResult reports whether a record's state may have a result to join:
// the job ended, or runs and may have ended a moment ago.
func (r *Record) NeedsResult() bool { return r.State.Final() || r.State == StateRunning }

// ErrorReply is the answer to a request the fleet could not serve: the
// reason, and whether the job does not exist.
type ErrorReply struct {
	Error    string `json:"error"`
	NotFound bool   `json:"not_found,omitempty"`
}

// DeadLetter is a request whose job ended failed or timed out, as the
// dead-letter stream keeps it, with the job's last failure.
type DeadLetter struct {
	JobID    string    `json:"job_id"`
	Pool     string    `json:"pool"`
	Attempts int       `json:"attempts"`
	Failure  Failure   `json:"failure"`
	Time     time.Time `json:"time"`
	Seq      uint64    `json:"seq"`
	// Request is the decoded request; Document is the request as it was
	// submitted, env included. Neither is ever printed.
	Request  *Request `json:"-"`
	Document []byte   `json:"-"`
}

// RetryID is the id of the n-th retry of a dead-lettered job.
func RetryID(id string, n int) string { return fmt.Sprintf("%s-retry-%d", id, n) }

// Resubmission returns the dead letter's request with its id replaced by
// id, the rest of the document (env included) as it was submitted.
func (d *DeadLetter) Resubmission(id string) ([]byte, error) {
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(d.Document, &doc); err != nil {
		return nil, fmt.Errorf("dead letter of %s: %w", d.JobID, err)
	}
	doc["id"], _ = json.Marshal(id)
	return json.Marshal(doc)
}
