package queue_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/natstest"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// publishNotices stores n log events of job k in the events stream.
func publishNotices(t *testing.T, ctx context.Context, js jetstream.JetStream, k queue.JobKey, n int) {
	t.Helper()
	names := queue.Names{}
	for i := range n {
		e := job.Event{JobID: k.ID, Tenant: k.Tenant, Attempt: 1, Type: job.EventLog, Time: time.Now(),
			Pool: k.Pool, Stream: "stdout", Line: fmt.Sprint("line ", i)}
		data, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.PublishAsync(names.JobNotices(k.Tenant, k.Pool, k.ID), data); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal("the notices were not all stored")
	}
}

// A read whose fetches nobody answers is not taken for whole. The reader's
// user may create consumers but not pull from them, so that every fetch
// goes unanswered: the read fails when its context ends, where it once
// returned no notices and no error, as if the job had none.
func TestAReadWhoseFetchesGoUnansweredIsNotWhole(t *testing.T) {
	srv := natstest.Run(t,
		natstest.WithUser("admin", "admin", nil),
		natstest.WithUser("reader", "reader", &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{"$JS.API.>"}, Deny: []string{"$JS.API.CONSUMER.MSG.NEXT.>"}},
			Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
		}))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := newJS(t, srv.ConnectAs(t, "admin", "admin"))
	if err := queue.Setup(ctx, admin, queue.Config{}, nil); err != nil {
		t.Fatal(err)
	}
	k := queue.JobKey{Tenant: "default", Pool: "p", ID: "j1"}
	publishNotices(t, ctx, admin, k, 5)
	if got, err := queue.Notices(ctx, admin, queue.Names{}, k); err != nil || len(got) != 5 {
		t.Fatalf("a user who may pull reads %d notices of 5 (%v)", len(got), err)
	}

	rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
	defer rcancel()
	got, err := queue.Notices(rctx, newJS(t, srv.ConnectAs(t, "reader", "reader")), queue.Names{}, k)
	if err == nil {
		t.Fatalf("a read whose fetches went unanswered returned %d notices of 5 and no error", len(got))
	}
	if len(got) != 0 {
		t.Errorf("a read that failed handed over %d notices", len(got))
	}
}

// A read goes on through a frozen server: on a three-node cluster, the
// leader of the events stream is stopped (SIGSTOP: its sockets stay open
// and nothing answers), and each of six reads of a job's 300 notices,
// given 20 s, returns all of them. A read's consumer placed on the frozen
// server, or waiting for a new leader, is made again elsewhere; before,
// a read placed there failed after its whole 20 s.
func TestAReadGoesOnThroughAFrozenServer(t *testing.T) {
	c := natstest.RunCluster(t, 3)
	c.WaitReady(t, 30*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	nc := c.Connect(t)
	js := newJS(t, nc)
	if err := queue.Setup(ctx, js, queue.Config{Replicas: 3}, nil); err != nil {
		t.Fatal(err)
	}
	k := queue.JobKey{Tenant: "default", Pool: "p", ID: "j1"}
	publishNotices(t, ctx, js, k, 300)

	frozen := c.WaitStreamLeader(t, queue.Names{}.EventsStream(), 30*time.Second)
	reader := newJS(t, c.ConnectTo(t, (frozen+1)%c.Size()))
	c.Freeze(frozen)
	defer c.Thaw(frozen)
	for i := range 6 {
		rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
		t0 := time.Now()
		got, err := queue.Notices(rctx, reader, queue.Names{}, k)
		rcancel()
		if err != nil || len(got) != 300 {
			t.Fatalf("read %d with %s frozen: %d notices of 300 after %s (%v)", i, c.Name(frozen), len(got), time.Since(t0).Round(time.Millisecond), err)
		}
		t.Logf("read %d: whole in %s", i, time.Since(t0).Round(time.Millisecond))
	}
}
