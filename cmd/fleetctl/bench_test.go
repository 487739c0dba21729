package main

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/job"
)

// The bench reads a final version's result status and start by looking
// for their keys, as encoding/json writes them; a record written
// otherwise is decoded whole, to the same answer.
func TestBenchReadsTheResultOfAFinalVersion(t *testing.T) {
	start := time.Date(2026, 12, 1, 9, 0, 0, 123456789, time.UTC)
	first := start.Add(-time.Minute)
	rec := &job.Record{ID: "j", Tenant: "default", Pool: "default", State: job.StateFailed, Event: job.EventFailed,
		Attempt: 2, StartedAt: &first, History: []job.Attempt{{Attempt: 1, StartedAt: &first}},
		Result: &job.Result{JobID: "j", Pool: "default", Status: job.StatusFailed, StartedAt: &start,
			History: []job.Attempt{{Attempt: 1, StartedAt: &first}}}}
	data, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	if status, at := resultOf(data); status != job.StatusFailed || !at.Equal(start) {
		t.Errorf("resultOf: %s %s; want failed, %s", status, at, start)
	}
	// Keys in another order, with spaces: decoded whole.
	other := []byte(`{"result": {"started_at": "2026-12-01T09:00:00.123456789Z", "status": "succeeded"}, "state": "succeeded"}`)
	if status, at := resultOf(other); status != job.StatusSucceeded || !at.Equal(start) {
		t.Errorf("resultOf of a record written otherwise: %s %s", status, at)
	}
}
