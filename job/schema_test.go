package job_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/fleet-dev/fleet/internal/schematest"
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
// event, result and heartbeat are v1 documents, request-v2 and so on v2;
// run-request is a run as submitted, and run-definition, run-node-ended,
// run-cancel, run-retry and run-end are the messages of a run, each one
// of the $defs of run-record.v1 (runMessages); run-submit-reply, run-view,
// run-reply and run-list are the answers a tenant reads about its runs,
// each one of the $defs of run-answer.v1.

// schemaOf is the schema of each kind of fixture.
var schemaOf = map[string]string{
	"request":    schemas.ExecutionRequest,
	"request-v2": schemas.ExecutionRequestV2,
	"event":      schemas.LifecycleEvent,
	"event-v2":   schemas.LifecycleEventV2,
	"result":     schemas.Result,
	"heartbeat":  schemas.CapacityHeartbeat,
	"record-v2":  schemas.JobRecordV2,

	"run-request":    schemas.RunRequest,
	"run-definition": schemas.RunRecord + "#/$defs/definition",
	"run-node-ended": schemas.RunRecord + "#/$defs/node_ended",
	"run-cancel":     schemas.RunRecord + "#/$defs/cancel",
	"run-retry":      schemas.RunRecord + "#/$defs/retry",
	"run-end":        schemas.RunRecord + "#/$defs/end",

	"run-submit-reply": schemas.RunAnswer + "#/$defs/submit_reply",
	"run-view":         schemas.RunAnswer + "#/$defs/view",
	"run-reply":        schemas.RunAnswer + "#/$defs/reply",
	"run-list":         schemas.RunAnswer + "#/$defs/list",

	"feed-request": schemas.Feed + "#/$defs/request",
	"feed-reply":   schemas.Feed + "#/$defs/reply",
}

// runMessages are the kinds of the messages of a run, which run-record.v1
// holds all of.
var runMessages = []string{"run-definition", "run-node-ended", "run-cancel", "run-retry", "run-end"}

// answers are the kinds the fleet writes and only clients read: Go
// decodes them as a client does and has no checks of its own, so their
// invalid fixtures are the schema's to refuse (what the fleet writes is
// held to the schema by TestGoDocumentsMatchSchemas, and by the outside
// client's test of the dispatcher's answers).
var answers = map[string]bool{"run-submit-reply": true, "run-view": true, "run-reply": true, "run-list": true, "feed-reply": true}

// writtenAs is the kind of what Go writes back of a kind, where it is not
// the same: the fleet writes v2 requests (Normalize fills in a priority,
// which v1 has no field for).
var writtenAs = map[string]string{"request": "request-v2"}

func compileSchemas(t *testing.T) map[string]*jsonschema.Schema {
	t.Helper()
	c := schematest.Compiler(t)
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
	case "run-request":
		r, err := job.DecodeRunRequest(data, job.RunLimits{})
		if err != nil {
			return nil, err
		}
		if err := r.Validate(job.Limits{}, job.RunLimits{}); err != nil {
			return nil, err
		}
		return json.Marshal(r)
	case "run-definition":
		return reencode(job.DecodeRunRecord(data))
	case "run-node-ended":
		return reencode(job.DecodeNodeEnded(data))
	case "run-cancel":
		return reencode(job.DecodeRunCancel(data))
	case "run-retry":
		return reencode(job.DecodeRunRetry(data))
	case "run-end":
		return reencode(job.DecodeRunEnd(data))
	case "run-submit-reply":
		return reencode(decodeAnswer[job.RunSubmitReply](data))
	case "run-view":
		return reencode(decodeAnswer[job.RunView](data))
	case "run-reply":
		return reencode(decodeAnswer[job.RunReply](data))
	case "run-list":
		return reencode(decodeAnswer[job.RunList](data))
	case "feed-request":
		return reencode(job.DecodeFeedRequest(data))
	case "feed-reply":
		return reencode(decodeAnswer[job.FeedReply](data))
	}
	panic(kind)
}

// decodeAnswer decodes an answer as a client does, refusing a field the Go
// type does not have: the answers have no decoder of their own, and their
// checks are the schema's.
func decodeAnswer[T any](data []byte) (*T, error) {
	var v T
	d := json.NewDecoder(bytes.NewReader(data))
	d.DisallowUnknownFields()
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	return &v, nil
}

// reencode is what a decoder wrote back: v encoded, unless err.
func reencode[T any](v *T, err error) ([]byte, error) {
	if err != nil {
		return nil, err
	}
	return json.Marshal(v)
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
			sErr := schematest.Validate(s, data)
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
					if err := schematest.Validate(s, out); err != nil {
						t.Errorf("schema refused what Go wrote back: %v\n%s", err, out)
					}
				}
			case "invalid":
				if sErr == nil {
					t.Error("schema accepted an invalid document")
				}
				if gErr == nil && !answers[kind] {
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
		"record-v2/valid", "record-v2/invalid", "record-v2/semantic",
		"run-request/valid", "run-request/invalid", "run-request/semantic",
		"run-definition/valid", "run-definition/invalid", "run-definition/semantic",
		"run-node-ended/valid", "run-node-ended/invalid", "run-node-ended/semantic",
		"run-cancel/valid", "run-cancel/invalid", "run-retry/valid", "run-retry/invalid",
		"run-end/valid", "run-end/invalid", "run-end/semantic",
		"run-submit-reply/valid", "run-submit-reply/invalid", "run-view/valid", "run-view/invalid",
		"run-reply/valid", "run-reply/invalid", "run-list/valid", "run-list/invalid",
		"feed-request/valid", "feed-request/invalid", "feed-request/semantic", "feed-reply/valid", "feed-reply/invalid"} {
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
		if err := schematest.Validate(compiled[kind], data); err != nil {
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
		if err := schematest.Validate(compiled["record-v2"], data); err != nil {
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

	// A run's documents, and the end of a node that job.EndOf makes of
	// its job's final version.
	final := sampleRecords()[1]
	final.ID, final.RunID, final.NodeID = job.RunJobID("nightly", "index", 3), "nightly", "index"
	final.Result.JobID = final.ID
	ended, ok := job.EndOf(final)
	if !ok {
		t.Fatal("EndOf: not the end of a node")
	}
	set = map[string]bool{}
	epoch := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		kind string
		doc  any
	}{
		{"run-request", sampleRunRequest()},
		{"run-definition", sampleRunRecord()},
		{"run-node-ended", sampleNodeEnded()},
		{"run-node-ended", ended},
		{"run-cancel", sampleRunCancel()},
		{"run-retry", sampleRunRetry()},
		{"run-end", sampleRunEnd()},
		{"run-submit-reply", sampleRunSubmitReply()},
		{"run-submit-reply", &job.RunSubmitReply{RunID: "nightly", Error: "the run is refused", Problems: []string{"nodes[1].after: no node x"}}},
		{"run-view", sampleRunView()},
		{"run-reply", sampleRunReply()},
		{"run-list", &job.RunList{Runs: []string{"nightly", "weekly"}}},
		{"feed-request", &job.FeedRequest{From: "new", Pool: "gpu", AckWait: job.Duration(time.Minute), MaxAckPending: 10}},
		{"feed-request", &job.FeedRequest{StartSeq: 7, Inactive: job.Duration(time.Hour)}},
		{"feed-request", &job.FeedRequest{StartTime: &epoch}},
		{"feed-reply", &job.FeedReply{Stream: "FLEET_FEED_acme", Consumer: "billing", Subject: "fleet.t.acme.job.>"}},
	} {
		fieldsSet(reflect.ValueOf(c.doc), set)
		data, err := json.Marshal(c.doc)
		if err != nil {
			t.Fatal(err)
		}
		if err := schematest.Validate(compiled[c.kind], data); err != nil {
			t.Errorf("%s: %v\n%s", c.kind, err, data)
		}
		if _, err := goDecode(c.kind, data); err != nil {
			t.Errorf("%s: %v", c.kind, err)
		}
	}
	for _, typ := range []reflect.Type{reflect.TypeFor[job.RunRequest](), reflect.TypeFor[job.RunNode](),
		reflect.TypeFor[job.OutputOf](), reflect.TypeFor[job.RunRecord](), reflect.TypeFor[job.RunNodeRecord](),
		reflect.TypeFor[job.NodeEnded](), reflect.TypeFor[job.RunCancel](), reflect.TypeFor[job.RunRetry](),
		reflect.TypeFor[job.RunEnd](), reflect.TypeFor[job.NodeState](), reflect.TypeFor[job.RunSubmitReply](),
		reflect.TypeFor[job.RunView](), reflect.TypeFor[job.NodeView](), reflect.TypeFor[job.RunReply](),
		reflect.TypeFor[job.RunList]()} {
		for _, f := range reflect.VisibleFields(typ) {
			if !set[typ.Name()+"."+f.Name] {
				t.Errorf("no sample sets %s.%s", typ.Name(), f.Name)
			}
		}
	}
}

// fieldsSet notes in set, as Type.Field, every field of package job's
// struct types that v sets, however deep: in pointers, slices and maps.
func fieldsSet(v reflect.Value, set map[string]bool) {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			fieldsSet(v.Elem(), set)
		}
	case reflect.Slice:
		for i := range v.Len() {
			fieldsSet(v.Index(i), set)
		}
	case reflect.Map:
		for it := v.MapRange(); it.Next(); {
			fieldsSet(it.Value(), set)
		}
	case reflect.Struct:
		typ := v.Type()
		if typ.PkgPath() != reflect.TypeFor[job.Request]().PkgPath() {
			return
		}
		for i := range v.NumField() {
			if !v.Field(i).IsZero() {
				set[typ.Name()+"."+typ.Field(i).Name] = true
			}
			fieldsSet(v.Field(i), set)
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
			v1Err := schematest.Validate(compiled[c.v1], data)
			var doc map[string]any
			if c.upgrade != nil && json.Unmarshal(data, &doc) == nil && doc != nil {
				c.upgrade(doc)
				if data, err = json.Marshal(doc); err != nil {
					t.Fatal(err)
				}
			}
			v2Err := schematest.Validate(compiled[c.v2], data)
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
		if err := schematest.Validate(compiled["event-v2"], data); err == nil {
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
			if err := schematest.Validate(compiled["event-v2"], enc); err != nil {
				t.Errorf("%s: event %s: %v\n%s", f, e.Type, err, enc)
			}
			if _, err := job.DecodeEvent(enc); err != nil {
				t.Errorf("%s: event %s: %v", f, e.Type, err)
			}
		}
	}
}

// A version that also records its attempt's start stands for that
// attempt's started event first, at the attempt's start, then its own:
// a watcher hears every attempt start, whether or not it had a running
// version of its own.
func TestEventsOfAVersionThatRecordsItsAttemptsStart(t *testing.T) {
	data, err := os.ReadFile("../schemas/testdata/record-v2/valid/succeeded-attempt-started.json")
	if err != nil {
		t.Fatal(err)
	}
	rec, err := job.DecodeRecord(data)
	if err != nil {
		t.Fatal(err)
	}
	es := job.EventsOf(rec)
	if len(es) != 2 || es[0].Type != job.EventStarted || es[1].Type != job.EventSucceeded {
		t.Fatalf("events %v; want started, succeeded", es)
	}
	if !es[0].Time.Equal(*rec.Result.StartedAt) || es[0].Attempt != 1 || es[0].WorkerID != "w1" {
		t.Errorf("started event %+v; want attempt 1 of w1 at %s", es[0], rec.Result.StartedAt)
	}
	// A retry's version: the attempt's start is its entry in the history.
	start := rec.Result.StartedAt.Add(-time.Second)
	retry := rec.Version()
	retry.State, retry.Event, retry.FinishedAt, retry.AttemptStarted = job.StateRetrying, job.EventRetryScheduled, nil, true
	retry.Failure = job.Failf(job.ClassExecution, job.CodeExitCode, "exit 1")
	retry.History = []job.Attempt{{Attempt: 1, StartedAt: &start, Failure: retry.Failure}}
	if es := job.EventsOf(retry); len(es) != 2 || es[0].Type != job.EventStarted || !es[0].Time.Equal(start) {
		t.Errorf("retry's events %v; want started at %s first", es, start)
	}
	rec.AttemptStarted = false
	if es := job.EventsOf(rec); len(es) != 1 {
		t.Errorf("a version without attempt_started stands for %d events; want 1", len(es))
	}
}

// A run's node's job is an execution request, whose fields only the fleet
// sets (id, run_id, node_id) aside: every request fixture, as the job of
// a run's one node, gets the verdict it gets alone, from the schemas and
// from Go.
func TestRunNodesJobsAreRequests(t *testing.T) {
	compiled := compileSchemas(t)
	files, err := filepath.Glob("../schemas/testdata/request*/*/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no request fixtures: %v", err)
	}
	n := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var doc map[string]any
		if json.Unmarshal(data, &doc) != nil || doc == nil || doc["id"] != nil || doc["run_id"] != nil || doc["node_id"] != nil {
			continue
		}
		n++
		run := []byte(`{"id": "r", "nodes": [{"id": "a", "job": ` + string(data) + `}]}`)
		reqErr := schematest.Validate(compiled["request-v2"], data)
		runErr := schematest.Validate(compiled["run-request"], run)
		if (reqErr == nil) != (runErr == nil) {
			t.Errorf("%s: the request schema says %v, the run's says %v", f, reqErr, runErr)
		}
		_, reqErr = goDecode("request-v2", data)
		_, runErr = goDecode("run-request", run)
		if (reqErr == nil) != (runErr == nil) {
			t.Errorf("%s: Go says %v of the request, %v of the run", f, reqErr, runErr)
		}
	}
	if n < 20 {
		t.Errorf("only %d request fixtures without an id", n)
	}
}

// The schema's bound on a run's nodes is Go's default one.
func TestRunRequestNodeBoundMatchesGo(t *testing.T) {
	compiled := compileSchemas(t)
	for _, n := range []int{job.DefaultMaxRunNodes, job.DefaultMaxRunNodes + 1} {
		r := &job.RunRequest{ID: "many", Nodes: make([]job.RunNode, n)}
		for i := range r.Nodes {
			r.Nodes[i] = job.RunNode{ID: "n" + strconv.Itoa(i), Job: &job.Request{Command: []string{"true"}}}
		}
		data, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		sErr := schematest.Validate(compiled["run-request"], data)
		_, gErr := goDecode("run-request", data)
		if (sErr == nil) != (n <= job.DefaultMaxRunNodes) || (gErr == nil) != (sErr == nil) {
			t.Errorf("%d nodes: the schema says %v, Go %v", n, sErr, gErr)
		}
	}
}

// run-record.v1 holds every message of a run, each as exactly one of its
// $defs: a valid message of each kind is valid as a run record, and as no
// other kind's.
func TestRunRecordTellsItsMessagesApart(t *testing.T) {
	compiled := compileSchemas(t)
	whole, err := schematest.Compiler(t).Compile(schemas.BaseURL + schemas.RunRecord)
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range runMessages {
		files, err := filepath.Glob("../schemas/testdata/" + kind + "/valid/*.json")
		if err != nil || len(files) == 0 {
			t.Fatalf("no valid fixtures of %s: %v", kind, err)
		}
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if err := schematest.Validate(whole, data); err != nil {
				t.Errorf("%s: not a run record: %v", f, err)
			}
			for _, other := range runMessages {
				if other != kind && schematest.Validate(compiled[other], data) == nil {
					t.Errorf("%s: also valid as %s", f, other)
				}
			}
		}
	}
}
