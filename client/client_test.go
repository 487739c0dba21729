package client

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleet-dev/fleet/internal/natstest"
	"github.com/fleet-dev/fleet/job"
)

// answerSecond answers the status requests of job id, but for the first
// of them, which it drops: as a dispatcher whose NATS server died with
// the request on its way does. It returns how many it heard.
func answerSecond(t *testing.T, nc *nats.Conn, id string) *atomic.Int32 {
	t.Helper()
	var heard atomic.Int32
	reply, err := json.Marshal(&job.StatusReply{
		Job:    &job.Record{ID: id, Pool: "default", State: job.StateSucceeded},
		Result: &job.Result{JobID: id, Pool: "default", Status: job.StatusSucceeded, Attempts: 1},
	})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := nc.Subscribe("fleet.t.default.status."+id, func(m *nats.Msg) {
		if heard.Add(1) == 1 {
			return
		}
		_ = m.Respond(reply)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return &heard
}

// A read whose answer never comes is asked again within its context, not
// waited for until the context ends: Status and Result, given a minute,
// come back with the second answer (before the fix, each waited the whole
// minute for the first and failed).
func TestAReadLostOnTheWayIsAskedAgain(t *testing.T) {
	s := natstest.Run(t)
	fleet, user := s.Connect(t), s.Connect(t)
	c, err := New(user)
	if err != nil {
		t.Fatal(err)
	}
	for _, read := range []struct {
		name string
		do   func(ctx context.Context, id string) (*job.Result, error)
	}{
		{"Status", func(ctx context.Context, id string) (*job.Result, error) {
			st, err := c.Status(ctx, id)
			if err != nil {
				return nil, err
			}
			return st.Result, nil
		}},
		{"Result", c.Result},
	} {
		t.Run(read.name, func(t *testing.T) {
			id := "lost-" + read.name
			heard := answerSecond(t, fleet, id)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			r, err := read.do(ctx, id)
			if err != nil {
				t.Fatalf("%s of a job whose first answer was lost: %v (requests heard: %d)", read.name, err, heard.Load())
			}
			if r == nil || r.JobID != id || r.Status != job.StatusSucceeded {
				t.Fatalf("%s: got %+v", read.name, r)
			}
			if n := heard.Load(); n != 2 {
				t.Errorf("the fleet heard %d requests, want 2 (the lost one, and one more)", n)
			}
			if ctx.Err() != nil {
				t.Errorf("answered only when the context ended")
			}
		})
	}
}

// A cancel is not a read: it is sent once, and an answer that does not
// come is an error when ctx ends, not a second cancel.
func TestACancelIsNotSentTwice(t *testing.T) {
	s := natstest.Run(t)
	fleet, user := s.Connect(t), s.Connect(t)
	c, err := New(user)
	if err != nil {
		t.Fatal(err)
	}
	var heard atomic.Int32
	sub, err := fleet.Subscribe("fleet.t.default.cancel.j", func(*nats.Msg) { heard.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := fleet.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*readTry+time.Second)
	defer cancel()
	if _, err := c.Cancel(ctx, "j"); err == nil {
		t.Fatal("a cancel nobody answered returned no error")
	}
	if n := heard.Load(); n != 1 {
		t.Errorf("the fleet heard %d cancels, want 1", n)
	}
}
