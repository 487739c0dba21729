package queue

import (
	"context"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go"
)

// Elections tells the writes and reads waiting for an answer that a
// stream has elected a leader, as the servers announce it: a try sent
// while the stream had none gets no answer, and would otherwise wait for
// its deadline (up to lastTry) after the election. Woken, it is sent again
// at once. A process hears the elections of the streams it uses
// (ListenForElections) and gives its contexts the Elections (WithElections);
// Retry and Jobs' writes watch them.
type Elections struct {
	mu sync.Mutex
	ch chan struct{}
}

// NewElections returns Elections that no one has announced yet.
func NewElections() *Elections { return &Elections{ch: make(chan struct{})} }

// Elected wakes every try waiting now.
func (e *Elections) Elected() {
	e.mu.Lock()
	defer e.mu.Unlock()
	close(e.ch)
	e.ch = make(chan struct{})
}

// next is closed at the next election.
func (e *Elections) next() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.ch
}

// LeaderElected is the servers' advisory that stream elected a leader
// ("*": any stream).
func LeaderElected(stream string) string { return "$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED." + stream }

// ListenForElections subscribes e to the advisories of the streams named
// by subjects (LeaderElected). The subscriptions end with the connection
// or when the returned function is called.
func ListenForElections(nc *nats.Conn, e *Elections, subjects ...string) (func(), error) {
	var subs []*nats.Subscription
	stop := func() {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
	}
	for _, s := range subjects {
		sub, err := nc.Subscribe(s, func(*nats.Msg) { e.Elected() })
		if err != nil {
			stop()
			return nil, fmt.Errorf("listen for elections on %s: %w", s, err)
		}
		subs = append(subs, sub)
	}
	return stop, nil
}

type electionsKey struct{}

// WithElections gives ctx the Elections that wake its waiting tries.
func WithElections(ctx context.Context, e *Elections) context.Context {
	return context.WithValue(ctx, electionsKey{}, e)
}

// electionsOf returns the channel closed at ctx's next election, or nil.
func electionsOf(ctx context.Context) <-chan struct{} {
	if e, ok := ctx.Value(electionsKey{}).(*Elections); ok && e != nil {
		return e.next()
	}
	return nil
}

// untilElected returns ctx ended also at the next election, and whether
// it has Elections at all.
func untilElected(ctx context.Context) (context.Context, context.CancelFunc) {
	next := electionsOf(ctx)
	if next == nil {
		return ctx, func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-next:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}
