package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// What go test -json printed for two packages (testdata/events.json): one
// that does not build, one with a test that passes and logs, one that
// fails in a subtest, one that skips. The plain output shows the build
// failure, the failed tests with what they logged, each package's result,
// and nothing of the tests that passed or skipped.
func TestReportShowsWhatAPlainGoTestShows(t *testing.T) {
	in, err := os.Open("testdata/events.json")
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	var out bytes.Buffer
	r := newReport(&out)
	failed, err := r.read(in)
	if err != nil || !failed {
		t.Fatalf("failed %v, err %v; want a failure", failed, err)
	}
	want := "# tl/b [tl/b.test]\nb/b_test.go:3:30: undefined: fmt\nFAIL\ttl/b [build failed]\n" +
		"--- FAIL: TestBad (0.00s)\n    a_test.go:4: shown\n--- FAIL: TestBad/sub (0.00s)\n    a_test.go:4: sub broke\n" +
		"FAIL\nFAIL\ttl/a\t0.026s\n"
	if out.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", out.String(), want)
	}
	times := filepath.Join(t.TempDir(), "times")
	if err := r.appendTimes(times); err != nil {
		t.Fatal(err)
	}
	var slow bytes.Buffer
	if err := printSlowest(&slow, times, 1); err != nil {
		t.Fatal(err)
	}
	if got := slow.String(); !strings.HasPrefix(got, "the 1 slowest of 3 tests:\n") || !strings.Contains(got, "TestOK  tl/a") {
		t.Errorf("slowest: %q", got)
	}
}

// A stream that ends before its package's result (go test killed, or a
// test binary that never ended) is a failure, and what its tests printed
// is shown.
func TestReportOfAStreamCutShort(t *testing.T) {
	in := `{"Action":"start","Package":"p"}
{"Action":"run","Package":"p","Test":"TestHang"}
{"Action":"output","Package":"p","Test":"TestHang","Output":"    hang_test.go:9: waiting\n"}
`
	var out bytes.Buffer
	failed, err := newReport(&out).read(strings.NewReader(in))
	if err != nil || !failed {
		t.Fatalf("failed %v, err %v; want a failure", failed, err)
	}
	if got := out.String(); got != "FAIL\tp\t(no result: go test ended first)\n    hang_test.go:9: waiting\n" {
		t.Errorf("got %q", got)
	}
}
