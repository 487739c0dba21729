package dispatcher

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Runners take each submission on a goroutine that lived before it, when
// one is idle; start no more than max at once; make a caller wait while
// all are busy, or give up when its context ends; and end at close.
func TestRunnersReuseTheirGoroutinesUpToMax(t *testing.T) {
	r := newRunners(2)
	var started atomic.Int32
	var wg sync.WaitGroup
	for range 100 {
		wg.Add(1)
		if !r.run(context.Background(), func() { defer wg.Done(); started.Add(1) }) {
			t.Fatal("run refused with a live context")
		}
	}
	wg.Wait()
	if n := len(r.sema); n < 1 || n > 2 {
		t.Errorf("%d goroutines for 100 submissions one after another; want 1 or 2", n)
	}

	block := make(chan struct{})
	for range 2 - len(r.sema) {
		r.run(context.Background(), func() {}) // fill up to max
	}
	for range 2 {
		r.run(context.Background(), func() { <-block })
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if r.run(ctx, func() { t.Error("a third ran beside two busy runners at max 2") }) {
		t.Error("run took a submission while max were busy, until its context ended")
	}
	close(block)
	done := make(chan struct{})
	go func() { r.close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("close did not end the runners")
	}
	if n := len(r.sema); n != 0 {
		t.Errorf("%d runners left after close", n)
	}
	r.close() // twice: nothing
}
