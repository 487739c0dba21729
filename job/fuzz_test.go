package job_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/fleet-dev/fleet/job"
)

// Fuzz targets for every decoder on a boundary of the fleet. Each asserts
// invariants, not only the absence of panics. `go test` runs the seeds
// (f.Add and testdata/fuzz/<target>); `make fuzz` runs each target with
// -fuzz for longer.

// fixtures returns the documents of schemas/testdata of one kind, valid and
// invalid, as seeds.
func fixtures(f *testing.F, kind string) [][]byte {
	f.Helper()
	paths, err := filepath.Glob(filepath.Join("..", "schemas", "testdata", kind, "*", "*.json"))
	if err != nil || len(paths) == 0 {
		f.Fatalf("no fixtures of %s: %v", kind, err)
	}
	var out [][]byte
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("encode %T: %v", v, err)
	}
	return b
}

// unbounded lifts the document size limit only: a re-encoded document may
// be larger than what was received (encoding/json escapes <, > and &, and
// control characters, as six bytes each), and that size is not what the
// invariants below are about.
var unbounded = job.Limits{MaxRequestBytes: math.MaxInt}

// requestFields are the names a request's validation problems start with.
var requestProblemRE = regexp.MustCompile(`^(id|run_id|node_id|pool|image|command|command\[\d+\]|env|workdir|pull_policy|` +
	`resources\.(cpu|memory|gpu|gpu_model)|persist\.size|placement\.node_selector|timeout|queue_timeout|deadline|retry\.(max_attempts|max_lost|initial_backoff|max_backoff|` +
	`multiplier|jitter|retry_on|non_retryable_exit_codes|oom_memory_multiplier|max_memory)|inputs|input_refs(\[.*\]\.(bucket|key|sha256|size))?|outputs|labels): `)

// checkProblems asserts that a validation error lists problems, each
// starting with the field it concerns.
func checkProblems(t *testing.T, err error) {
	t.Helper()
	var ve *job.ValidationError
	if !errors.As(err, &ve) || len(ve.Problems) == 0 {
		t.Fatalf("validation error %v (%T) lists no problems", err, err)
	}
	for _, p := range ve.Problems {
		if !requestProblemRE.MatchString(p) {
			t.Errorf("problem %q does not start with the field it concerns", p)
		}
	}
}

// checkValidRequest asserts what holds of every request that validates: it
// re-encodes to a document that decodes to the same request and still
// validates; a clone is equal; Normalize keeps it valid and is idempotent;
// and the normalized request, as the dispatcher publishes it to workers,
// decodes and validates again.
func checkValidRequest(t *testing.T, r *job.Request, l job.Limits) {
	t.Helper()
	enc := mustJSON(t, r)
	back, err := job.DecodeRequest(enc, unbounded)
	if err != nil {
		t.Fatalf("re-encoded request does not decode: %v\n%s", err, enc)
	}
	if err := back.Validate(l); err != nil {
		t.Fatalf("re-encoded request does not validate: %v\n%s", err, enc)
	}
	if again := mustJSON(t, back); !bytes.Equal(again, enc) {
		t.Fatalf("decode(encode(r)) differs from r:\n%s\n%s", enc, again)
	}
	if c := mustJSON(t, r.Clone()); !bytes.Equal(c, enc) {
		t.Fatalf("clone differs:\n%s\n%s", enc, c)
	}

	n := r.Clone()
	n.Normalize()
	if err := n.Validate(l); err != nil {
		t.Fatalf("normalized request does not validate: %v\nbefore: %s\nafter:  %s", err, enc, mustJSON(t, n))
	}
	norm := mustJSON(t, n)
	n2 := n.Clone()
	n2.Normalize()
	if twice := mustJSON(t, n2); !bytes.Equal(twice, norm) {
		t.Fatalf("Normalize is not idempotent:\n%s\n%s", norm, twice)
	}
	if !bytes.Equal(mustJSON(t, r), enc) {
		t.Fatal("Normalize of a clone changed the original")
	}
	job2, err := job.DecodeJob(norm) // as the worker decodes it
	if err != nil {
		t.Fatalf("the job message does not decode: %v\n%s", err, norm)
	}
	if err := job2.Validate(l); err != nil {
		t.Fatalf("the job message does not validate: %v\n%s", err, norm)
	}
	if again := mustJSON(t, job2); !bytes.Equal(again, norm) {
		t.Fatalf("the job message decodes to another request:\n%s\n%s", norm, again)
	}
	// The resource accessors the worker uses agree with the parsers.
	if c, err := job.ParseCPU(n.Resources.CPU); err != nil || c != n.Resources.CPUMilli() || c <= 0 {
		t.Fatalf("cpu %q: %d, %v; CPUMilli %d", n.Resources.CPU, c, err, n.Resources.CPUMilli())
	}
	if m, err := job.ParseMemory(n.Resources.Memory); err != nil || m != n.Resources.MemoryBytes() || m <= 0 {
		t.Fatalf("memory %q: %d, %v; MemoryBytes %d", n.Resources.Memory, m, err, n.Resources.MemoryBytes())
	}
}

// FuzzDecodeRequest feeds arbitrary documents to the request decoder, as
// producers do through fleet.submit and the HTTP API.
func FuzzDecodeRequest(f *testing.F) {
	for _, b := range fixtures(f, "request") {
		f.Add(b)
	}
	f.Add([]byte(`{"command":["echo","<&>"],"env":{"A":"\u0001\u2028"}}`))
	f.Add([]byte(`{"resources":{"memory":"1Ei"},"retry":{"oom_memory_multiplier":2}}`))
	f.Add([]byte(`{"retry":{"max_attempts":0,"jitter":0,"multiplier":1,"retry_on":[]}}`))
	f.Add([]byte(`{"env":{},"inputs":{},"outputs":[],"labels":{},"command":[]}`))

	// Small limits, so that the fuzzer reaches every limit with small
	// inputs.
	l := job.Limits{MaxRequestBytes: 4096, MaxInputBytes: 64, MaxInputs: 3, MaxOutputs: 3, MaxEnv: 3, MaxEnvBytes: 64,
		MaxCommandArgs: 4, MaxCommandBytes: 64, MaxLabels: 3, MaxAttempts: 5, MaxTimeout: time.Hour, MaxGPU: 2}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := job.DecodeRequest(data, l)
		if err != nil {
			var tl *job.TooLargeError
			if len(data) > l.MaxRequestBytes && !errors.As(err, &tl) {
				t.Fatalf("oversized request: %v, want a TooLargeError", err)
			}
			if !strings.HasPrefix(err.Error(), "invalid request: ") && !errors.As(err, &tl) {
				t.Fatalf("decode error %q does not say what was invalid", err)
			}
			return
		}
		if !json.Valid(data) {
			t.Fatalf("accepted a document that is not JSON: %q", data)
		}
		if err := r.Validate(l); err != nil {
			checkProblems(t, err)
			return
		}
		checkValidRequest(t, r, l)
	})
}

// FuzzValidateRequest builds requests field by field, so that the fuzzer
// explores values rather than JSON syntax; it checks that every problem
// names its field, that env values never show in errors, and the
// invariants of valid requests.
func FuzzValidateRequest(f *testing.F) {
	f.Add("job-1", "default", "alpine:3", "sh", "KEY", "value", "w", "500m", "256Mi", 0, "30s", "team", "search", "in.txt", "out.txt", 3, 2.0, 0.2)
	f.Add("a..b", "a.b", "a b", "", "FLEET_X", "hunter2-secret", "../x", "-1", "1Ei", 99, "-1s", "/x", "-", "../in", ".hidden", -1, 0.5, 2.0)
	f.Add("", "", "", "\x00", "1BAD", "\x00secret-value", "", "0", "5Mi", 1, "0s", "a/b/c", strings.Repeat("v", 64), "a//b", "a", 101, 101.0, -1.0)
	f.Add("x", "p", "", "true", "K", "s3cr3t-v@lue", "", "1e3", "4294967296Gi", 0, "", "example.com/team", "", "", "", 0, 0.0, 0.0)

	l := job.Limits{MaxRequestBytes: 1 << 20, MaxInputBytes: 64, MaxEnvBytes: 64, MaxCommandBytes: 64, MaxGPU: 8,
		MaxAttempts: 100, MaxTimeout: 24 * time.Hour}
	f.Fuzz(func(t *testing.T, id, pool, image, arg, envKey, envValue, workdir, cpu, memory string, gpu int,
		timeout, labelKey, labelValue, input, output string, attempts int, multiplier, jitter float64) {
		// Requests come as JSON, whose strings are valid UTF-8 once decoded:
		// encoding/json replaces each invalid byte of a Go string by U+FFFD.
		for _, s := range []string{id, pool, image, arg, envKey, envValue, workdir, cpu, memory, timeout, labelKey,
			labelValue, input, output} {
			if !utf8.ValidString(s) {
				return
			}
		}
		r := &job.Request{ID: id, Pool: pool, Image: image, Workdir: workdir,
			Resources: &job.Resources{CPU: cpu, Memory: memory, GPU: gpu},
			Retry:     &job.RetryPolicy{MaxAttempts: attempts, Multiplier: multiplier, Jitter: &jitter},
		}
		if arg != "" {
			r.Command = []string{arg, arg}
		}
		if envKey != "" {
			r.Env = map[string]string{envKey: envValue}
		}
		if d, err := job.ParseDuration(timeout); err == nil {
			dd := job.Duration(d)
			r.Timeout = &dd
		}
		if labelKey != "" {
			r.Labels = map[string]string{labelKey: labelValue}
		}
		if input != "" {
			r.Inputs = map[string]string{input: "content"}
		}
		if output != "" {
			r.Outputs = []string{output}
		}
		err := r.Validate(l)
		// An env value may be a secret: it may change what Validate says
		// only through its length and its NUL bytes, so no error can echo
		// it.
		if envKey != "" {
			masked := []byte(envValue)
			for i, c := range masked {
				if c != 0 {
					masked[i] = 'x'
				}
			}
			m := r.Clone()
			m.Env = map[string]string{envKey: string(masked)}
			if merr := m.Validate(l); fmt.Sprint(merr) != fmt.Sprint(err) {
				t.Fatalf("the value of env %q changes the error:\n%v\n%v", envKey, err, merr)
			}
		}
		if err == nil {
			checkValidRequest(t, r, l)
			return
		}
		checkProblems(t, err)
	})
}

// checkFixpoint asserts that a decoded document re-encodes to JSON that
// decodes again, to a document that encodes to the same bytes.
func checkFixpoint[T any](t *testing.T, v *T, decode func([]byte) (*T, error)) {
	t.Helper()
	enc := mustJSON(t, v)
	back, err := decode(enc)
	if err != nil {
		t.Fatalf("re-encoded document does not decode: %v\n%s", err, enc)
	}
	if again := mustJSON(t, back); !bytes.Equal(again, enc) {
		t.Fatalf("decode(encode(v)) differs from v:\n%s\n%s", enc, again)
	}
}

// FuzzDecodeEvent feeds arbitrary documents to the event decoder, as
// clients read fleet.events.<id>.
func FuzzDecodeEvent(f *testing.F) {
	for _, b := range fixtures(f, "event") {
		f.Add(b)
	}
	f.Add([]byte(`{"job_id":"j","attempt":1,"type":"retry_scheduled","time":"2026-01-02T03:04:05.123456789+05:30","pool":"p",` +
		`"failure":{"class":"timeout","code":"c","message":"m"},"next_attempt_at":"0001-01-01T00:00:00Z","delay":"1h1m"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		e, err := job.DecodeEvent(data)
		if err != nil {
			return
		}
		if !json.Valid(data) {
			t.Fatalf("accepted a document that is not JSON: %q", data)
		}
		if err := e.Validate(); err != nil {
			t.Fatalf("decoded event does not validate: %v", err)
		}
		if e.Attempt < 0 || e.Time.IsZero() || (e.Delay != nil && *e.Delay < 0) {
			t.Fatalf("decoded event breaks the contract: %+v", e)
		}
		checkFixpoint(t, e, job.DecodeEvent)
	})
}

// FuzzDecodeResult feeds arbitrary documents to the result decoder, as
// clients read fleet.results.<id>.
func FuzzDecodeResult(f *testing.F) {
	for _, b := range fixtures(f, "result") {
		f.Add(b)
	}
	f.Add(mustJSONF(f, sampleResult()))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := job.DecodeResult(data)
		if err != nil {
			return
		}
		if !json.Valid(data) {
			t.Fatalf("accepted a document that is not JSON: %q", data)
		}
		if err := r.Validate(); err != nil {
			t.Fatalf("decoded result does not validate: %v", err)
		}
		if (r.Status == job.StatusSucceeded) != (r.Failure == nil) || r.Attempts < 0 {
			t.Fatalf("decoded result breaks the contract: %+v", r)
		}
		if r.Status.EventType() == "" || !r.Status.EventType().Final() {
			t.Fatalf("status %q has no final event", r.Status)
		}
		checkFixpoint(t, r, job.DecodeResult)
	})
}

// FuzzDecodeRecord feeds arbitrary documents to the record decoder, as
// tenants read <prefix>.t.<tenant>.job.<pool>.<kind>.<id>.
func FuzzDecodeRecord(f *testing.F) {
	for _, b := range fixtures(f, "record-v2") {
		f.Add(b)
	}
	for _, r := range sampleRecords() {
		f.Add(mustJSONF(f, r))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := job.DecodeRecord(data)
		if err != nil {
			return
		}
		if !json.Valid(data) {
			t.Fatalf("accepted a document that is not JSON: %q", data)
		}
		if err := r.Validate(); err != nil {
			t.Fatalf("decoded record does not validate: %v", err)
		}
		if r.State.Final() != (r.Result != nil) || (r.Request != nil && r.State != job.StateQueued) ||
			(r.Secrets != "" && r.Request == nil) || !job.ValidTenant(r.Tenant) || !job.ValidID(r.ID) {
			t.Fatalf("decoded record breaks the contract: %+v", r)
		}
		for _, e := range job.EventsOf(r) {
			if err := e.Validate(); err != nil {
				t.Fatalf("an event of a valid record does not validate: %v", err)
			}
		}
		checkFixpoint(t, r, job.DecodeRecord)
	})
}

// FuzzDecodeHeartbeat feeds arbitrary documents to the heartbeat decoder,
// as the dispatcher reads workers' capacity from Redis.
func FuzzDecodeHeartbeat(f *testing.F) {
	for _, b := range fixtures(f, "heartbeat") {
		f.Add(b)
	}
	f.Add(mustJSONF(f, sampleHeartbeat()))
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := job.DecodeHeartbeat(data)
		if err != nil {
			return
		}
		if !json.Valid(data) {
			t.Fatalf("accepted a document that is not JSON: %q", data)
		}
		if err := h.Validate(); err != nil {
			t.Fatalf("decoded heartbeat does not validate: %v", err)
		}
		if h.Slots.Total < 0 || h.Slots.Used < 0 || h.Slots.Available < 0 || h.CPUMilli.Reserved < 0 ||
			h.MemoryBytes.Reserved < 0 || h.GPUs.Total < 0 || h.GPUs.Reserved < 0 || h.Running == nil {
			t.Fatalf("decoded heartbeat breaks the contract: %+v", h)
		}
		for _, r := range h.Running {
			if r.Attempt < 1 || r.CPUMilli < 0 || r.MemoryBytes < 0 || r.GPUs < 0 {
				t.Fatalf("running attempt breaks the contract: %+v", r)
			}
		}
		checkFixpoint(t, h, job.DecodeHeartbeat)
	})
}

func mustJSONF(f *testing.F, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		f.Fatal(err)
	}
	return b
}

// FuzzParseDuration checks the duration parser of every request field.
func FuzzParseDuration(f *testing.F) {
	for _, s := range []string{"30s", "1h30m", "1.5h", "500ms", "1us", "1µs", "0", "0s", "-0s", "-1s", "+1s", "1", "",
		"9223372036854775807ns", "9223372036854775808ns", "2562047h47m16.854775807s", ".5s", "1e3s", "1h-1m"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := job.ParseDuration(s)
		std, stdErr := time.ParseDuration(s)
		if err != nil {
			if d != 0 {
				t.Fatalf("ParseDuration(%q) = %v with an error", s, d)
			}
			if stdErr == nil && std >= 0 && !strings.HasPrefix(s, "+") {
				t.Fatalf("ParseDuration(%q) refused what time.ParseDuration reads as %v: %v", s, std, err)
			}
			return
		}
		if d < 0 {
			t.Fatalf("ParseDuration(%q) = %v, negative", s, d)
		}
		if strings.HasPrefix(s, "+") || stdErr != nil || std != d {
			t.Fatalf("ParseDuration(%q) = %v, time.ParseDuration says %v, %v", s, d, std, stdErr)
		}
		// Its string form, as encoded in documents, reads back the same.
		if back, err := job.ParseDuration(d.String()); err != nil || back != d {
			t.Fatalf("ParseDuration(%q) = %v, whose string %q reads back as %v, %v", s, d, d.String(), back, err)
		}
		var jd job.Duration
		if err := json.Unmarshal(mustJSON(t, job.Duration(d)), &jd); err != nil || jd.Std() != d {
			t.Fatalf("duration %v does not survive JSON: %v, %v", d, jd, err)
		}
	})
}

// quantityRef is an independent reading of a quantity: its exact value
// times unit, rounded up, or false when it is not a quantity or too large
// (over MaxInt64/2, the bound the parsers keep so sums cannot overflow).
func quantityRef(q string, unit int64) (int64, bool) {
	suffixes := []struct {
		s     string
		scale *big.Rat
	}{
		{"Ki", big.NewRat(1<<10, 1)}, {"Mi", big.NewRat(1<<20, 1)}, {"Gi", big.NewRat(1<<30, 1)},
		{"Ti", big.NewRat(1<<40, 1)}, {"Pi", big.NewRat(1<<50, 1)}, {"Ei", big.NewRat(1<<60, 1)},
		{"m", big.NewRat(1, 1000)}, {"k", big.NewRat(1000, 1)}, {"M", big.NewRat(1e6, 1)}, {"G", big.NewRat(1e9, 1)},
		{"T", big.NewRat(1e12, 1)}, {"P", big.NewRat(1e15, 1)}, {"E", big.NewRat(1e18, 1)},
	}
	num, scale := q, big.NewRat(1, 1)
	for _, s := range suffixes {
		if strings.HasSuffix(q, s.s) {
			num, scale = strings.TrimSuffix(q, s.s), s.scale
			break
		}
	}
	whole, frac, hasDot := strings.Cut(num, ".")
	digits := func(s string) bool {
		return s != "" && strings.Trim(s, "0123456789") == ""
	}
	if !digits(whole) || (hasDot && !digits(frac)) {
		return 0, false
	}
	v, ok := new(big.Rat).SetString(num)
	if !ok {
		return 0, false
	}
	v.Mul(v, scale)
	v.Mul(v, big.NewRat(unit, 1))
	ceil := new(big.Int).Quo(v.Num(), v.Denom())
	if new(big.Rat).SetInt(ceil).Cmp(v) < 0 {
		ceil.Add(ceil, big.NewInt(1))
	}
	if !ceil.IsInt64() || ceil.Int64() > math.MaxInt64/2 {
		return 0, false
	}
	return ceil.Int64(), true
}

// FuzzParseQuantity checks the CPU and memory parsers against an
// independent reading, and their round trips through FormatCPU and
// FormatMemory.
func FuzzParseQuantity(f *testing.F) {
	for _, s := range []string{"500m", "1", "2.5", "0.0001", "256Mi", "1Gi", "1.5Gi", "128M", "1k", "1Ki", "0", "0m", "0.0",
		"", "m", "-1", "1.", ".5", "1e3", "1 ", "256MB", "99999999999Ei", "1Ei", "3Ei", "4Ei", "8E",
		"1099511627776", "1099511627777", "4294967295Gi", "4294967296Gi", "4294967297Gi", "4611686018427387903",
		"4611686018427387904", "4611686018427387m", "007", "1.000000000000000000001"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, q string) {
		cpu, cpuErr := job.ParseCPU(q)
		mem, memErr := job.ParseMemory(q)
		for _, c := range []struct {
			name string
			v    int64
			err  error
			unit int64
		}{{"ParseCPU", cpu, cpuErr, 1000}, {"ParseMemory", mem, memErr, 1}} {
			want, ok := quantityRef(q, c.unit)
			switch {
			case c.err == nil && c.v < 0:
				t.Fatalf("%s(%q) = %d, negative", c.name, q, c.v)
			case (c.err == nil) != ok || c.v != want:
				t.Fatalf("%s(%q) = %d, %v; an exact reading gives %d, ok=%v", c.name, q, c.v, c.err, want, ok)
			}
		}
		if cpuErr == nil {
			if back, err := job.ParseCPU(job.FormatCPU(cpu)); err != nil || back != cpu {
				t.Fatalf("ParseCPU(%q) = %d; FormatCPU gives %q, which reads back as %d, %v", q, cpu, job.FormatCPU(cpu), back, err)
			}
		}
		if memErr == nil {
			if back, err := job.ParseMemory(job.FormatMemory(mem)); err != nil || back != mem {
				t.Fatalf("ParseMemory(%q) = %d; FormatMemory gives %q, which reads back as %d, %v", q, mem, job.FormatMemory(mem), back, err)
			}
		}
		if cpuErr == nil && memErr == nil && cpu < mem {
			t.Fatalf("%q is %d millicores but %d bytes", q, cpu, mem)
		}
	})
}

// FuzzFormatQuantity checks that every amount the parsers can return
// formats to a quantity that reads back exactly.
func FuzzFormatQuantity(f *testing.F) {
	for _, n := range []int64{0, 1, 999, 1000, 1500, 1 << 20, 3 << 29, math.MaxInt64 / 2, math.MaxInt64/2 - 1, 1 << 61, 1<<62 - 1} {
		f.Add(n)
	}
	f.Fuzz(func(t *testing.T, n int64) {
		if n < 0 || n > math.MaxInt64/2 {
			return
		}
		if back, err := job.ParseCPU(job.FormatCPU(n)); err != nil || back != n {
			t.Fatalf("FormatCPU(%d) = %q reads back as %d, %v", n, job.FormatCPU(n), back, err)
		}
		if back, err := job.ParseMemory(job.FormatMemory(n)); err != nil || back != n {
			t.Fatalf("FormatMemory(%d) = %q reads back as %d, %v", n, job.FormatMemory(n), back, err)
		}
	})
}

var dnsLabelRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// FuzzDNSLabel checks that DNSLabel always returns a DNS label of at most
// max characters, that Kubernetes accepts it, and that it is idempotent.
func FuzzDNSLabel(f *testing.F) {
	for _, s := range []string{"Build_42.Attempt-1", "--x--", "", "ÄÖ", strings.Repeat("a", 70) + "-b", "abc-def", "\u212a", "İ", "a\x00b"} {
		for _, max := range []int{0, -1, 1, 4, 63, 64, 1000} {
			f.Add(s, max)
		}
	}
	f.Fuzz(func(t *testing.T, s string, max int) {
		out := job.DNSLabel(s, max)
		limit := max
		if limit <= 0 || limit > 63 {
			limit = 63
		}
		if !dnsLabelRE.MatchString(out) || len(out) > limit {
			t.Fatalf("DNSLabel(%q, %d) = %q: not a DNS label of at most %d characters", s, max, out, limit)
		}
		if errs := validation.IsDNS1123Label(out); len(errs) > 0 {
			t.Fatalf("DNSLabel(%q, %d) = %q, which Kubernetes refuses: %v", s, max, out, errs)
		}
		if again := job.DNSLabel(out, max); again != out {
			t.Fatalf("DNSLabel is not idempotent: %q -> %q -> %q", s, out, again)
		}
		// A label is kept as it is, but for runs of dashes, which become one.
		if dnsLabelRE.MatchString(s) && !strings.Contains(s, "--") && len(s) <= limit && out != s {
			t.Fatalf("DNSLabel(%q, %d) = %q changed a valid label", s, max, out)
		}
	})
}

// FuzzValidateLabel checks label keys and values against Kubernetes' own
// validation, since labels go onto Jobs and pods unchanged.
func FuzzValidateLabel(f *testing.F) {
	for _, kv := range [][2]string{{"team", "search"}, {"example.com/team", ""}, {"a/b/c", "x"}, {"/x", "x"},
		{"Example.com/x", "x"}, {strings.Repeat("a", 63), strings.Repeat("b", 63)}, {strings.Repeat("a", 64), "x"},
		{"x", "-x"}, {"a.b-c_d", "A.b-C_9"}, {strings.Repeat("a", 254) + "/x", "y"}, {"k", "v\n"}} {
		f.Add(kv[0], kv[1])
	}
	f.Fuzz(func(t *testing.T, key, value string) {
		err := job.ValidateLabel(key, value)
		k8s := append(validation.IsQualifiedName(key), validation.IsValidLabelValue(value)...)
		if (err == nil) != (len(k8s) == 0) {
			t.Fatalf("ValidateLabel(%q, %q) = %v; Kubernetes says %q", key, value, err, k8s)
		}
	})
}
