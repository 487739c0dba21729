package queue_test

import (
	"context"
	"errors"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/queue"
)

// chanWatcher is a watch whose channel the test fills, and closes or not.
type chanWatcher chan jetstream.KeyValueEntry

func (w chanWatcher) Updates() <-chan jetstream.KeyValueEntry { return w }
func (w chanWatcher) Stop() error                             { return nil }

type entry struct {
	jetstream.KeyValueEntry
	key string
}

func (e entry) Key() string { return e.key }

// Current reads a watch's values up to the nil that ends them and no
// further; a watch that closes first, or a context that ends first, is an
// error, and what is left in the watch stays there.
func TestCurrentReadsUpToTheEndOfTheFirstValues(t *testing.T) {
	read := func(ctx context.Context, w chanWatcher) ([]string, error) {
		var keys []string
		err := queue.Current(ctx, w, func(e jetstream.KeyValueEntry) { keys = append(keys, e.Key()) })
		return keys, err
	}

	w := make(chanWatcher, 4)
	w <- entry{key: "a"}
	w <- entry{key: "b"}
	w <- nil
	w <- entry{key: "c"} // a change: not Current's
	if keys, err := read(context.Background(), w); err != nil || len(keys) != 2 || keys[1] != "b" {
		t.Errorf("read %v, %v; want [a b]", keys, err)
	}
	if len(w) != 1 {
		t.Errorf("%d entries left in the watch, want the change", len(w))
	}

	closed := make(chanWatcher, 1)
	closed <- entry{key: "a"}
	close(closed)
	if _, err := read(context.Background(), closed); !errors.Is(err, queue.ErrWatchEnded) {
		t.Errorf("a watch closed before its nil: %v, want ErrWatchEnded", err)
	}

	stuck := make(chanWatcher) // never closes, as nats.go's may not
	ctx, cancel := context.WithCancelCause(context.Background())
	stop := errors.New("stopped")
	cancel(stop)
	if _, err := read(ctx, stuck); !errors.Is(err, stop) {
		t.Errorf("a watch that never closes, ctx ended: %v, want ctx's cause", err)
	}
}
