package job

import (
	"fmt"
	"time"
)

// The answers the fleet gives, on NATS and over HTTP. Producers decode them
// with these types; fleetctl prints them with -o json.

// SubmitReply is a dispatcher's answer to a submission: the job's id and
// state, or the reason it was rejected.
type SubmitReply struct {
	JobID string `json:"job_id,omitempty"`
	// Tenant, Pool and Priority place the job (v2): its records are on
	// <prefix>.t.<tenant>.job.<pool>.*.<job_id>.
	Tenant   string `json:"tenant,omitempty"`
	Pool     string `json:"pool,omitempty"`
	Priority int    `json:"priority,omitempty"`
	State    State  `json:"state,omitempty"`
	// Duplicate is set when a job with this id already exists; the request
	// was not run again. A copy of the submission that queued the job (the
	// same SubmissionHeader, sent again while the first waited for its
	// answer) is answered as that submission was: not a duplicate.
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

// SubmissionHeader names one submission, whatever number of copies of it a
// producer sends: a random token, of a job id's form (job.ValidID: up to 128 characters of
// [A-Za-z0-9_.-]). The dispatcher keeps it with the version that queues the
// job, and answers a later copy with the same token as the first, not as a
// duplicate. The Go client and fleetctl set it on every submission.
const SubmissionHeader = "Fleet-Submission"

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

// StatusOf is the status of a job whose last record version is rec: the
// record without its request and its result, and the result beside it.
func StatusOf(rec *Record) *StatusReply {
	c := *rec
	c.Request, c.Secrets, c.Result = nil, "", nil
	return &StatusReply{Job: &c, Result: rec.Result}
}

// HistoryReply is every version of a job's record, oldest first, as its
// pool's stream keeps them: the job's lifecycle (v2).
type HistoryReply struct {
	Records []*Record `json:"records"`
	// Seqs are the records' sequences in their pool's stream, which the
	// live copies carry in their Nats-Sequence header: a follower that
	// listens first and reads the history second drops what it heard twice.
	Seqs []uint64 `json:"seqs"`
	// Notices are the job's heartbeat and log events the events stream
	// still holds, oldest first.
	Notices []*Event `json:"notices,omitempty"`
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
// reason, and whether the job (or schedule) does not exist, whether,
// making a schedule, it already does, and whether the request itself is at
// fault (trying it again as it is will not help).
type ErrorReply struct {
	Error    string `json:"error"`
	NotFound bool   `json:"not_found,omitempty"`
	Exists   bool   `json:"exists,omitempty"`
	Invalid  bool   `json:"invalid,omitempty"`
	// Retry says the request failed for a while only (NATS electing a
	// leader, a server lost): the same request may be sent again.
	Retry bool `json:"retry,omitempty"`
}

// DeadLetter is a request whose job ended failed or timed out, as the
// dead-letter stream keeps it, with the job's last failure.
type DeadLetter struct {
	JobID    string    `json:"job_id"`
	Tenant   string    `json:"tenant,omitempty"`
	Pool     string    `json:"pool"`
	Attempts int       `json:"attempts"`
	Failure  Failure   `json:"failure"`
	Time     time.Time `json:"time"`
	Seq      uint64    `json:"seq"`
	// Request is the request, its env values and inputs' contents sealed
	// in Secrets (which a dispatcher can open); Document is the dead
	// letter as stored. None is ever printed.
	Request  *Request `json:"-"`
	Secrets  string   `json:"-"`
	Document []byte   `json:"-"`
}

// RetryID is the id of the n-th retry of a dead-lettered job.
func RetryID(id string, n int) string { return fmt.Sprintf("%s-retry-%d", id, n) }
