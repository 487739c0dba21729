package console

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/job"
)

// FuzzDecodeRecord checks the index's record scanner against
// encoding/json decoding the contract's own type, job.Record: whatever
// document encoding/json reads, the scanner reading it whole reads the
// same fields, so a field renamed in package job fails here; and reading
// only the prefix of the document as the fleet writes it (encoding/json's
// field order), it reads the same too. (On a document encoding/json
// refuses, the scanner may still read what it needs: the streams hold
// only the fleet's records.)
func FuzzDecodeRecord(f *testing.F) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 123456789, time.UTC)
	code := 137
	full := &job.Record{ID: "j-1", Tenant: "acme", Pool: "gpu", Priority: 2, State: job.StateFailed, Event: job.EventFailed,
		Attempt: 2, MaxAttempts: 3, WorkerID: "w\"1", Backend: "docker", SubmittedAt: now, UpdatedAt: now, StartedAt: &now,
		FinishedAt: &now, NextAttemptAt: &now,
		Failure:  &job.Failure{Class: job.ClassOOM, Code: job.CodeOOMKilled, Message: "killed \u2014 \"memory\"\n\tover 512Mi"},
		ExitCode: &code, CancelRequested: true, TraceID: "abc", Labels: map[string]string{"team": "ml", "é": "ü"},
		History: []job.Attempt{{Attempt: 1, WorkerID: "w0", ExitCode: &code, Failure: &job.Failure{Class: "x"}}},
		Result:  &job.Result{JobID: "j-1", Status: job.StatusFailed, Stdout: "a lot"}, DeadLettered: true}
	data, _ := json.Marshal(full)
	f.Add(data)
	queued := &job.Record{ID: "q-1", Tenant: "default", Pool: "default", Priority: 3, State: job.StateQueued,
		SubmittedAt: now.In(time.FixedZone("x", -5*3600)), UpdatedAt: now, Labels: map[string]string{"a": "b"},
		Request: &job.Request{ID: "q-1", Command: []string{"sh", "-c", "echo \"hi\""}, Env: map[string]string{"K": ""}},
		Secrets: "c2VhbGVk"}
	data, _ = json.Marshal(queued)
	f.Add(data)
	f.Add([]byte(`{"id":"a","pool":"p","state":"queued","submitted_at":"2026-05-01T12:00:00Z","failure":null,"labels":null,"exit_code":null}`))
	f.Add([]byte(` { "id" : "a" , "extra" : [1, 2.5e3, {"x": [true, false, null]}], "attempt": -1 } `))
	f.Add([]byte(`{"request":null,"state":"running","labels":{"a":"1"},"labels":{"b":"2"},"failure":{"class":"x"},"failure":{"code":"y"}}`))
	f.Add([]byte(`{"id":"a","submitted_at":"not a time","updated_at":"0001-01-01T00:00:00Z"}`))
	f.Add([]byte(`{"id":"a","started_at":"2026-02-29T00:00:00Z","finished_at":"2024-02-29T23:59:59.5+14:00"}`))
	f.Add([]byte(`{"id":"a"`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var rec job.Record
		if err := json.Unmarshal(data, &rec); err != nil {
			var got recordView
			_ = decodeWith(data, &got, &interner{}, true) // it may read what it can; it must not fail otherwise
			return
		}
		want := normal(viewOf(&rec))
		var got recordView
		if err := decodeWith(data, &got, &interner{}, true); err != nil {
			t.Fatalf("encoding/json reads it, the scanner says %v", err)
		}
		if !reflect.DeepEqual(want, normal(got)) {
			t.Fatalf("decoded differently:\n json %+v\n scan %+v", want, normal(got))
		}
		canonical, err := json.Marshal(&rec)
		if err != nil {
			return
		}
		got = recordView{}
		if err := decodeRecord(canonical, &got, &interner{}); err != nil {
			t.Fatalf("the scanner cannot read %s: %v", canonical, err)
		}
		if !reflect.DeepEqual(want, normal(got)) {
			t.Fatalf("the prefix decoded differently:\n json %+v\n scan %+v\n of %s", want, normal(got), canonical)
		}
	})
}

// normal makes two decodings comparable: empty label lists as nil.
func normal(r recordView) recordView {
	if len(r.Labels) == 0 {
		r.Labels = nil
	}
	return r
}

// TestScannerKeysAreTheRecordsOwn: every key the scanner knows is the JSON
// name of a field of job.Record or job.Failure, and it stops reading a
// record only after every field it reads, in job.Record's order (the order
// encoding/json writes).
func TestScannerKeysAreTheRecordsOwn(t *testing.T) {
	names := map[string]bool{}
	var order []string
	for _, typ := range []reflect.Type{reflect.TypeOf(job.Record{}), reflect.TypeOf(job.Failure{})} {
		for i := range typ.NumField() {
			name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
			names[name] = true
			if typ == reflect.TypeOf(job.Record{}) {
				order = append(order, name)
			}
		}
	}
	for _, k := range recordKeys {
		if !names[string(k)] {
			t.Errorf("the scanner reads %q, which job.Record does not have", k)
		}
	}
	first := len(order)
	for _, k := range lastKeys {
		i := slices.Index(order, k)
		if i < 0 {
			t.Errorf("the scanner stops at %q, which job.Record does not have", k)
		}
		first = min(first, i)
	}
	for _, k := range recordKeys {
		if i := slices.Index(order, string(k)); i > first {
			t.Errorf("the scanner reads %q, which job.Record writes after %q, where the scanner stops", k, order[first])
		}
	}
}

// TestParseStampIsTimeParse: the scanner's times are time.Parse's.
func TestParseStampIsTimeParse(t *testing.T) {
	for _, s := range []string{"2026-05-01T12:00:00Z", "2026-05-01T12:00:00.123456789Z", "2026-05-01T12:00:00.1+02:00",
		"1970-01-01T00:00:00Z", "1969-12-31T23:59:59.999999999-00:30", "2024-02-29T23:59:59.5+14:00", "2000-03-01T00:00:00Z",
		"2261-12-31T23:59:59Z", "1678-01-01T00:00:00Z", "2100-02-28T10:11:12.000001Z"} {
		want, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := parseStamp([]byte(s))
		if !ok || got != want.UnixNano() {
			t.Errorf("%s: %d %v, want %d", s, got, ok, want.UnixNano())
		}
	}
	for _, s := range []string{"2026-02-29T00:00:00Z", "2026-05-01T24:00:00Z", "2026-05-01 12:00:00Z", "2026-05-01T12:00:00",
		"2026-05-01T12:00:00.Z", "2026-05-01T12:00:00.1234567890Z", "0001-01-01T00:00:00Z", "2026-05-01T12:00:00+2:00"} {
		if _, ok := parseStamp([]byte(s)); ok {
			t.Errorf("%s: read, want refused (for time.Parse to judge)", s)
		}
	}
}
