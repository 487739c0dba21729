package job_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/job"
)

// TestLimitsRejectWithTheField proves that each limit on what a request may
// ask for rejects a request just over it, with a message naming the field
// and the limit, and accepts one at the limit.
func TestLimitsRejectWithTheField(t *testing.T) {
	l := job.DefaultLimits
	many := func(n int, f func(i int) string) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = f(i)
		}
		return out
	}
	keyed := func(n int, key func(i int) string, value string) map[string]string {
		m := map[string]string{}
		for i := 0; i < n; i++ {
			m[key(i)] = value
		}
		return m
	}
	name := func(i int) string { return fmt.Sprintf("f%d", i) }
	envKey := func(i int) string { return fmt.Sprintf("K%d", i) }
	d := func(v time.Duration) *job.Duration { x := job.Duration(v); return &x }

	for _, tc := range []struct {
		name string
		// at builds a request at the limit, over one just over it.
		at, over func(r *job.Request)
		// want is what the error must contain: the field, then the limit.
		want []string
	}{
		{"command arguments",
			func(r *job.Request) { r.Command = many(l.MaxCommandArgs, name) },
			func(r *job.Request) { r.Command = many(l.MaxCommandArgs+1, name) },
			[]string{"command: has 257 arguments", "limit of 256"}},
		{"command length",
			func(r *job.Request) { r.Command = []string{"sh", strings.Repeat("x", l.MaxCommandBytes-2)} },
			func(r *job.Request) { r.Command = []string{"sh", strings.Repeat("x", l.MaxCommandBytes-1)} },
			[]string{"command: is 65537 bytes", "limit of 65536"}},
		{"env entries",
			func(r *job.Request) { r.Env = keyed(l.MaxEnv, envKey, "v") },
			func(r *job.Request) { r.Env = keyed(l.MaxEnv+1, envKey, "v") },
			[]string{"env: has 129 entries", "limit of 128"}},
		{"env size",
			func(r *job.Request) { r.Env = map[string]string{"K": strings.Repeat("v", l.MaxEnvBytes-1)} },
			func(r *job.Request) { r.Env = map[string]string{"K": strings.Repeat("v", l.MaxEnvBytes)} },
			[]string{"env: is 65537 bytes", "limit of 65536"}},
		{"env key length",
			func(r *job.Request) { r.Env = map[string]string{strings.Repeat("K", 256): "v"} },
			func(r *job.Request) { r.Env = map[string]string{strings.Repeat("K", 257): "v"} },
			[]string{"env: key", "at most 256 characters"}},
		{"input files",
			func(r *job.Request) { r.Inputs = keyed(l.MaxInputs, name, "x") },
			func(r *job.Request) { r.Inputs = keyed(l.MaxInputs+1, name, "x") },
			[]string{"inputs: has 65 files", "limit of 64"}},
		{"input size",
			func(r *job.Request) { r.Inputs = map[string]string{"a": strings.Repeat("x", l.MaxInputBytes)} },
			func(r *job.Request) { r.Inputs = map[string]string{"a": strings.Repeat("x", l.MaxInputBytes+1)} },
			[]string{"inputs: are 262145 bytes", "limit of 262144"}},
		{"input name length",
			func(r *job.Request) { r.Inputs = map[string]string{strings.Repeat("a", 255): "x"} },
			func(r *job.Request) { r.Inputs = map[string]string{strings.Repeat("a", 256): "x"} },
			[]string{"inputs: name", "must be a relative path"}},
		{"output files",
			func(r *job.Request) { r.Outputs = many(l.MaxOutputs, name) },
			func(r *job.Request) { r.Outputs = many(l.MaxOutputs+1, name) },
			[]string{"outputs: has 65 files", "limit of 64"}},
		{"output name length",
			func(r *job.Request) { r.Outputs = []string{strings.Repeat("a", 255)} },
			func(r *job.Request) { r.Outputs = []string{strings.Repeat("a", 256)} },
			[]string{"outputs: name", "must be a relative path"}},
		{"label entries",
			func(r *job.Request) { r.Labels = keyed(l.MaxLabels, name, "v") },
			func(r *job.Request) { r.Labels = keyed(l.MaxLabels+1, name, "v") },
			[]string{"labels: has 33 entries", "limit of 32"}},
		{"label key name length",
			func(r *job.Request) { r.Labels = map[string]string{strings.Repeat("k", 63): "v"} },
			func(r *job.Request) { r.Labels = map[string]string{strings.Repeat("k", 64): "v"} },
			[]string{"labels: key", "1 to 63 characters"}},
		{"label key prefix length",
			func(r *job.Request) { r.Labels = map[string]string{strings.Repeat("p", 253) + "/k": "v"} },
			func(r *job.Request) { r.Labels = map[string]string{strings.Repeat("p", 254) + "/k": "v"} },
			[]string{"labels: key", "prefix must be a DNS subdomain"}},
		{"label value length",
			func(r *job.Request) { r.Labels = map[string]string{"k": strings.Repeat("v", 63)} },
			func(r *job.Request) { r.Labels = map[string]string{"k": strings.Repeat("v", 64)} },
			[]string{"labels: value of", "at most 63 characters"}},
		{"attempts",
			func(r *job.Request) { r.Retry = &job.RetryPolicy{MaxAttempts: l.MaxAttempts} },
			func(r *job.Request) { r.Retry = &job.RetryPolicy{MaxAttempts: l.MaxAttempts + 1} },
			[]string{"retry.max_attempts: 101", "between 1 and 100"}},
		{"timeout",
			func(r *job.Request) { r.Timeout = d(l.MaxTimeout) },
			func(r *job.Request) { r.Timeout = d(l.MaxTimeout + time.Second) },
			[]string{"timeout: 168h0m1s", "limit of 168h0m0s"}},
		{"queue timeout",
			func(r *job.Request) { r.QueueTimeout = d(l.MaxTimeout) },
			func(r *job.Request) { r.QueueTimeout = d(l.MaxTimeout + time.Second) },
			[]string{"queue_timeout: 168h0m1s", "limit of 168h0m0s"}},
		{"deadline",
			func(r *job.Request) { r.Deadline = d(l.MaxTimeout) },
			func(r *job.Request) { r.Deadline = d(l.MaxTimeout + time.Second) },
			[]string{"deadline: 168h0m1s", "limit of 168h0m0s"}},
		{"gpus",
			func(r *job.Request) { r.Resources = &job.Resources{GPU: l.MaxGPU} },
			func(r *job.Request) { r.Resources = &job.Resources{GPU: l.MaxGPU + 1} },
			[]string{"resources.gpu: 65", "between 0 and 64"}},
		{"memory",
			func(r *job.Request) { r.Resources = &job.Resources{Memory: "1Pi"} },
			func(r *job.Request) { r.Resources = &job.Resources{Memory: "1025Ti"} },
			[]string{`resources.memory: "1025Ti"`, "over the maximum of 1Pi"}},
		{"run id length",
			func(r *job.Request) { r.RunID = strings.Repeat("r", 256) },
			func(r *job.Request) { r.RunID = strings.Repeat("r", 257) },
			[]string{"run_id: is 257 characters", "limit of 256"}},
		{"node id length",
			func(r *job.Request) { r.NodeID = strings.Repeat("n", 256) },
			func(r *job.Request) { r.NodeID = strings.Repeat("n", 257) },
			[]string{"node_id: is 257 characters", "limit of 256"}},
		{"id length",
			func(r *job.Request) { r.ID = strings.Repeat("i", 128) },
			func(r *job.Request) { r.ID = strings.Repeat("i", 129) },
			[]string{"id: ", "1 to 128 characters"}},
		{"image length",
			func(r *job.Request) { r.Image = strings.Repeat("i", 512) },
			func(r *job.Request) { r.Image = strings.Repeat("i", 513) },
			[]string{"image: ", "is not an image reference"}},
		{"retry exit codes",
			func(r *job.Request) { r.Retry = &job.RetryPolicy{NonRetryableExitCodes: make([]int, 256)} },
			func(r *job.Request) { r.Retry = &job.RetryPolicy{NonRetryableExitCodes: make([]int, 257)} },
			[]string{"retry.non_retryable_exit_codes: has 257 codes", "limit of 256"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			at := &job.Request{Command: []string{"true"}}
			tc.at(at)
			if err := decodeValidate(t, at); err != nil {
				t.Fatalf("a request at the limit is refused: %v", err)
			}
			over := &job.Request{Command: []string{"true"}}
			tc.over(over)
			err := decodeValidate(t, over)
			var ve *job.ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("a request over the limit: %v, want a ValidationError", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", truncate(err.Error()), w)
				}
			}
		})
	}
}

// decodeValidate sends r through the dispatcher's checks: decode the
// document, then validate it, with the default limits.
func decodeValidate(t *testing.T, r *job.Request) error {
	t.Helper()
	data, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	dec, err := job.DecodeRequest(data, job.Limits{})
	if err != nil {
		return err
	}
	return dec.Validate(job.Limits{})
}

func truncate(s string) string {
	if len(s) > 300 {
		return s[:300] + "…"
	}
	return s
}

// TestRequestSizeLimit: the document itself is bounded before it is
// decoded, and the error says how large it is and what the limit is.
func TestRequestSizeLimit(t *testing.T) {
	l := job.Limits{MaxRequestBytes: 1024}
	doc := func(n int) []byte {
		pad := n - len(`{"run_id":""}`)
		return []byte(`{"run_id":"` + strings.Repeat("r", pad) + `"}`)
	}
	if _, err := job.DecodeRequest(doc(1024), l); err != nil {
		t.Fatalf("a request of exactly the limit: %v", err)
	}
	_, err := job.DecodeRequest(doc(1025), l)
	var tl *job.TooLargeError
	if !errors.As(err, &tl) || tl.Size != 1025 || tl.Limit != 1024 ||
		err.Error() != "request is 1025 bytes, over the limit of 1024" {
		t.Fatalf("over the limit: %v", err)
	}
	// The default is 512 KiB.
	_, err = job.DecodeRequest(make([]byte, 512<<10+1), job.Limits{})
	if !errors.As(err, &tl) || tl.Limit != 512<<10 {
		t.Fatalf("default limit: %v", err)
	}
}

// TestReencodedRequestMayOutgrowTheDocumentLimit records why the size of
// a request is checked where it is received, and must not be checked again
// on the job message the dispatcher re-encodes from it: encoding/json
// writes <, >, & and control characters as six bytes each, so a request
// within every field limit may re-encode to more than MaxRequestBytes.
func TestReencodedRequestMayOutgrowTheDocumentLimit(t *testing.T) {
	r := &job.Request{Command: []string{"true"}, Inputs: map[string]string{"page.html": strings.Repeat("<", 200<<10)}}
	data, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	received := []byte(`{"command":["true"],"inputs":{"page.html":"` + strings.Repeat("<", 200<<10) + `"}}`)
	dec, err := job.DecodeRequest(received, job.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if err := dec.Validate(job.Limits{}); err != nil {
		t.Fatal(err)
	}
	if len(data) <= job.DefaultLimits.MaxRequestBytes {
		t.Fatalf("re-encoded to %d bytes; this test expects more than %d", len(data), job.DefaultLimits.MaxRequestBytes)
	}
	if _, err := job.DecodeRequest(data, job.Limits{}); err == nil {
		t.Fatal("the re-encoded request passed the document limit")
	}
}
