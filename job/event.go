package job

import (
	"fmt"
	"time"
)

// EventType names a lifecycle event.
type EventType string

// Lifecycle events, in the order a job meets them.
const (
	EventQueued         EventType = "queued"
	EventRejected       EventType = "rejected"
	EventStarted        EventType = "started"
	EventHeartbeat      EventType = "heartbeat"
	EventLog            EventType = "log"
	EventRetryScheduled EventType = "retry_scheduled"
	EventSucceeded      EventType = "succeeded"
	EventFailed         EventType = "failed"
	EventTimedOut       EventType = "timed_out"
	EventCancelled      EventType = "cancelled"
	EventDeadLettered   EventType = "dead_lettered"
)

// Final reports whether t ends a job: nothing but dead_lettered follows it.
func (t EventType) Final() bool {
	switch t {
	case EventSucceeded, EventFailed, EventTimedOut, EventCancelled, EventRejected:
		return true
	}
	return false
}

// FailureClass says why an attempt failed; retry policies are keyed on it.
type FailureClass string

// Failure classes.
const (
	ClassExecution      FailureClass = "execution"      // the command exited non-zero
	ClassTimeout        FailureClass = "timeout"        // an attempt, the queue wait or the job ran out of time
	ClassOOM            FailureClass = "oom"            // killed for exceeding its memory limit
	ClassImage          FailureClass = "image"          // the image is missing or could not be pulled
	ClassInfrastructure FailureClass = "infrastructure" // daemon or API errors, worker lost, eviction
	ClassCancelled      FailureClass = "cancelled"      // a user asked for it to stop
	ClassRejected       FailureClass = "rejected"       // the request is not acceptable
)

var classes = []FailureClass{ClassExecution, ClassTimeout, ClassOOM, ClassImage, ClassInfrastructure, ClassCancelled, ClassRejected}

func classNames() []string {
	s := make([]string, len(classes))
	for i, c := range classes {
		s[i] = string(c)
	}
	return s
}

// Valid reports whether c is one of the failure classes.
func (c FailureClass) Valid() bool {
	for _, k := range classes {
		if c == k {
			return true
		}
	}
	return false
}

// Failure codes used by the fleet itself. Executors add their own.
const (
	CodeExitCode       = "exit_code"       // non-zero exit
	CodeAttemptTimeout = "attempt_timeout" // timeout of one attempt
	CodeQueueTimeout   = "queue_timeout"   // queued longer than queue_timeout
	CodeDeadline       = "deadline"        // the whole job exceeded its deadline
	CodeWorkerLost     = "worker_lost"     // the worker stopped heartbeating mid-attempt
	CodeCancelled      = "cancelled"
	CodeInvalid        = "invalid_request"
	CodeOutputMissing  = "output_missing"
	CodeOutputLarge    = "output_too_large"
)

// Failure describes why an attempt or a job failed. Message is for people;
// it never carries environment values.
type Failure struct {
	Class   FailureClass `json:"class"`
	Code    string       `json:"code"`
	Message string       `json:"message"`
}

// Error makes a Failure usable as an error, so executors can return one to
// say how an attempt failed.
func (f *Failure) Error() string {
	return fmt.Sprintf("%s (%s): %s", f.Class, f.Code, f.Message)
}

// Failf builds a Failure.
func Failf(class FailureClass, code, format string, args ...any) *Failure {
	return &Failure{Class: class, Code: code, Message: fmt.Sprintf(format, args...)}
}

// Event is a lifecycle event (schema lifecycle-event.v1), published on
// <prefix>.events.<job_id>.
type Event struct {
	JobID    string    `json:"job_id"`
	Attempt  int       `json:"attempt"`
	Type     EventType `json:"type"`
	Time     time.Time `json:"time"`
	WorkerID string    `json:"worker_id,omitempty"`
	Pool     string    `json:"pool"`
	Backend  string    `json:"backend,omitempty"`
	ExitCode *int      `json:"exit_code,omitempty"`
	Failure  *Failure  `json:"failure,omitempty"`
	TraceID  string    `json:"trace_id,omitempty"`
	// Message explains the event to people: why a request was rejected, a
	// warning at admission, what an executor is doing.
	Message string `json:"message,omitempty"`
	// Phase is the backend's own state at this event (a pod phase, a
	// container state), when it has one.
	Phase string `json:"phase,omitempty"`
	// Stream and Line carry one line of output in a log event.
	Stream string `json:"stream,omitempty"`
	Line   string `json:"line,omitempty"`
	// NextAttemptAt and Delay say when a scheduled retry starts.
	NextAttemptAt *time.Time `json:"next_attempt_at,omitempty"`
	Delay         *Duration  `json:"delay,omitempty"`
}
