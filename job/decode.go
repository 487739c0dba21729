package job

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
)

// The decoders below guard the boundaries where the fleet reads documents it
// did not write itself in this process: events and results read by clients,
// heartbeats read by the dispatcher. They decode strictly and then check the
// document against the contract, as the JSON Schemas do.

var traceIDRE = regexp.MustCompile(`^[0-9a-f]{32}$`)

// requireKeys reports the required top-level keys missing from a JSON
// object; zero values cannot tell "absent" from "empty" after decoding.
func requireKeys(data []byte, keys ...string) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return err
	}
	var v validator
	for _, k := range keys {
		if _, ok := m[k]; !ok {
			v.add(k, "is required")
		}
	}
	if len(v.problems) > 0 {
		return errors.New(joinProblems(v.problems))
	}
	return nil
}

// DecodeEvent decodes and validates a lifecycle event, of schema v1 or v2:
// it does not require the tenant, which v1 events lack.
func DecodeEvent(data []byte) (*Event, error) {
	var e Event
	if err := decodeStrict(data, &e); err != nil {
		return nil, fmt.Errorf("invalid event: %w", err)
	}
	if err := requireKeys(data, "job_id", "attempt", "type", "time", "pool"); err != nil {
		return nil, fmt.Errorf("invalid event: %w", err)
	}
	if err := e.Validate(); err != nil {
		return nil, err
	}
	return &e, nil
}

// Validate checks an event against the contract.
func (e *Event) Validate() error {
	var v validator
	if e.JobID == "" || len(e.JobID) > 128 {
		v.add("job_id", "must be 1 to 128 characters")
	}
	if e.Tenant != "" && !ValidTenant(e.Tenant) {
		v.add("tenant", "%q must be 1 to 64 characters of [A-Za-z0-9_-]", truncate(e.Tenant, 40))
	}
	if e.Attempt < 0 {
		v.add("attempt", "must not be negative")
	}
	if e.Priority != 0 && (e.Priority < HighestPriority || e.Priority > LowestPriority) {
		v.add("priority", "%d must be from %d (highest) to %d (lowest)", e.Priority, HighestPriority, LowestPriority)
	}
	switch e.Type {
	case EventQueued, EventRejected, EventStarted, EventHeartbeat, EventLog, EventRetryScheduled,
		EventSucceeded, EventFailed, EventTimedOut, EventCancelled, EventDeadLettered:
	default:
		v.add("type", "%q is not an event type", truncate(string(e.Type), 40))
	}
	if e.Time.IsZero() {
		v.add("time", "is required")
	}
	if e.Pool == "" {
		v.add("pool", "is required")
	}
	v.failure("failure", e.Failure)
	v.traceID(e.TraceID)
	v.usage("usage", e.Usage)
	if e.Stream != "" && e.Stream != "stdout" && e.Stream != "stderr" {
		v.add("stream", "%q must be stdout or stderr", truncate(e.Stream, 40))
	}
	switch e.Type {
	case EventLog:
		if e.Stream == "" {
			v.add("stream", "is required in a log event")
		}
	case EventRetryScheduled:
		if e.NextAttemptAt == nil {
			v.add("next_attempt_at", "is required in a retry_scheduled event")
		}
		if e.Failure == nil {
			v.add("failure", "is required in a retry_scheduled event")
		}
	case EventRejected, EventFailed, EventTimedOut, EventCancelled, EventDeadLettered:
		if e.Failure == nil {
			v.add("failure", "is required in a %s event", e.Type)
		}
	}
	return v.errAs("event")
}

// DecodeResult decodes and validates a result.
func DecodeResult(data []byte) (*Result, error) {
	var r Result
	if err := decodeStrict(data, &r); err != nil {
		return nil, fmt.Errorf("invalid result: %w", err)
	}
	if err := requireKeys(data, "job_id", "pool", "status", "attempts", "finished_at"); err != nil {
		return nil, fmt.Errorf("invalid result: %w", err)
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return &r, nil
}

// Validate checks a result against the contract.
func (r *Result) Validate() error {
	var v validator
	if r.JobID == "" || len(r.JobID) > 128 {
		v.add("job_id", "must be 1 to 128 characters")
	}
	if r.Pool == "" {
		v.add("pool", "is required")
	}
	switch r.Status {
	case StatusSucceeded:
		if r.Failure != nil {
			v.add("failure", "must be absent when the job succeeded")
		}
	case StatusFailed, StatusTimedOut, StatusCancelled:
		if r.Failure == nil {
			v.add("failure", "is required when the job did not succeed")
		}
	default:
		v.add("status", "%q is not a final status", truncate(string(r.Status), 40))
	}
	if r.Attempts < 0 {
		v.add("attempts", "must not be negative")
	}
	if r.FinishedAt.IsZero() {
		v.add("finished_at", "is required")
	}
	v.failure("failure", r.Failure)
	v.traceID(r.TraceID)
	v.history(r.History)
	for _, name := range sortedArtifactKeys(r.Artifacts) {
		v.artifact("artifacts["+truncate(name, 40)+"]", r.Artifacts[name])
		if _, dup := r.Outputs[name]; dup {
			v.add("artifacts", "%q is also an inline output", truncate(name, 40))
		}
	}
	v.logInfo("log", r.Log)
	return v.errAs("result")
}

// history checks the attempts of a result or a record.
func (v *validator) history(h []Attempt) {
	for i, a := range h {
		if a.Attempt < 1 {
			v.add(fmt.Sprintf("history[%d].attempt", i), "must be at least 1")
		}
		v.failure(fmt.Sprintf("history[%d].failure", i), a.Failure)
		v.logInfo(fmt.Sprintf("history[%d].log", i), a.Log)
	}
}

// DecodeHeartbeat decodes and validates a capacity heartbeat.
func DecodeHeartbeat(data []byte) (*Heartbeat, error) {
	var h Heartbeat
	if err := decodeStrict(data, &h); err != nil {
		return nil, fmt.Errorf("invalid heartbeat: %w", err)
	}
	if err := requireKeys(data, "worker_id", "pool", "backend", "version", "observed_at", "health",
		"slots", "cpu_milli", "memory_bytes", "gpus", "running"); err != nil {
		return nil, fmt.Errorf("invalid heartbeat: %w", err)
	}
	if err := h.Validate(); err != nil {
		return nil, err
	}
	return &h, nil
}

// Backends a worker may report.
var backends = map[string]bool{"process": true, "docker": true, "kubernetes": true, "noop": true}

// Validate checks a heartbeat against the contract.
func (h *Heartbeat) Validate() error {
	var v validator
	if h.WorkerID == "" {
		v.add("worker_id", "is required")
	}
	if h.Pool == "" {
		v.add("pool", "is required")
	}
	if !backends[h.Backend] {
		v.add("backend", "%q is not a backend", truncate(h.Backend, 40))
	}
	if h.ObservedAt.IsZero() {
		v.add("observed_at", "is required")
	}
	switch h.Health {
	case HealthHealthy, HealthDegraded, HealthDraining, HealthUnhealthy:
	default:
		v.add("health", "%q is not a health", truncate(h.Health, 40))
	}
	if h.Slots.Total < 0 || h.Slots.Used < 0 || h.Slots.Available < 0 {
		v.add("slots", "must not be negative")
	}
	for name, a := range map[string]Amount{"cpu_milli": h.CPUMilli, "memory_bytes": h.MemoryBytes} {
		if a.Reserved < 0 || (a.Total != nil && *a.Total < 0) {
			v.add(name, "must not be negative")
		}
	}
	if h.GPUs.Total < 0 || h.GPUs.Reserved < 0 {
		v.add("gpus", "must not be negative")
	}
	if h.Running == nil {
		v.add("running", "is required (an empty list when idle)")
	}
	for i, r := range h.Running {
		if r.JobID == "" || r.Attempt < 1 || r.StartedAt.IsZero() || r.CPUMilli < 0 || r.MemoryBytes < 0 || r.GPUs < 0 {
			v.add(fmt.Sprintf("running[%d]", i), "needs job_id, attempt >= 1, started_at and non-negative resources")
		}
		v.usage(fmt.Sprintf("running[%d].usage", i), r.Usage)
	}
	if inv := h.Inventory; inv != nil {
		if len(inv.GPUs) > MaxInventoryGPUs || len(inv.Nodes) > MaxInventoryNodes || len(inv.Images) > MaxInventoryImages ||
			len(inv.PlacementKeys) > MaxNodeSelector*4 {
			v.add("inventory", "is over its bounds (%d GPU models, %d nodes, %d images, %d placement keys)",
				MaxInventoryGPUs, MaxInventoryNodes, MaxInventoryImages, MaxNodeSelector*4)
		}
		for i, g := range inv.GPUs {
			if g.Model == "" || g.Count < 1 {
				v.add(fmt.Sprintf("inventory.gpus[%d]", i), "needs a model and a count of at least 1")
			}
		}
		for i, n := range inv.Nodes {
			if n.Name == "" {
				v.add(fmt.Sprintf("inventory.nodes[%d].name", i), "is required")
			}
		}
	}
	return v.errAs("heartbeat")
}

// usage checks what an attempt uses: nothing negative, a time.
func (v *validator) usage(field string, u *Usage) {
	if u == nil {
		return
	}
	if u.ObservedAt.IsZero() {
		v.add(field+".observed_at", "is required")
	}
	if u.CPUPercent != nil && *u.CPUPercent < 0 {
		v.add(field+".cpu_percent", "must not be negative")
	}
	for _, n := range []*int64{u.MemoryBytes, u.MemoryLimitBytes, u.NetRxBytes, u.NetTxBytes, u.BlockReadBytes, u.BlockWriteBytes, u.Pids} {
		if n != nil && *n < 0 {
			v.add(field, "amounts must not be negative")
			return
		}
	}
}

func (v *validator) failure(field string, f *Failure) {
	if f == nil {
		return
	}
	if !f.Class.Valid() {
		v.add(field+".class", "%q is not a failure class", truncate(string(f.Class), 40))
	}
	if f.Code == "" {
		v.add(field+".code", "is required")
	}
}

func (v *validator) traceID(id string) {
	if id != "" && !traceIDRE.MatchString(id) {
		v.add("trace_id", "%q must be 32 lower-case hex digits", truncate(id, 40))
	}
}

func (v *validator) errAs(what string) error {
	if len(v.problems) == 0 {
		return nil
	}
	return &DocumentError{What: what, Problems: v.problems}
}

// DocumentError lists the problems of an event, result, heartbeat or
// record.
type DocumentError struct {
	What     string
	Problems []string
}

func (e *DocumentError) Error() string {
	return fmt.Sprintf("invalid %s: %s", e.What, joinProblems(e.Problems))
}
