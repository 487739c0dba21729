package job_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/fleet-dev/fleet/job"
)

func TestDecodeRecordRoundTrips(t *testing.T) {
	for _, rec := range sampleRecords() {
		data := mustJSON(t, rec)
		back, err := job.DecodeRecord(data)
		if err != nil {
			t.Fatalf("%s: %v", rec.State, err)
		}
		if again := mustJSON(t, back); !bytes.Equal(again, data) {
			t.Errorf("%s: decode(encode(r)) differs:\n%s\n%s", rec.State, data, again)
		}
	}
}

// Each broken record is refused with a problem that names the field.
func TestDecodeRecordNamesTheField(t *testing.T) {
	queued, final := sampleRecords()[0], sampleRecords()[1]
	for _, c := range []struct {
		name   string
		base   *job.Record
		change func(map[string]any)
		want   string
	}{
		{"unknown field", queued, func(d map[string]any) { d["env"] = map[string]any{"A": "b"} }, `unknown field "env"`},
		{"no tenant", queued, func(d map[string]any) { delete(d, "tenant") }, "tenant: is required"},
		{"bad tenant", queued, func(d map[string]any) { d["tenant"] = "a.b" }, "tenant: "},
		{"bad pool", queued, func(d map[string]any) { d["pool"] = "" }, "pool: "},
		{"bad id", queued, func(d map[string]any) { d["id"] = ".j" }, "id: "},
		{"bad state", queued, func(d map[string]any) { d["state"] = "done" }, "state: "},
		{"no event", queued, func(d map[string]any) { delete(d, "event") }, "event: is required"},
		{"priority", queued, func(d map[string]any) { d["priority"] = 6 }, "priority: "},
		{"request's field", queued, func(d map[string]any) { d["request"].(map[string]any)["pool"] = "a.b" }, "request.pool: "},
		{"secrets", queued, func(d map[string]any) { d["secrets"] = "A=b" }, "secrets: "},
		{"request later", final, func(d map[string]any) { d["request"] = map[string]any{} }, "request: "},
		{"no result", final, func(d map[string]any) { delete(d, "result") }, "result: is required"},
		{"result's field", final, func(d map[string]any) { d["result"].(map[string]any)["attempts"] = -1 }, "result.attempts: "},
		{"result of another", final, func(d map[string]any) { d["result"].(map[string]any)["job_id"] = "j2" }, "result: belongs to job j2"},
		{"status", final, func(d map[string]any) { d["state"], d["event"] = "timed_out", "timed_out" }, "result.status: "},
		{"event", final, func(d map[string]any) { d["event"] = "started" }, "event: "},
		{"dead letter", final, func(d map[string]any) {
			d["state"], d["event"] = "cancelled", "cancelled"
			d["result"].(map[string]any)["status"] = "cancelled"
		}, "dead_lettered: "},
		{"history", final, func(d map[string]any) { d["history"].([]any)[0].(map[string]any)["attempt"] = 0 }, "history[0].attempt: "},
	} {
		t.Run(c.name, func(t *testing.T) {
			var doc map[string]any
			if err := json.Unmarshal(mustJSON(t, c.base), &doc); err != nil {
				t.Fatal(err)
			}
			c.change(doc)
			_, err := job.DecodeRecord(mustJSON(t, doc))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want a problem with %q", err, c.want)
			}
			if !strings.HasPrefix(err.Error(), "invalid record: ") {
				t.Errorf("%q does not say what is invalid", err)
			}
		})
	}
}

// A record's request was held to its dispatcher's limits, which may be
// above the defaults: the record is not refused for its sizes.
func TestDecodeRecordAcceptsRequestsOverDefaultLimits(t *testing.T) {
	rec := sampleRecords()[0]
	rec.Request.Env = map[string]string{}
	for i := range job.DefaultLimits.MaxEnv + 1 {
		rec.Request.Env[fmt.Sprintf("V%d", i)] = ""
	}
	if err := rec.Request.Validate(job.Limits{}); err == nil {
		t.Fatal("the request is within the default limits; the test proves nothing")
	}
	if _, err := job.DecodeRecord(mustJSON(t, rec)); err != nil {
		t.Fatal(err)
	}
}
