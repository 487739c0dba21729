package job

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"regexp"
	"slices"
)

// A sealed text: the sealing key's name, a colon, unpadded base64.
var secretsRE = regexp.MustCompile(`^[A-Za-z0-9_.-]+:[A-Za-z0-9+/]+$`)

// recordLimits check the request a record carries for its values, not
// its sizes: its dispatcher held it to limits that may be above the
// defaults.
var recordLimits = Limits{
	MaxRequestBytes: math.MaxInt, MaxInputBytes: math.MaxInt, MaxInputs: math.MaxInt,
	MaxInputRefBytes: math.MaxInt64, MaxOutputs: math.MaxInt, MaxEnv: math.MaxInt, MaxEnvBytes: math.MaxInt,
	MaxCommandArgs: math.MaxInt, MaxCommandBytes: math.MaxInt, MaxLabels: math.MaxInt, MaxAttempts: math.MaxInt,
	MaxTimeout: math.MaxInt64, MaxGPU: math.MaxInt,
}

// DecodeRecord decodes and validates a version of a job's record as its
// pool's stream keeps it (schema job-record.v2): strictly, then against
// the contract, as the schema does, and what the schema cannot say: that
// the result is the job's own.
func DecodeRecord(data []byte) (*Record, error) {
	var r Record
	if err := decodeStrict(data, &r); err != nil {
		return nil, fmt.Errorf("invalid record: %w", err)
	}
	if err := requireKeys(data, "id", "tenant", "pool", "state", "event", "attempt", "max_attempts",
		"submitted_at", "updated_at"); err != nil {
		return nil, fmt.Errorf("invalid record: %w", err)
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return &r, nil
}

// Validate checks a version of a job's record against contract v2.
func (r *Record) Validate() error {
	var v validator
	if run, node, _, ok := ParseRunJobID(r.ID); ok && (r.RunID != run || r.NodeID != node) {
		v.add("id", "%q is the job of node %s of run %s, which its run_id and node_id must say", truncate(r.ID, 40), node, run)
	}
	if !ValidID(r.ID) {
		v.add("id", "%q must be 1 to 128 characters of [A-Za-z0-9_.-], with dots only between other characters", truncate(r.ID, 40))
	}
	if !ValidTenant(r.Tenant) {
		v.add("tenant", "%q must be 1 to 64 characters of [A-Za-z0-9_-]", truncate(r.Tenant, 40))
	}
	if !ValidPool(r.Pool) {
		v.add("pool", "%q must be 1 to 64 characters of [A-Za-z0-9_-]", truncate(r.Pool, 40))
	}
	if r.Priority != 0 && (r.Priority < HighestPriority || r.Priority > LowestPriority) {
		v.add("priority", "%d must be from %d (highest) to %d (lowest)", r.Priority, HighestPriority, LowestPriority)
	}
	switch r.State {
	case StateRejected, StateQueued, StateRunning, StateRetrying, StateSucceeded, StateFailed, StateTimedOut, StateCancelled:
	default:
		v.add("state", "%q is not a state", truncate(string(r.State), 40))
	}
	switch r.Event {
	case EventQueued, EventRejected, EventStarted, EventHeartbeat, EventRetryScheduled,
		EventSucceeded, EventFailed, EventTimedOut, EventCancelled:
	default:
		v.add("event", "%q is not an event a record version records", truncate(string(r.Event), 40))
	}
	for name, n := range map[string]int{"attempt": r.Attempt, "max_attempts": r.MaxAttempts, "handbacks": r.Handbacks, "adoptions": r.Adoptions} {
		if n < 0 {
			v.add(name, "must not be negative")
		}
	}
	if r.SubmittedAt.IsZero() {
		v.add("submitted_at", "is required")
	}
	if r.UpdatedAt.IsZero() {
		v.add("updated_at", "is required")
	}
	v.failure("failure", r.Failure)
	v.traceID(r.TraceID)
	if r.MemoryOverride != "" {
		if _, err := ParseMemory(r.MemoryOverride); err != nil {
			v.add("memory_override", "%v", err)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(r.Labels)) {
		if err := ValidateLabel(k, r.Labels[k]); err != nil {
			v.add("labels", "%v", err)
		}
	}
	v.history(r.History)
	if r.Request != nil {
		var ve *ValidationError
		if err := r.Request.Validate(recordLimits); errors.As(err, &ve) {
			for _, p := range ve.Problems {
				v.problems = append(v.problems, "request."+p)
			}
		}
	}
	if r.Secrets != "" && !secretsRE.MatchString(r.Secrets) {
		v.add("secrets", "is not a sealed text")
	}
	if r.Result != nil {
		var de *DocumentError
		if err := r.Result.Validate(); errors.As(err, &de) {
			for _, p := range de.Problems {
				v.problems = append(v.problems, "result."+p)
			}
		}
		if r.Result.JobID != r.ID || r.Result.Pool != r.Pool {
			v.add("result", "belongs to job %s of pool %s, not to this one", truncate(r.Result.JobID, 40), truncate(r.Result.Pool, 40))
		}
	}
	v.versionRules(r)
	return v.errAs("record")
}

// versionRules checks what a version's state and event say it carries.
func (v *validator) versionRules(r *Record) {
	final := r.State.Final()
	switch {
	case final && r.FinishedAt == nil:
		v.add("finished_at", "is required in a final version")
	case final && r.Result == nil:
		v.add("result", "is required in a final version")
	case !final && r.Result != nil:
		v.add("result", "is only in a final version, not in a %s one", r.State)
	case final && State(r.Result.Status) != r.State:
		v.add("result.status", "%q differs from state %q", r.Result.Status, r.State)
	}
	// A final or rejected version's event is its state.
	if (final || r.State == StateRejected || r.Event.Final()) && string(r.Event) != string(r.State) {
		v.add("event", "%q does not go with state %q", r.Event, r.State)
	}
	switch r.State {
	case StateSucceeded:
		if r.Failure != nil {
			v.add("failure", "must be absent when the job succeeded")
		}
	case StateFailed, StateTimedOut, StateCancelled, StateRejected:
		if r.Failure == nil {
			v.add("failure", "is required in a %s version", r.State)
		}
	case StateRunning:
		if r.StartedAt == nil {
			v.add("started_at", "is required in a running version")
		}
		if r.WorkerID == "" {
			v.add("worker_id", "is required in a running version")
		}
	case StateRetrying:
		if r.NextAttemptAt == nil {
			v.add("next_attempt_at", "is required in a retrying version")
		}
		if r.Failure == nil {
			v.add("failure", "is required in a retrying version")
		}
	}
	switch {
	case r.Event == EventStarted && r.State != StateRunning:
		v.add("event", "started in a %s version", r.State)
	case r.Event == EventRetryScheduled && r.State != StateRetrying:
		v.add("event", "retry_scheduled in a %s version", r.State)
	}
	if r.Request != nil && (r.State != StateQueued || r.Event != EventQueued) {
		v.add("request", "is only in the version that queues the job")
	}
	if r.Secrets != "" && r.Request == nil {
		v.add("secrets", "are only with the request")
	}
	if r.DeadLettered && r.State != StateFailed && r.State != StateTimedOut {
		v.add("dead_lettered", "only a job that failed or timed out is dead-lettered, not a %s one", r.State)
	}
	if r.AttemptStarted && (r.Attempt < 1 || !final && r.State != StateRetrying) {
		v.add("attempt_started", "is only in a version that ends an attempt (final or retrying, attempt 1 or more), not a %s one of attempt %d", r.State, r.Attempt)
	}
}
