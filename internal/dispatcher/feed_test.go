package dispatcher_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/queue"
)

// A pool whose jobs reached its stream without any dispatcher adding it
// to the tenant's feed (the one that queued the tenant's first job there
// died first) is added by the check every dispatcher makes of every feed,
// and its versions copied from the first.
func TestTheFeedsAreReconciled(t *testing.T) {
	f := fleettest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	acme, err := client.New(f.NATS.Connect(t), client.WithTenant("acme"))
	if err != nil {
		t.Fatal(err)
	}
	reply, err := acme.FeedConsumer(ctx, "c", nil)
	if err != nil {
		t.Fatal(err)
	}
	js := f.Dispatcher.JetStream()
	if _, err := queue.EnsurePoolStream(ctx, js, f.Queue, "late", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "fleet.p.late.r.acme.j1", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	f.Dispatcher.ReconcileFeeds(ctx)
	cons, err := js.Consumer(ctx, reply.Stream, reply.Consumer)
	if err != nil {
		t.Fatal(err)
	}
	m, err := cons.Next(jetstream.FetchMaxWait(30 * time.Second))
	if err != nil {
		t.Fatalf("the feed after the check: %v", err)
	}
	if m.Subject() != "fleet.t.acme.job.late.r.j1" {
		t.Fatalf("the feed delivered %s", m.Subject())
	}
}
