package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/internal/dispatcher"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/internal/worker"
	"github.com/fleet-dev/fleet/job"
)

// readFeed pulls a feed consumer until it has delivered want messages,
// acknowledging each, and returns their records by subject; it fails the
// test on a message of another tenant, a kind the feed does not keep, a
// subject delivered twice, or more than want.
func readFeed(t *testing.T, js jetstream.JetStream, reply *job.FeedReply, tenant string, want int) map[string]*job.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cons, err := js.Consumer(ctx, reply.Stream, reply.Consumer)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*job.Record{}
	for len(got) < want {
		batch, err := cons.Fetch(want-len(got), jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			kind, k, ok := queue.Names{}.ParseJobLive(m.Subject())
			if !ok || k.Tenant != tenant || (kind != queue.KindResult && kind != queue.KindRejected) {
				t.Fatalf("feed of %s delivered %s", tenant, m.Subject())
			}
			if _, dup := got[m.Subject()]; dup {
				t.Fatalf("feed delivered %s twice", m.Subject())
			}
			rec, err := job.DecodeRecord(m.Data())
			if err != nil || rec.ID != k.ID || rec.Tenant != tenant {
				t.Fatalf("%s: record %+v, %v", m.Subject(), rec, err)
			}
			got[m.Subject()] = rec
			if err := m.DoubleAck(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("the feed delivered %d of %d", len(got), want)
		}
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.NumPending != 0 || info.NumAckPending != 0 {
		t.Fatalf("after %d messages the consumer has %d more and %d unacknowledged", want, info.NumPending, info.NumAckPending)
	}
	return got
}

// rejected reports a refusal of the request as it is.
func rejected(err error) bool {
	var r *client.RejectedError
	return errors.As(err, &r)
}

// A tenant's feed keeps the final version of each of its jobs and each
// rejection, in every pool, and only its own: a consumer made on its
// request after the jobs ended reads every one once, and then what ends
// later, in a pool that had no stream when the feed was made. A consumer
// of one pool reads that pool's. A request the fleet cannot honour is
// refused, naming why.
func TestAFeedKeepsEveryResultOfItsTenant(t *testing.T) {
	f := fleettest.Start(t)
	f.Worker(t, processExec(t), worker.Config{ID: "w-feed", Pool: "feed", Slots: 4})
	acme, beta := tenantClient(t, f, "acme"), tenantClient(t, f, "beta")
	ctx := context.Background()

	ids := submitMany(t, acme, "feed", "acme", 10, 0, "true")
	failing := submitReq(t, acme, &job.Request{ID: "acme-fails", Pool: "feed", Command: []string{"false"}})
	betaIDs := submitMany(t, beta, "feed", "beta", 5, 0, "true")
	// A request refused whole: its rejection is in the feed.
	var sr job.SubmitReply
	m, err := f.NC.Request(queue.Names{}.SubmitV2("acme"), []byte(`{"id": "acme-refused", "pool": "feed", "command": ["true"], "priority": 9}`), 10*time.Second)
	if err != nil || json.Unmarshal(m.Data, &sr) != nil || sr.State != job.StateRejected {
		t.Fatalf("a request at priority 9: %v %s", err, m.Data)
	}
	for _, id := range append(ids, failing) {
		if _, err := acme.Result(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range betaIDs {
		if _, err := beta.Result(ctx, id); err != nil {
			t.Fatal(err)
		}
	}

	js, err := jetstream.New(f.NC)
	if err != nil {
		t.Fatal(err)
	}
	reply, err := acme.FeedConsumer(ctx, "billing", nil)
	if err != nil {
		t.Fatal(err)
	}
	if reply.Stream != "FLEET_FEED_acme" || reply.Consumer != "billing" || reply.Subject != "fleet.t.acme.job.>" {
		t.Fatalf("reply: %+v", reply)
	}
	got := readFeed(t, js, reply, "acme", 12)
	for _, id := range ids {
		if r := got["fleet.t.acme.job.feed.r."+id]; r == nil || r.Result == nil || r.Result.Status != job.StatusSucceeded {
			t.Errorf("%s: %+v", id, r)
		}
	}
	if r := got["fleet.t.acme.job.feed.r.acme-fails"]; r == nil || r.Result == nil || r.Result.Status != job.StatusFailed {
		t.Errorf("acme-fails: %+v", r)
	}
	if r := got["fleet.t.acme.job.feed.x.acme-refused"]; r == nil || r.State != job.StateRejected {
		t.Errorf("acme-refused: %+v", r)
	}

	// Asked again alike, the same answer; otherwise, refused.
	if again, err := acme.FeedConsumer(ctx, "billing", nil); err != nil || *again != *reply {
		t.Errorf("asked again: %+v, %v", again, err)
	}
	if _, err := acme.FeedConsumer(ctx, "billing", &job.FeedRequest{From: "new"}); !rejected(err) {
		t.Errorf("billing again, from new: %v; want refused", err)
	}
	for _, body := range []string{`{"from": "yesterday"}`, `{"start_seq": 3, "from": "new"}`, `{"pool": "a.b"}`, `{"ack_wait": "1ms"}`, `{"colour": "red"}`} {
		var e job.ErrorReply
		m, err := f.NC.Request(queue.Names{}.Request("acme", "feed", "bad"), []byte(body), 10*time.Second)
		if err != nil || json.Unmarshal(m.Data, &e) != nil || !e.Invalid {
			t.Errorf("feed consumer asked with %s: %v %s; want refused as invalid", body, err, m.Data)
		}
	}

	// A pool that had no stream when the feed was made.
	f.Worker(t, processExec(t), worker.Config{ID: "w-feed-2", Pool: "feed-2", Slots: 1})
	later := submitReq(t, acme, &job.Request{ID: "acme-later", Pool: "feed-2", Command: []string{"true"}})
	if _, err := acme.Result(ctx, later); err != nil {
		t.Fatal(err)
	}
	if got := readFeed(t, js, reply, "acme", 1); got["fleet.t.acme.job.feed-2.r.acme-later"] == nil {
		t.Errorf("after the new pool's job: %v", got)
	}
	one, err := acme.FeedConsumer(ctx, "feed-2-only", &job.FeedRequest{Pool: "feed-2"})
	if err != nil {
		t.Fatal(err)
	}
	if got := readFeed(t, js, one, "acme", 1); got["fleet.t.acme.job.feed-2.r.acme-later"] == nil {
		t.Errorf("pool feed-2's consumer: %v", got)
	}

	// Beta's feed holds beta's jobs, none of acme's.
	b, err := beta.FeedConsumer(ctx, "mine", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := readFeed(t, js, b, "beta", len(betaIDs)); len(got) != len(betaIDs) {
		t.Errorf("beta's feed: %d messages", len(got))
	}
}

// With the feeds off (--feeds=false), no feed is made, and a tenant's
// request for a consumer is refused, saying so.
func TestFeedsOff(t *testing.T) {
	f := fleettest.Start(t, func(c *dispatcher.Config) { c.NoFeeds = true })
	f.Worker(t, processExec(t), worker.Config{ID: "w-nofeed", Pool: "nofeed", Slots: 1})
	acme := tenantClient(t, f, "acme")
	ctx := context.Background()
	id := submitReq(t, acme, &job.Request{ID: "nofeed-1", Pool: "nofeed", Command: []string{"true"}})
	if _, err := acme.Result(ctx, id); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(f.NC)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Stream(ctx, "FLEET_FEED_acme"); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("with the feeds off, FLEET_FEED_acme: %v", err)
	}
	if _, err := acme.FeedConsumer(ctx, "c", nil); !rejected(err) {
		t.Errorf("a feed consumer with the feeds off: %v", err)
	}
}
