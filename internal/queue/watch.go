package queue

import (
	"context"
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
