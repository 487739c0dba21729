package producer

import (
	"context"
	"sync"
	"testing"
	"time"
)

func TestSlotsNeverHandOutMoreThanThereAre(t *testing.T) {
	s := newSlots(5)
	ctx := context.Background()
	n, _ := s.acquireAll(ctx, 3)
	if n != 3 {
		t.Fatalf("took %d of 5 with max 3", n)
	}
	n, _ = s.acquireAll(ctx, 10)
	if n != 2 {
		t.Fatalf("took %d of the 2 left", n)
	}
	done := make(chan int)
	go func() { n, _ := s.acquireAll(ctx, 10); done <- n }()
	select {
	case <-done:
		t.Fatal("acquired with no slot free")
	case <-time.After(50 * time.Millisecond):
	}
	s.release(1)
	if n := <-done; n != 1 {
		t.Fatalf("took %d after one release", n)
	}
	// One release wakes every waiter.
	for range 2 {
		go func() { n, _ := s.acquireAll(ctx, 1); done <- n }()
	}
	time.Sleep(20 * time.Millisecond)
	s.release(2)
	for range 2 {
		select {
		case n := <-done:
			if n != 1 {
				t.Fatalf("a waiter took %d after a release of 2, want 1", n)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a release of 2 woke one of two waiters")
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.acquireAll(cctx, 1); err == nil {
		t.Error("acquire with a cancelled context and no free slot succeeded")
	}

	// Many goroutines: never more than the total held at once.
	s = newSlots(4)
	var mu sync.Mutex
	held, peak := 0, 0
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100; i++ {
				n, _ := s.acquireAll(ctx, 2)
				mu.Lock()
				held += n
				peak = max(peak, held)
				mu.Unlock()
				mu.Lock()
				held -= n
				mu.Unlock()
				s.release(n)
			}
		}()
	}
	wg.Wait()
	if peak > 4 {
		t.Errorf("%d slots held at once out of 4", peak)
	}
}

// BenchmarkSlots measures taking a slot and giving it back, with nobody
// waiting: what each job does.
func BenchmarkSlots(b *testing.B) {
	ctx := context.Background()
	b.Run("serial", func(b *testing.B) {
		s := newSlots(256)
		b.ReportAllocs()
		for b.Loop() {
			n, _ := s.acquireAll(ctx, 1)
			s.release(n)
		}
	})
	b.Run("parallel", func(b *testing.B) {
		s := newSlots(256)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				n, _ := s.acquireAll(ctx, 1)
				s.release(n)
			}
		})
	})
}
