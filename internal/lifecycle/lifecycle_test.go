package lifecycle

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
)

func TestEveryRunsAtOnceThenEveryIntervalUntilStop(t *testing.T) {
	var runs atomic.Int32
	ended := make(chan struct{})
	e := NewEvery(10*time.Millisecond, func(ctx context.Context) {
		if runs.Add(1) == 1 {
			go func() { <-ctx.Done(); close(ended) }()
		}
	})
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-e.Started():
	default:
		t.Fatal("Started is not closed after Start")
	}
	if err := e.Start(context.Background()); !errors.Is(err, ErrStarted) {
		t.Errorf("a second Start: %v, want ErrStarted", err)
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
	if err := e.Stop(context.Background()); err != nil {
		t.Errorf("a second Stop: %v", err)
	}
	var never Every
	if err := never.Stop(context.Background()); err != nil {
		t.Errorf("stopping a loop never started: %v", err)
	}
}

func TestStopGivesUpWhenItsContextEnds(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	started := make(chan struct{})
	e := NewEvery(time.Hour, func(context.Context) { close(started); <-release })
	_ = e.Start(context.Background())
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := e.Stop(ctx); err == nil {
		t.Error("Stop returned while the run went on")
	}
}

func TestStopReturnsTheErrorThatStoppedTheRun(t *testing.T) {
	boom := errors.New("boom")
	var r Runner
	_ = r.Go(context.Background(), func(context.Context) error { return boom })
	<-r.Done()
	if err := r.Err(); !errors.Is(err, boom) {
		t.Errorf("Err: %v", err)
	}
	if err := r.Stop(context.Background()); !errors.Is(err, boom) {
		t.Errorf("Stop: %v, want boom", err)
	}
	if err := r.Stop(context.Background()); !errors.Is(err, boom) {
		t.Errorf("a second Stop: %v, want boom again", err)
	}

	// A run that ends because Stop cancelled it stopped cleanly.
	var quiet Runner
	_ = quiet.Go(context.Background(), func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() })
	if err := quiet.Stop(context.Background()); err != nil {
		t.Errorf("a run ended by Stop: %v", err)
	}
}

func TestGoKeepsTheValuesButNotTheCancellationOfItsContext(t *testing.T) {
	type key struct{}
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))
	var r Runner
	got := make(chan any, 1)
	_ = r.Go(ctx, func(ctx context.Context) error {
		got <- ctx.Value(key{})
		<-ctx.Done()
		if !errors.Is(context.Cause(ctx), ErrStopped) {
			t.Errorf("cause %v, want ErrStopped", context.Cause(ctx))
		}
		return nil
	})
	cancel()
	if v := <-got; v != "v" {
		t.Errorf("value %v", v)
	}
	select {
	case <-r.Done():
		t.Fatal("the run ended with the start's context")
	case <-time.After(20 * time.Millisecond):
	}
	_ = r.Stop(context.Background())
}

func TestGroupStopsInReverseAndJoinsErrors(t *testing.T) {
	var mu sync.Mutex
	var log []string
	svc := func(name string, stopErr error, bad bool) Service {
		return Func{
			StartFunc: func(context.Context) error {
				if bad {
					return errors.New("no")
				}
				mu.Lock()
				log = append(log, "start "+name)
				mu.Unlock()
				return nil
			},
			StopFunc: func(context.Context) error {
				mu.Lock()
				log = append(log, "stop "+name)
				mu.Unlock()
				return stopErr
			},
		}
	}
	var g Group
	ctx := context.Background()
	for _, n := range []string{"a", "b", "c"} {
		var err error
		if n == "b" {
			err = errors.New("b failed")
		}
		if err := g.Start(ctx, n, svc(n, err, false)); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.Start(ctx, "d", svc("d", nil, true)); err == nil || !strings.Contains(err.Error(), "start d") {
		t.Errorf("a failed start: %v", err)
	}
	err := g.Stop(ctx)
	if err == nil || !strings.Contains(err.Error(), "stop b: b failed") {
		t.Errorf("Stop: %v", err)
	}
	want := "start a,start b,start c,stop c,stop b,stop a"
	if got := strings.Join(log, ","); got != want {
		t.Errorf("order %s, want %s", got, want)
	}
	if err := g.Stop(ctx); err != nil {
		t.Errorf("a second Stop: %v", err)
	}
	if got := strings.Join(log, ","); got != want {
		t.Errorf("a second Stop stopped again: %s", got)
	}
}

func TestRetryBacksOffUntilItWorksAndLogsOnce(t *testing.T) {
	var buf strings.Builder
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	tries := 0
	start := time.Now()
	err := Retry(log, "reading", Backoff(context.Background(), time.Millisecond, 4*time.Millisecond), func() error {
		if tries++; tries < 6 {
			return errors.New("not yet")
		}
		return nil
	})
	if err != nil || tries != 6 {
		t.Fatalf("err %v after %d tries", err, tries)
	}
	if d := time.Since(start); d < 5*time.Millisecond {
		t.Errorf("six tries in %s: no backoff between them", d)
	}
	if n := strings.Count(buf.String(), "reading failed"); n != 1 {
		t.Errorf("%d warnings, want one:\n%s", n, buf.String())
	}

	// A permanent error ends it at once; a context that ends stops it.
	perm := errors.New("refused")
	if err := Retry(slog.New(slog.NewTextHandler(io.Discard, nil)), "x", Backoff(context.Background(), time.Millisecond, time.Millisecond),
		func() error { return backoff.Permanent(perm) }); !errors.Is(err, perm) {
		t.Errorf("permanent: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := Retry(slog.New(slog.NewTextHandler(io.Discard, nil)), "x", Backoff(ctx, time.Millisecond, 2*time.Millisecond),
		func() error { return errors.New("never") }); err == nil {
		t.Error("Retry outlived its context")
	}
}

func TestAlarmCallsAgainAfterTheWaitItAsksOrAWake(t *testing.T) {
	var calls []time.Time
	var mu sync.Mutex
	wake := make(chan struct{}, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Alarm(ctx, wake, func(context.Context) time.Duration {
			mu.Lock()
			defer mu.Unlock()
			calls = append(calls, time.Now())
			if len(calls) < 3 {
				return 30 * time.Millisecond
			}
			return time.Hour
		})
	}()
	time.Sleep(100 * time.Millisecond)
	mu.Lock()
	n := len(calls)
	gap := calls[1].Sub(calls[0])
	mu.Unlock()
	if n != 3 || gap < 30*time.Millisecond {
		t.Fatalf("%d calls, the second %s after the first; want 3, 30ms apart", n, gap)
	}
	wake <- struct{}{} // an hour's wait cut short
	time.Sleep(20 * time.Millisecond)
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != 4 {
		t.Errorf("%d calls after a wake, want 4", len(calls))
	}
}
