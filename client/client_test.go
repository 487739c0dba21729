package client

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleet-dev/fleet/internal/natstest"
	"github.com/fleet-dev/fleet/job"
)

// fleetAndClient starts a NATS server and returns a connection to answer
// on as the fleet would, and a client on a connection of its own.
func fleetAndClient(t *testing.T) (*nats.Conn, *Client) {
	t.Helper()
	s := natstest.Run(t)
	fleet := s.Connect(t)
	c, err := New(s.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	return fleet, c
}

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
	fleet, c := fleetAndClient(t)
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
	fleet, c := fleetAndClient(t)
	var heard atomic.Int32
	sub, err := fleet.Subscribe("fleet.t.default.cancel.j", func(*nats.Msg) { heard.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := fleet.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*tryWait+time.Second)
	defer cancel()
	if _, err := c.Cancel(ctx, "j"); err == nil {
		t.Fatal("a cancel nobody answered returned no error")
	}
	if n := heard.Load(); n != 1 {
		t.Errorf("the fleet heard %d cancels, want 1", n)
	}
}

// A pool's pause or resume that the fleet cannot carry out for a while
// (its bucket electing a leader: an answer that says try again) is sent
// again until it is carried out; one refused for good is not.
func TestAPoolRequestRefusedForAWhileIsSentAgain(t *testing.T) {
	fleet, c := fleetAndClient(t)
	var heard atomic.Int32
	sub, err := fleet.Subscribe("fleet.pools.held.resume", func(m *nats.Msg) {
		if heard.Add(1) <= 2 {
			_ = m.Respond([]byte(`{"error":"the fleet cannot answer now; try again","retry":true}`))
			return
		}
		_ = m.Respond([]byte(`{"pool":"held","paused":false}`))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	bad, err := fleet.Subscribe("fleet.pools.bad.resume", func(m *nats.Msg) {
		heard.Add(100)
		_ = m.Respond([]byte(`{"error":"no such pool"}`))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = bad.Unsubscribe() }()
	if err := fleet.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := c.ResumePool(ctx, "held")
	if err != nil || st.Pool != "held" || st.Paused {
		t.Fatalf("resume: %+v, %v (requests heard: %d)", st, err, heard.Load())
	}
	if n := heard.Load(); n != 3 {
		t.Errorf("heard %d requests, want 3 (two told to try again)", n)
	}
	if _, err := c.ResumePool(ctx, "bad"); err == nil {
		t.Error("a resume refused for good returned no error")
	}
	if n := heard.Load(); n != 103 {
		t.Errorf("a resume refused for good was sent %d times, want once", (n-3)/100)
	}
}

// A read the fleet cannot answer for a while (an answer that says try
// again: the pool's stream electing a leader, a history that did not come
// back whole) is asked again until it is answered, within its context.
// Before, History returned the first answer's error.
func TestAReadTheFleetCannotAnswerForAWhileIsAskedAgain(t *testing.T) {
	fleet, c := fleetAndClient(t)
	var heard atomic.Int32
	sub, err := fleet.Subscribe("fleet.t.default.history.h", func(m *nats.Msg) {
		if heard.Add(1) <= 2 {
			_ = m.Respond([]byte(`{"error":"the fleet cannot answer now: history failed; try again","retry":true}`))
			return
		}
		_ = m.Respond([]byte(`{"records":[{"id":"h","pool":"default","state":"queued"}],"seqs":[7]}`))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := fleet.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := c.History(ctx, "h")
	if err != nil || len(h.Records) != 1 || h.Records[0].ID != "h" || len(h.Seqs) != 1 || h.Seqs[0] != 7 {
		t.Fatalf("history: %+v, %v (requests heard: %d)", h, err, heard.Load())
	}
	if n := heard.Load(); n != 3 {
		t.Errorf("heard %d requests, want 3 (two told to try again)", n)
	}
}

// A run's end missed live (the client reconnecting, a server lost) does
// not leave a watch waiting: it asks how the run stands now and then, and
// ends with the summary of the round it finds ended. Here the fleet never
// publishes the end: the status says running, then succeeded. Before,
// RunResult waited until its context ended.
func TestARunsEndMissedLiveEndsTheWatchAnyway(t *testing.T) {
	fleet, c := fleetAndClient(t)
	var asked atomic.Int32
	view := func(state job.RunState) []byte {
		v := job.RunView{RunID: "r", Tenant: "default", State: state, Round: 1, SubmittedAt: time.Now(),
			Nodes: []job.NodeView{{ID: "a", Pool: "default", JobID: "r:a", State: job.State(state)}}}
		data, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	sub, err := fleet.Subscribe("fleet.t.default.runs.status.r", func(m *nats.Msg) {
		if asked.Add(1) <= 2 {
			_ = m.Respond(view(job.RunRunning))
			return
		}
		_ = m.Respond(view(job.RunSucceeded))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := fleet.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	end, err := c.RunResult(ctx, "r")
	if err != nil || end.State != job.RunSucceeded || end.Round != 1 || len(end.Nodes) != 1 || end.Nodes[0].JobID != "r:a" {
		t.Fatalf("RunResult: %+v, %v (status asked %d times)", end, err, asked.Load())
	}
}

// A run's document without an id is given one before it is sent, so that
// the copy sent again, its answer lost, is the same run: before, each
// copy was given its own id by the fleet, and the run ran twice.
func TestARunSentAgainIsTheSameRun(t *testing.T) {
	fleet, c := fleetAndClient(t)
	var ids []string
	var mu sync.Mutex
	sub, err := fleet.Subscribe("fleet.t.default.runs.submit", func(m *nats.Msg) {
		var r job.RunRequest
		_ = json.Unmarshal(m.Data, &r)
		mu.Lock()
		ids = append(ids, r.ID)
		n := len(ids)
		mu.Unlock()
		if n == 1 {
			return // the answer lost
		}
		_ = m.Respond([]byte(`{"run_id":"` + r.ID + `","tenant":"default","state":"running","nodes":1}`))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := fleet.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	reply, err := c.SubmitRunJSON(ctx, []byte(`{"nodes":[{"id":"a","job":{"command":["true"]}}]}`))
	mu.Lock()
	defer mu.Unlock()
	if err != nil || len(ids) != 2 || ids[0] == "" || ids[0] != ids[1] || reply.RunID != ids[0] {
		t.Fatalf("reply %+v, %v; ids sent %q: want one id, the same twice", reply, err, ids)
	}
}

// A job's end missed live (the client reconnecting, a server lost as the
// pool's stream republished it) does not leave its events waiting: the
// watch asks the job's status now and then, and once it says the job
// ended, reads the history for what it missed. Here the fleet never
// publishes anything live: the history holds the queued and running
// versions, then, once the status says succeeded, the final one too.
// Before, Events waited until its context ended.
func TestAJobsEndMissedLiveEndsItsEventsAnyway(t *testing.T) {
	fleet, c := fleetAndClient(t)
	now := time.Now().UTC()
	events := map[job.State]job.EventType{job.StateQueued: job.EventQueued, job.StateRunning: job.EventStarted, job.StateSucceeded: job.EventSucceeded}
	rec := func(state job.State, at time.Duration) *job.Record {
		r := &job.Record{ID: "j", Tenant: "default", Pool: "default", State: state, Event: events[state], Attempt: 1, UpdatedAt: now.Add(at)}
		if state == job.StateSucceeded {
			r.Result = &job.Result{JobID: "j", Pool: "default", Status: job.StatusSucceeded, Attempts: 1}
		}
		return r
	}
	var ended atomic.Bool
	answer := func(subject string, reply func() any) {
		sub, err := fleet.Subscribe(subject, func(m *nats.Msg) {
			data, err := json.Marshal(reply())
			if err != nil {
				t.Error(err)
				return
			}
			_ = m.Respond(data)
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	var asked atomic.Int32
	answer("fleet.t.default.status.j", func() any {
		if asked.Add(1) >= 3 {
			ended.Store(true)
			return job.StatusOf(rec(job.StateSucceeded, 2*time.Millisecond))
		}
		return job.StatusOf(rec(job.StateRunning, time.Millisecond))
	})
	answer("fleet.t.default.history.j", func() any {
		h := &job.HistoryReply{Records: []*job.Record{rec(job.StateQueued, 0), rec(job.StateRunning, time.Millisecond)}, Seqs: []uint64{1, 2}}
		if ended.Load() {
			h.Records, h.Seqs = append(h.Records, rec(job.StateSucceeded, 2*time.Millisecond)), append(h.Seqs, 3)
		}
		return h
	})
	if err := fleet.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var types []job.EventType
	for ev, err := range c.Events(ctx, "j") {
		if err != nil {
			t.Fatalf("after %v: %v (status asked %d times)", types, err, asked.Load())
		}
		types = append(types, ev.Type)
	}
	if len(types) != 3 || types[0] != job.EventQueued || types[1] != job.EventStarted || types[2] != job.EventSucceeded {
		t.Fatalf("events %v; want queued, started, succeeded", types)
	}
}
