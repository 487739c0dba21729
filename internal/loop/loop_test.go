package loop

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

func TestEveryRunsAtOnceThenEveryIntervalUntilStop(t *testing.T) {
	var e Every
	var runs atomic.Int32
	ended := make(chan struct{})
	if err := e.Start(context.Background(), 10*time.Millisecond, func(ctx context.Context) {
		if runs.Add(1) == 1 {
			go func() { <-ctx.Done(); close(ended) }()
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := e.Start(context.Background(), time.Second, func(context.Context) {}); err == nil {
		t.Error("a second Start succeeded")
	}
	time.Sleep(55 * time.Millisecond)
	if err := e.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	n := runs.Load()
	if n < 3 || n > 7 {
		t.Errorf("%d runs in 55ms at 10ms", n)
	}
	select {
	case <-ended:
	case <-time.After(time.Second):
		t.Fatal("the run's context did not end at Stop")
	}
	time.Sleep(30 * time.Millisecond)
	if runs.Load() != n {
		t.Error("ran after Stop")
	}
	var never Every
	if err := never.Stop(context.Background()); err != nil {
		t.Errorf("stopping a loop never started: %v", err)
	}
}

func TestStopGivesUpWhenItsContextEnds(t *testing.T) {
	var e Every
	release := make(chan struct{})
	defer close(release)
	started := make(chan struct{})
	_ = e.Start(context.Background(), time.Hour, func(context.Context) { close(started); <-release })
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := e.Stop(ctx); err == nil {
		t.Error("Stop returned while the run went on")
	}
}
