package producer

import (
	"context"
	"sync"
)

// slots counts the attempts a worker may run at once. The pull loop asks
// JetStream for exactly as many messages as there are free slots, so the
// worker never holds a message it cannot start.
type slots struct {
	mu    sync.Mutex
	total int
	free  int
	// wake, made by the first waiter, is closed when slots are released
	// and left nil until someone waits again: a release with nobody
	// waiting costs no channel.
	wake chan struct{}
}

func newSlots(n int) *slots {
	return &slots{total: n, free: n}
}

// acquireAll waits until at least one slot is free, then takes every free
// slot, at most max, and returns how many it took.
func (s *slots) acquireAll(ctx context.Context, max int) (int, error) {
	for {
		s.mu.Lock()
		if s.free > 0 {
			n := min(s.free, max)
			s.free -= n
			s.mu.Unlock()
			return n, nil
		}
		if s.wake == nil {
			s.wake = make(chan struct{})
		}
		wake := s.wake
		s.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

func (s *slots) release(n int) {
	if n <= 0 {
		return
	}
	s.mu.Lock()
	s.free += n
	if s.wake != nil {
		close(s.wake)
		s.wake = nil
	}
	s.mu.Unlock()
}

// tryAcquire takes up to max free slots without waiting.
func (s *slots) tryAcquire(max int) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := min(s.free, max)
	s.free -= n
	return n, nil
}

// signal wakes every waiter each time it fires.
type signal struct {
	mu sync.Mutex
	ch chan struct{}
}

// wait returns a channel closed at the next fire.
func (s *signal) wait() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch == nil {
		s.ch = make(chan struct{})
	}
	return s.ch
}

func (s *signal) fire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch != nil {
		close(s.ch)
		s.ch = nil
	}
}
