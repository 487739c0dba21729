// Package loop gives the fleet's background work one shape: Start(ctx)
// starts it and returns, Stop(ctx) stops it and waits for it to end (or
// for ctx to end). No goroutine of a loop outlives its Stop.
package loop

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Every runs a function now and then every interval, in the background.
// The zero value is ready; Start it once.
type Every struct {
	mu   sync.Mutex
	stop context.CancelFunc
	done chan struct{}
}

// Start runs fn at once, then every interval, until Stop. fn gets a context
// that ends when Stop is called; ctx bounds nothing past Start (its values
// are kept).
func (e *Every) Start(ctx context.Context, interval time.Duration, fn func(context.Context)) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.done != nil {
		return fmt.Errorf("loop already started")
	}
	ctx, e.stop = context.WithCancel(context.WithoutCancel(ctx))
	e.done = make(chan struct{})
	go func() {
		defer close(e.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			fn(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return nil
}

// Stop ends the loop and waits for a run under way, until ctx ends. A loop
// never started stops at once.
func (e *Every) Stop(ctx context.Context) error {
	e.mu.Lock()
	stop, done := e.stop, e.done
	e.mu.Unlock()
	if stop == nil {
		return nil
	}
	stop()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("stop: %w", ctx.Err())
	}
}
