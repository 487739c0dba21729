package executor

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/job"
)

type lines struct {
	mu  sync.Mutex
	got []string
}

func (l *lines) Log(stream, line string) {
	l.mu.Lock()
	l.got = append(l.got, stream+":"+line)
	l.mu.Unlock()
}
func (l *lines) Phase(string, string) {}

func TestOutputSplitsLinesAndKeepsTheTail(t *testing.T) {
	var l lines
	o := NewOutput("stdout", &l, 10)
	for _, chunk := range []string{"hel", "lo\nwor", "ld\r\n", "\n", "no newline"} {
		if _, err := o.Write([]byte(chunk)); err != nil {
			t.Fatal(err)
		}
	}
	o.Close()
	want := []string{"stdout:hello", "stdout:world", "stdout:", "stdout:no newline"}
	if strings.Join(l.got, "|") != strings.Join(want, "|") {
		t.Errorf("lines %q, want %q", l.got, want)
	}
	if tail := o.Tail(); tail != "no newline" {
		t.Errorf("tail %q", tail)
	}
	// A tail never starts in the middle of a character.
	o = NewOutput("stderr", nil, 4)
	o.Write([]byte("abcé€"))
	if tail := o.Tail(); tail != "€" {
		t.Errorf("tail %q, want the last whole characters", tail)
	}
	// A long line without a newline is cut into bounded log lines.
	l = lines{}
	o = NewOutput("stdout", &l, 0)
	o.Write([]byte(strings.Repeat("x", maxLine*2+10)))
	o.Close()
	if len(l.got) != 3 || len(l.got[0]) != len("stdout:")+maxLine {
		t.Errorf("%d lines of lengths %v", len(l.got), len(l.got[0]))
	}
}

func TestSuperviseStopsOnTimeoutAndCancel(t *testing.T) {
	stop := func(exited chan int) func() (int, string) {
		return func() (int, string) { exited <- 143; return <-exited, "stopped with SIGTERM" }
	}
	// Ends by itself.
	exited := make(chan int, 1)
	exited <- 0
	if end, stopped := Supervise(context.Background(), time.Second, exited, stop(exited)); end != 0 || stopped != nil {
		t.Errorf("ended by itself: %d %v", end, stopped)
	}
	// Timeout.
	exited = make(chan int, 1)
	end, stopped := Supervise(context.Background(), 10*time.Millisecond, exited, stop(exited))
	if end != 143 || stopped == nil || StatusOf(stopped) != job.StatusTimedOut || !strings.Contains(stopped.Message, "stopped with SIGTERM") {
		t.Errorf("timeout: %d %+v", end, stopped)
	}
	// Cancel, with its cause.
	exited = make(chan int, 1)
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(ErrCancelled)
	end, stopped = Supervise(ctx, time.Minute, exited, stop(exited))
	if end != 143 || StatusOf(stopped) != job.StatusCancelled || !strings.Contains(stopped.Message, ErrCancelled.Error()) {
		t.Errorf("cancel: %d %+v", end, stopped)
	}
}
