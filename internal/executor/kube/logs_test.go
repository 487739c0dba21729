package kube

import (
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/fleet-dev/fleet/internal/executor"
)

// TestLogPlace: a log read with timestamps is read on from where it
// stopped, no line twice and none lost, lines of the same timestamp
// included; a line cut short is read again whole.
func TestLogPlace(t *testing.T) {
	rep := &recorder{}
	a := &attempt{stdout: executor.NewOutput("stdout", rep, 0)}
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 100, time.UTC)
	ts := func(ms int) string { return t0.Add(time.Duration(ms) * time.Millisecond).Format(time.RFC3339Nano) }
	broken := func(s string) io.Reader {
		return io.MultiReader(strings.NewReader(s), iotest.ErrReader(errors.New("stream broke")))
	}
	// The followed stream breaks in the middle of a line.
	if err := a.copyLines(broken(ts(0) + " one\n" + ts(0) + " one again\n" + ts(1) + " two\n" + ts(2) + " thr")); err == nil {
		t.Fatal("a broken stream is no error")
	}
	// Opened again from its second: what was copied comes again.
	if err := a.copyLines(broken(ts(0) + " one\n" + ts(0) + " one again\n" + ts(1) + " two\n" + ts(2) + " three\n" + ts(2) + " three again\n")); err == nil {
		t.Fatal("a broken stream is no error")
	}
	// The rest, once the container has ended; its last line has no newline.
	if err := a.copyLines(strings.NewReader(ts(0) + " one\n" + ts(1) + " two\n" + ts(2) + " three\n" + ts(2) + " three again\n" + ts(2) + " three more\n" + ts(3) + " four")); err != nil {
		t.Fatal(err)
	}
	_ = a.stdout.Close()
	equal(t, "lines", rep.logList(), "stdout:one\nstdout:one again\nstdout:two\nstdout:three\nstdout:three again\nstdout:three more\nstdout:four")
	equal(t, "tail", a.stdout.Tail(), "one\none again\ntwo\nthree\nthree again\nthree more\nfour")
	if a.pos.untimed {
		t.Error("every line had its timestamp")
	}
	b := &attempt{stdout: executor.NewOutput("stdout", nil, 0)}
	_ = b.copyLines(strings.NewReader("fake logs"))
	if !b.pos.untimed || b.stdout.Tail() != "fake logs" {
		t.Errorf("a line without a timestamp: untimed %t, tail %q", b.pos.untimed, b.stdout.Tail())
	}
}
