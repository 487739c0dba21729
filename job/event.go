package job

import (
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

// Event is a lifecycle event (schema lifecycle-event.v2, or v1 without
// the tenant, published on <prefix>.events.<job_id>). In v2, heartbeat and
// log events are published on <prefix>.t.<tenant>.ev.<pool>.<job_id>, and
// the others stand for versions of the job's record (see EventsOf).
type Event struct {
	JobID string `json:"job_id"`
	// Tenant owns the job (v2).
	Tenant string `json:"tenant,omitempty"`
	// Priority is the job's, in its queued event (v2).
	Priority int       `json:"priority,omitempty"`
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
	// Usage is what the running attempt uses, in some heartbeat events.
	Usage *Usage `json:"usage,omitempty"`
}

// Phases of heartbeat events that the fleet itself announces; executors
// report their backend's own (a pod's Pending, Running).
const (
	// PhaseWorkerLost: the worker running the attempt stopped responding.
	PhaseWorkerLost = "worker_lost"
	// PhaseAdopted: a worker took over an attempt that outlived the worker
	// that started it, and follows it to its end.
	PhaseAdopted = "adopted"
	// PhaseHandedOff: a stopping worker left the attempt running for
	// another worker to adopt.
	PhaseHandedOff = "handed_off"
	// PhaseAwaitingOwner: the attempt runs where only the worker that
	// started it can reach it (a Docker host); the job waits for that
	// worker to come back.
	PhaseAwaitingOwner = "awaiting_owner"
	// PhaseUsage: a heartbeat event that carries the attempt's usage.
	PhaseUsage = "usage"
	// PhaseCancelRequested: a cancel reached a running attempt, whose
	// worker is told to stop it (v2).
	PhaseCancelRequested = "cancel_requested"
)
