package job_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/fleet-dev/fleet/job"
	"github.com/fleet-dev/fleet/schemas"
)

// The fixtures under schemas/testdata are checked against both the JSON
// Schemas and the Go decoders, so that the two cannot drift apart:
//
//	valid/     both accept
//	invalid/   both refuse
//	semantic/  the schema accepts, Go refuses: the rules a schema cannot state
//	           (sums of sizes, minimums of quantities, configurable limits)
//
// The folders of schemas/testdata are named after the kinds below: request,
// event, result and heartbeat are v1 documents, request-v2 and so on v2.

// schemaOf is the schema of each kind of fixture.
var schemaOf = map[string]string{
	"request":    schemas.ExecutionRequest,
	"request-v2": schemas.ExecutionRequestV2,
	"event":      schemas.LifecycleEvent,
	"event-v2":   schemas.LifecycleEventV2,
	"result":     schemas.Result,
	"heartbeat":  schemas.CapacityHeartbeat,
	"record-v2":  schemas.JobRecordV2,
}

// writtenAs is the kind of what Go writes back of a kind, where it is not
// the same: the fleet writes v2 requests (Normalize fills in a priority,
// which v1 has no field for).
var writtenAs = map[string]string{"request": "request-v2"}

func compileSchemas(t *testing.T) map[string]*jsonschema.Schema {
	t.Helper()
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	entries, err := schemas.FS.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		data, err := schemas.FS.ReadFile(e.Name())
		if err != nil {
			t.Fatal(err)
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
		if err != nil {
			t.Fatalf("%s: %v", e.Name(), err)
		}
		if err := c.AddResource(schemas.BaseURL+e.Name(), doc); err != nil {
			t.Fatalf("%s: %v", e.Name(), err)
		}
	}
	out := map[string]*jsonschema.Schema{}
	for doc, file := range schemaOf {
		s, err := c.Compile(schemas.BaseURL + file)
		if err != nil {
			t.Fatalf("compile %s: %v", file, err)
		}
		out[doc] = s
	}
	return out
}

func schemaErr(s *jsonschema.Schema, data []byte) error {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		return err
	}
	return s.Validate(doc)
}

// goDecode runs the Go side of the boundary for one kind of document and
// returns the document re-encoded, so that what Go writes is checked too.
func goDecode(kind string, data []byte) ([]byte, error) {
	switch kind {
	case "request", "request-v2":
		r, err := job.DecodeRequest(data, job.Limits{})
		if err != nil {
			return nil, err
		}
		if err := r.Validate(job.Limits{}); err != nil {
			return nil, err
		}
		r.Normalize()
		if err := r.Validate(job.Limits{}); err != nil {
			return nil, err
		}
		return json.Marshal(r)
	case "event", "event-v2":
		e, err := job.DecodeEvent(data)
		if err != nil {
			return nil, err
		}
		return json.Marshal(e)
	case "result":
		r, err := job.DecodeResult(data)
		if err != nil {
			return nil, err
		}
		return json.Marshal(r)
	case "record-v2":
		r, err := job.DecodeRecord(data)
		if err != nil {
			return nil, err
		}
		return json.Marshal(r)
	case "heartbeat":
		h, err := job.DecodeHeartbeat(data)
		if err != nil {
			return nil, err
		}
		return json.Marshal(h)
	}
	panic(kind)
}

func TestFixturesAgreeWithSchemas(t *testing.T) {
	compiled := compileSchemas(t)
	files, err := filepath.Glob("../schemas/testdata/*/*/*.json")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 50 {
		t.Fatalf("found only %d fixtures", len(files))
	}
	counts := map[string]int{}
	for _, f := range files {
		parts := strings.Split(filepath.ToSlash(f), "/")
		kind, expect := parts[len(parts)-3], parts[len(parts)-2]
		counts[kind+"/"+expect]++
		t.Run(kind+"/"+expect+"/"+strings.TrimSuffix(parts[len(parts)-1], ".json"), func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			s, ok := compiled[kind]
			if !ok {
				t.Fatalf("no schema for fixtures of %q", kind)
			}
			sErr := schemaErr(s, data)
			out, gErr := goDecode(kind, data)
			switch expect {
			case "valid":
				if sErr != nil {
					t.Errorf("schema refused a valid document: %v", sErr)
				}
				if gErr != nil {
					t.Errorf("Go refused a valid document: %v", gErr)
				}
				if gErr == nil {
					if w, ok := writtenAs[kind]; ok {
						s = compiled[w]
					}
					if err := schemaErr(s, out); err != nil {
						t.Errorf("schema refused what Go wrote back: %v\n%s", err, out)
					}
				}
			case "invalid":
				if sErr == nil {
					t.Error("schema accepted an invalid document")
				}
				if gErr == nil {
					t.Error("Go accepted an invalid document")
				}
			case "semantic":
				if sErr != nil {
					t.Errorf("schema refused it (it belongs in invalid/): %v", sErr)
				}
				if gErr == nil {
					t.Error("Go accepted a document that breaks a semantic rule")
				}
			default:
				t.Fatalf("unknown fixture folder %q", expect)
			}
		})
	}
	for _, k := range []string{"request/valid", "request/invalid", "request/semantic", "event/valid", "event/invalid",
		"result/valid", "result/invalid", "heartbeat/valid", "heartbeat/invalid",
		"request-v2/valid", "request-v2/invalid", "request-v2/semantic", "event-v2/valid", "event-v2/invalid",
		"record-v2/valid", "record-v2/invalid", "record-v2/semantic"} {
		if counts[k] == 0 {
			t.Errorf("no fixtures in %s", k)
		}
	}
}

// Documents built by Go code, with every field set, must satisfy the
// schemas: this catches a field added to a Go type but not to its schema.
func TestGoDocumentsMatchSchemas(t *testing.T) {
	compiled := compileSchemas(t)
	size := int64(3)
	r := &job.Request{Command: []string{"true"}, Env: map[string]string{"A": "b"},
		InputRefs: map[string]job.InputRef{"in.bin": {Bucket: "fleet-uploads", Key: "u/in.bin", Size: &size,
			SHA256: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"}},
		Resources: &job.Resources{GPU: 1, GPUModel: "H100"}, Persist: &job.Persist{Enabled: true, Size: "1Gi"},
		Placement: &job.Placement{NodeSelector: map[string]string{"zone": "a"}}}
	r.Normalize()
	r.Priority = 1
	// A v1 request is the v2 one without its priority.
	v1 := r.Clone()
	v1.Priority = 0
	// A v1 event is the v2 one without its tenant.
	e := sampleEvent()
	e.Tenant = "acme"
	for kind, doc := range map[string]any{
		"request":    v1,
		"request-v2": r,
		"event":      sampleEvent(),
		"event-v2":   e,
		"result":     sampleResult(),
		"heartbeat":  sampleHeartbeat(),
	} {
		data, err := json.Marshal(doc)
		if err != nil {
			t.Fatal(err)
		}
		if err := schemaErr(compiled[kind], data); err != nil {
			t.Errorf("%s: %v\n%s", kind, err, data)
		}
	}
	recs := sampleRecords()
	set := map[string]bool{}
	for _, rec := range recs {
		v := reflect.ValueOf(rec).Elem()
		for i := range v.NumField() {
			if !v.Field(i).IsZero() {
				set[v.Type().Field(i).Name] = true
			}
		}
		data, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		if err := schemaErr(compiled["record-v2"], data); err != nil {
			t.Errorf("record-v2 (%s): %v\n%s", rec.State, err, data)
		}
		if _, err := job.DecodeRecord(data); err != nil {
			t.Errorf("record-v2 (%s): %v", rec.State, err)
		}
	}
	for _, f := range reflect.VisibleFields(reflect.TypeFor[job.Record]()) {
		if !set[f.Name] {
			t.Errorf("no sample record sets Record.%s", f.Name)
		}
	}
}

// A v2 schema is its v1 schema with a field more, and copies v1's
// definitions rather than refer to them: every v1 fixture must get the same
// verdict from both, so that the copies cannot drift apart.
func TestV2SchemasKeepV1Rules(t *testing.T) {
	compiled := compileSchemas(t)
	for _, c := range []struct {
		v1, v2 string
		// upgrade makes a v1 document a v2 one.
		upgrade func(map[string]any)
	}{
		{v1: "request", v2: "request-v2"},
		{v1: "event", v2: "event-v2", upgrade: func(doc map[string]any) { doc["tenant"] = "acme" }},
	} {
		files, err := filepath.Glob("../schemas/testdata/" + c.v1 + "/*/*.json")
		if err != nil || len(files) == 0 {
			t.Fatalf("no fixtures of %s: %v", c.v1, err)
		}
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			v1Err := schemaErr(compiled[c.v1], data)
			var doc map[string]any
			if c.upgrade != nil && json.Unmarshal(data, &doc) == nil && doc != nil {
				c.upgrade(doc)
				if data, err = json.Marshal(doc); err != nil {
					t.Fatal(err)
				}
			}
			v2Err := schemaErr(compiled[c.v2], data)
			if (v1Err == nil) != (v2Err == nil) {
				t.Errorf("%s: %s says %v, %s says %v", f, c.v1, v1Err, c.v2, v2Err)
			}
		}
	}
}

// A v2 event names its tenant. DecodeEvent does not require it: it reads
// v1 events too.
func TestEventV2NeedsTenant(t *testing.T) {
	compiled := compileSchemas(t)
	files, err := filepath.Glob("../schemas/testdata/event/valid/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no v1 events: %v", err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := schemaErr(compiled["event-v2"], data); err == nil {
			t.Errorf("%s: the v2 schema accepted an event without a tenant", f)
		}
	}
}

// The events a record version stands for are v2 events.
func TestEventsOfRecordsMatchSchema(t *testing.T) {
	compiled := compileSchemas(t)
	files, err := filepath.Glob("../schemas/testdata/record-v2/valid/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no records: %v", err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rec, err := job.DecodeRecord(data)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, e := range job.EventsOf(rec) {
			enc, err := json.Marshal(e)
			if err != nil {
				t.Fatal(err)
			}
			if err := schemaErr(compiled["event-v2"], enc); err != nil {
				t.Errorf("%s: event %s: %v\n%s", f, e.Type, err, enc)
			}
			if _, err := job.DecodeEvent(enc); err != nil {
				t.Errorf("%s: event %s: %v", f, e.Type, err)
			}
		}
	}
}
