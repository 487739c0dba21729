package job_test

import (
	"errors"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/job"
)

func TestParseCPU(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		err  bool
	}{
		{"1", 1000, false}, {"500m", 500, false}, {"0.25", 250, false}, {"2.5", 2500, false},
		{"0.0001", 1, false}, // rounded up
		{"1k", 1_000_000, false},
		{"", 0, true}, {"m", 0, true}, {"-1", 0, true}, {"1.", 0, true}, {"1e3", 0, true}, {"1 ", 0, true},
	} {
		got, err := job.ParseCPU(tc.in)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("ParseCPU(%q) = %d, %v; want %d, err=%v", tc.in, got, err, tc.want, tc.err)
		}
	}
}

func TestParseMemory(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		err  bool
	}{
		{"256Mi", 256 << 20, false}, {"1Gi", 1 << 30, false}, {"1.5Gi", 3 << 29, false},
		{"128M", 128_000_000, false}, {"1024", 1024, false}, {"1k", 1000, false}, {"1Ki", 1024, false},
		{"99999999999Ei", 0, true}, {"256MB", 0, true}, {"Mi", 0, true},
	} {
		got, err := job.ParseMemory(tc.in)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("ParseMemory(%q) = %d, %v; want %d, err=%v", tc.in, got, err, tc.want, tc.err)
		}
	}
	for _, b := range []int64{1 << 20, 3 << 29, 6 << 20, 1000} {
		back, err := job.ParseMemory(job.FormatMemory(b))
		if err != nil || back != b {
			t.Errorf("FormatMemory(%d) = %q does not parse back", b, job.FormatMemory(b))
		}
	}
	if got := job.FormatCPU(1500); got != "1500m" {
		t.Errorf("FormatCPU(1500) = %q", got)
	}
	if got := job.FormatCPU(2000); got != "2" {
		t.Errorf("FormatCPU(2000) = %q", got)
	}
}

func TestNormalizeFillsDefaults(t *testing.T) {
	r := &job.Request{Command: []string{"true"}}
	r.Normalize()
	if r.Pool != "default" || r.PullPolicy != job.PullIfNotPresent || r.Resources.CPU != "1" ||
		r.Resources.Memory != "256Mi" || r.Timeout.Std() != 60*time.Second {
		t.Fatalf("defaults not applied: %+v", r)
	}
	p := r.Retry
	if p.MaxAttempts != 1 || p.InitialBackoff.Std() != time.Second || p.MaxBackoff.Std() != time.Minute ||
		p.Multiplier != 2 || *p.Jitter != 0.2 || len(p.RetryOn) != 3 {
		t.Fatalf("retry defaults not applied: %+v", p)
	}
	// Explicit zero jitter survives.
	zero := 0.0
	r2 := &job.Request{Retry: &job.RetryPolicy{Jitter: &zero}}
	r2.Normalize()
	if *r2.Retry.Jitter != 0 {
		t.Fatal("explicit jitter 0 was replaced by the default")
	}
	// OOM growth gets a cap of four times the memory.
	r3 := &job.Request{Resources: &job.Resources{Memory: "64Mi"}, Retry: &job.RetryPolicy{OOMMemoryMultiplier: 2}}
	r3.Normalize()
	if r3.Retry.MaxMemory != "256Mi" {
		t.Fatalf("max_memory = %q, want 256Mi", r3.Retry.MaxMemory)
	}
}

func TestRetriesHonoursClassesAndExitCodes(t *testing.T) {
	r := &job.Request{Retry: &job.RetryPolicy{NonRetryableExitCodes: []int{2}}}
	r.Normalize()
	one, two := 1, 2
	if !r.Retry.Retries(job.ClassExecution, &one) {
		t.Error("exit 1 should be retried")
	}
	if r.Retry.Retries(job.ClassExecution, &two) {
		t.Error("exit 2 is non-retryable")
	}
	if r.Retry.Retries(job.ClassImage, nil) || r.Retry.Retries(job.ClassCancelled, nil) {
		t.Error("image and cancelled failures are not retried by default")
	}
	if !r.Retry.Retries(job.ClassInfrastructure, nil) {
		t.Error("infrastructure failures are retried by default")
	}
}

func TestValidationNamesEveryProblemAndHidesEnvValues(t *testing.T) {
	r, err := job.DecodeRequest([]byte(`{"timeout":"0s","pool":"a.b","env":{"FLEET_X":"hunter2"}}`), job.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	err = r.Validate(job.Limits{})
	var ve *job.ValidationError
	if !errors.As(err, &ve) || len(ve.Problems) != 3 {
		t.Fatalf("want 3 problems, got %v", err)
	}
	for _, want := range []string{"timeout:", "pool:", "env:"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	if strings.Contains(err.Error(), "hunter2") {
		t.Error("an env value leaked into the error")
	}
}

func TestDecodeRequestErrorsNameTheField(t *testing.T) {
	for in, want := range map[string]string{
		`{"command":"true"}`:               "command",
		`{"comand":["true"]}`:              `unknown field "comand"`,
		`{"timeout":60}`:                   "duration must be a string",
		`{"retry":{"max_backoff":"soon"}}`: `retry.max_backoff: "soon" is not a duration`,
		`{"command":["a"]} {"x":1}`:        "after the JSON document",
		``:                                 "empty document",
		`{"command":[`:                     "unexpected end",
	} {
		_, err := job.DecodeRequest([]byte(in), job.Limits{})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("DecodeRequest(%q) = %v, want an error containing %q", in, err, want)
		}
	}
	_, err := job.DecodeRequest(make([]byte, 100), job.Limits{MaxRequestBytes: 10})
	var tl *job.TooLargeError
	if !errors.As(err, &tl) {
		t.Errorf("oversized request: got %v, want TooLargeError", err)
	}
}

func TestDNSLabel(t *testing.T) {
	for in, want := range map[string]string{
		"Build_42.Attempt-1":           "build-42-attempt-1",
		"--x--":                        "x",
		"":                             "x",
		"ÄÖ":                           "x",
		strings.Repeat("a", 70) + "-b": strings.Repeat("a", 63),
	} {
		if got := job.DNSLabel(in, 63); got != want {
			t.Errorf("DNSLabel(%q) = %q, want %q", in, got, want)
		}
	}
	if got := job.DNSLabel("abc-def", 4); got != "abc" {
		t.Errorf("truncation must not leave a trailing dash: %q", got)
	}
}

func TestNewIDIsValidUniqueAndSortable(t *testing.T) {
	seen := map[string]bool{}
	var ids []string
	for i := 0; i < 2000; i++ {
		id := job.NewID()
		if !job.ValidID(id) || len(id) != 26 {
			t.Fatalf("bad id %q", id)
		}
		if seen[id] {
			t.Fatalf("duplicate id %q", id)
		}
		seen[id] = true
		ids = append(ids, id)
		if i == 1000 {
			time.Sleep(2 * time.Millisecond)
		}
	}
	if !sort.StringsAreSorted([]string{ids[0], ids[1500]}) {
		t.Errorf("ids do not sort by time: %s > %s", ids[0], ids[1500])
	}
}
