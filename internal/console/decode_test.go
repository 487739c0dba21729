package console

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/job"
)

// FuzzDecodeRecord checks the index's record scanner against
// encoding/json decoding the contract's own type, job.Record: whatever
// document encoding/json reads, the scanner reads the same fields, so a
// field renamed in package job fails here. (On a document encoding/json refuses, the scanner may
// still read what it needs: the bucket holds only the fleet's records.)
func FuzzDecodeRecord(f *testing.F) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 123456789, time.UTC)
	code := 137
	full := &job.Record{ID: "j-1", Pool: "gpu", State: job.StateFailed, Attempt: 2, MaxAttempts: 3, WorkerID: "w\"1",
		Backend: "docker", SubmittedAt: now, UpdatedAt: now, StartedAt: &now, FinishedAt: &now, NextAttemptAt: &now,
		Failure:  &job.Failure{Class: job.ClassOOM, Code: job.CodeOOMKilled, Message: "killed \u2014 \"memory\"\n\tover 512Mi"},
		ExitCode: &code, CancelRequested: true, TraceID: "abc", Labels: map[string]string{"team": "ml", "é": "ü"},
		History: []job.Attempt{{Attempt: 1, WorkerID: "w0", ExitCode: &code, Failure: &job.Failure{Class: "x"}}}}
	data, _ := json.Marshal(full)
	f.Add(data)
	f.Add([]byte(`{"id":"a","pool":"p","state":"queued","submitted_at":"2026-05-01T12:00:00Z","failure":null,"labels":null,"exit_code":null}`))
	f.Add([]byte(` { "id" : "a" , "extra" : [1, 2.5e3, {"x": [true, false, null]}], "attempt": -1 } `))
	f.Add([]byte(`{"id":"a","submitted_at":"not a time"}`))
	f.Add([]byte(`{"id":"a"`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var rec job.Record
		werr := json.Unmarshal(data, &rec)
		want := viewOf(&rec)
		var got recordView
		gerr := decodeRecord(data, &got, &interner{})
		if werr != nil {
			return
		}
		if gerr != nil {
			t.Fatalf("encoding/json reads it, the scanner says %v", gerr)
		}
		if !reflect.DeepEqual(normal(want), normal(got)) {
			t.Fatalf("decoded differently:\n json %+v\n scan %+v", want, got)
		}
	})
}

// normal makes two decodings comparable: times by instant, and empty
// maps as nil.
func normal(r recordView) recordView {
	r.SubmittedAt, r.UpdatedAt = r.SubmittedAt.UTC(), r.UpdatedAt.UTC()
	r.StartedAt, r.FinishedAt, r.NextAttemptAt = r.StartedAt.UTC(), r.FinishedAt.UTC(), r.NextAttemptAt.UTC()
	if len(r.Labels) == 0 {
		r.Labels = nil
	}
	return r
}

// TestScannerKeysAreTheRecordsOwn: every key the scanner knows is the JSON
// name of a field of job.Record or job.Failure.
func TestScannerKeysAreTheRecordsOwn(t *testing.T) {
	names := map[string]bool{}
	for _, typ := range []reflect.Type{reflect.TypeOf(job.Record{}), reflect.TypeOf(job.Failure{})} {
		for i := range typ.NumField() {
			name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
			names[name] = true
		}
	}
	for _, k := range recordKeys {
		if !names[string(k)] {
			t.Errorf("the scanner reads %q, which job.Record does not have", k)
		}
	}
}
