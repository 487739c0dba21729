package queue_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleet-dev/fleet/internal/natstest"
	"github.com/fleet-dev/fleet/internal/queue"
)

// A dispatcher that starts again, or queues a pool's first job again,
// leaves the streams and buckets alone when their configuration is as it
// asks: no update reaches the servers (each is a change, on a cluster one
// every server applies). A configuration that changed is applied.
func TestSetupUpdatesOnlyWhatChanged(t *testing.T) {
	s := natstest.Run(t)
	nc := s.Connect(t)
	js := newJS(t, nc)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	var updates atomic.Int32
	sub, err := nc.Subscribe("$JS.API.STREAM.UPDATE.>", func(*nats.Msg) { updates.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	cfg := queue.Config{Retention: time.Hour}
	for i := range 3 {
		if err := queue.Setup(ctx, js, cfg, nil); err != nil {
			t.Fatalf("setup %d: %v", i, err)
		}
		if _, err := queue.EnsurePoolStream(ctx, js, cfg, "gpu", nil); err != nil {
			t.Fatalf("pool stream %d: %v", i, err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := updates.Load(); n != 0 {
		t.Errorf("setting up three times as before sent %d stream updates, want none", n)
	}

	cfg.Retention = 2 * time.Hour
	st, err := queue.EnsurePoolStream(ctx, js, cfg, "gpu", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.CachedInfo().Config.MaxAge; got != 2*time.Hour {
		t.Errorf("the pool's stream keeps jobs for %s after its retention changed to 2h", got)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if updates.Load() == 0 {
		t.Error("a changed retention was applied without an update")
	}
}
