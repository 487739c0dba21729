// Package lifecycle gives every long-running part of the fleet one shape,
// after River's startstop: Start(ctx) starts it and returns without
// blocking, Started is closed once it runs, and Stop stops it, waits for it
// to end and returns the error that stopped it. Stop may be called any
// number of times, and before Start.
//
// A Runner carries that state for one background goroutine; Every is a
// Service that runs a function now and then every interval; Group starts
// services in order and stops them in reverse. Tick is the one periodic
// loop of the fleet, Alarm the loop of work due at times of its own, and
// Backoff the one way it waits between tries.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Service is a long-running part of a process.
type Service interface {
	// Start starts the service and returns once it runs; ctx bounds the
	// start only (its values are kept).
	Start(ctx context.Context) error
	// Stop stops the service and waits, until ctx ends, for it to end. It
	// returns the error that stopped the service, if one did.
	Stop(ctx context.Context) error
}

// ErrStopped is the cause of a run's context when Stop ended it.
var ErrStopped = errors.New("stopped")

// ErrStarted is returned by a second Start.
var ErrStarted = errors.New("already started")

// Runner is the state of one background goroutine: started once, stopped
// once, and the error it ended with. The zero value is ready.
type Runner struct {
	mu      sync.Mutex
	started chan struct{}
	done    chan struct{}
	cancel  context.CancelCauseFunc
	err     error
}

func (r *Runner) init() {
	if r.started == nil {
		r.started = make(chan struct{})
		r.done = make(chan struct{})
	}
}

// Go runs run in a goroutine with a context that Stop cancels (with cause
// ErrStopped), and returns at once. ctx's values are kept, its
// cancellation is not. run's error, other than one caused by Stop, is what
// Stop returns.
func (r *Runner) Go(ctx context.Context, run func(context.Context) error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.init()
	if r.cancel != nil {
		return ErrStarted
	}
	ctx, r.cancel = context.WithCancelCause(context.WithoutCancel(ctx))
	close(r.started)
	go func() {
		defer close(r.done)
		err := run(ctx)
		if errors.Is(context.Cause(ctx), ErrStopped) && (errors.Is(err, context.Canceled) || errors.Is(err, ErrStopped)) {
			err = nil
		}
		r.mu.Lock()
		r.err = err
		r.mu.Unlock()
	}()
	return nil
}

// Started is closed once Go has started the goroutine.
func (r *Runner) Started() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.init()
	return r.started
}

// Done is closed once the goroutine has ended.
func (r *Runner) Done() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.init()
	return r.done
}

// Stop cancels the goroutine's context and waits, until ctx ends, for it to
// return; it returns the goroutine's error. A Runner never started stops at
// once.
func (r *Runner) Stop(ctx context.Context) error {
	r.mu.Lock()
	cancel, done := r.cancel, r.done
	r.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel(ErrStopped)
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("stop: %w", ctx.Err())
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// Err is the error the goroutine ended with; nil while it runs.
func (r *Runner) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// Every is a Service that runs Fn at once, then every Interval, until
// Stop. With Later set, the first run comes after one Interval.
type Every struct {
	Runner
	Interval time.Duration
	Fn       func(context.Context)
	Later    bool
}

// NewEvery returns an Every; Start starts it.
func NewEvery(interval time.Duration, fn func(context.Context)) *Every {
	return &Every{Interval: interval, Fn: fn}
}

// Start runs Fn at once, then every Interval, in the background.
func (e *Every) Start(ctx context.Context) error {
	return e.Go(ctx, func(ctx context.Context) error {
		if !e.Later {
			e.Fn(ctx)
		}
		Tick(ctx, e.Interval, e.Fn)
		return nil
	})
}

// Tick calls fn every interval until ctx ends; the first call comes after
// one interval. A call that takes longer than the interval delays the
// next; calls never overlap.
func Tick(ctx context.Context, interval time.Duration, fn func(context.Context)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn(ctx)
		}
	}
}

// TickOrWake calls onTick every interval and onWake whenever wake
// receives, one call at a time, until ctx ends.
func TickOrWake(ctx context.Context, interval time.Duration, wake <-chan struct{}, onWake, onTick func(context.Context)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-wake:
			onWake(ctx)
		case <-t.C:
			onTick(ctx)
		}
	}
}

// Alarm calls fn at once, then again each time the wait fn returned has
// passed or wake receives, one call at a time, until ctx ends: the loop of
// work that falls due at times only the work knows, such as a scheduler's
// next firing.
func Alarm(ctx context.Context, wake <-chan struct{}, fn func(context.Context) time.Duration) {
	t := time.NewTimer(fn(ctx))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-wake:
		case <-t.C:
		}
		t.Reset(fn(ctx))
	}
}

// Func adapts a pair of functions to a Service.
type Func struct {
	StartFunc func(context.Context) error
	StopFunc  func(context.Context) error
}

// Start calls StartFunc, if set.
func (f Func) Start(ctx context.Context) error {
	if f.StartFunc == nil {
		return nil
	}
	return f.StartFunc(ctx)
}

// Stop calls StopFunc, if set.
func (f Func) Stop(ctx context.Context) error {
	if f.StopFunc == nil {
		return nil
	}
	return f.StopFunc(ctx)
}

// StopWithin bounds svc's Stop to d: its context ends after d, or when the
// context Stop is given ends, whichever comes first.
func StopWithin(svc Service, d time.Duration) Service {
	return Func{StartFunc: svc.Start, StopFunc: func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		return svc.Stop(ctx)
	}}
}

// Closer is a Service whose Stop closes something, such as a connection,
// in its turn.
func Closer(close func() error) Service {
	return Func{StopFunc: func(context.Context) error { return close() }}
}

// Group starts services in the order they were added and stops them in
// reverse: what depends on another starts after it and stops before it.
type Group struct {
	mu    sync.Mutex
	names []string
	svcs  []Service
}

// Start starts svc now and adds it to the group; name tells it apart in
// errors. A service that fails to start is not added.
func (g *Group) Start(ctx context.Context, name string, svc Service) error {
	if err := svc.Start(ctx); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.names = append(g.names, name)
	g.svcs = append(g.svcs, svc)
	return nil
}

// Stop stops every service of the group, the last started first, each
// within ctx, and returns their errors joined. It is idempotent.
func (g *Group) Stop(ctx context.Context) error {
	g.mu.Lock()
	names, svcs := g.names, g.svcs
	g.names, g.svcs = nil, nil
	g.mu.Unlock()
	var errs []error
	for i := len(svcs) - 1; i >= 0; i-- {
		if err := svcs[i].Stop(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stop %s: %w", names[i], err))
		}
	}
	return errors.Join(errs...)
}
