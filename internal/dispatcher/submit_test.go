package dispatcher_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/job"
)

// TestSubmitOverVersionsThatNameAnotherJob: versions on a job's subjects
// whose bodies name another pool (as a pool's worker could write before
// the job is submitted) are not the job: a submission of that id is
// queued, and a refused one is recorded as rejected, instead of being
// answered as a duplicate or failing until the versions expire.
func TestSubmitOverVersionsThatNameAnotherJob(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, err := jetstream.New(f.NC)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Client.Submit(ctx, &job.Request{Command: []string{"true"}}); err != nil { // the pool's stream
		t.Fatal(err)
	}
	for _, id := range []string{"pre-forged", "pre-forged-refused"} {
		now := time.Now()
		body, _ := json.Marshal(&job.Record{ID: id, Tenant: job.DefaultTenant, Pool: "gpu", State: job.StateRunning,
			WorkerID: "forged", SubmittedAt: now, UpdatedAt: now})
		if _, err := js.Publish(ctx, "fleet.p.default.s.default."+id, body); err != nil {
			t.Fatal(err)
		}
	}

	s, err := f.Client.Submit(ctx, &job.Request{ID: "pre-forged", Command: []string{"true"}})
	if err != nil || s.Duplicate || s.State != job.StateQueued {
		t.Fatalf("submit: %+v, %v", s, err)
	}
	if st, err := f.Client.Status(ctx, "pre-forged"); err != nil || st.Job.State != job.StateQueued || st.Job.Pool != job.DefaultPool {
		t.Fatalf("status: %+v, %v", st, err)
	}

	_, err = f.Client.SubmitJSON(ctx, []byte(`{"id":"pre-forged-refused","timeout":"soon","command":["true"]}`))
	var rej *client.RejectedError
	if !errors.As(err, &rej) {
		t.Fatalf("submit of a bad request: %v", err)
	}
	if st, err := f.Client.Status(ctx, "pre-forged-refused"); err != nil || st.Job.State != job.StateRejected {
		t.Fatalf("status of the refused one: %+v, %v", st, err)
	}
}

// TestACopyOfASubmissionIsAnsweredAsTheFirst: over plain NATS, as any
// client sends it: a submission sent again with the same Fleet-Submission
// token (a copy, its first answer lost) is answered as the first, not as
// a duplicate, and queues nothing; one with another token, or none, is a
// duplicate. A token that is no token is ignored.
func TestACopyOfASubmissionIsAnsweredAsTheFirst(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t)
	nc := f.NATS.Connect(t)
	send := func(token string) *job.SubmitReply {
		t.Helper()
		m := nats.NewMsg("fleet.t.default.submit")
		m.Data = []byte(`{"id":"copied","command":["true"]}`)
		if token != "" {
			m.Header.Set("Fleet-Submission", token)
		}
		a, err := nc.RequestMsg(m, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var r job.SubmitReply
		if err := json.Unmarshal(a.Data, &r); err != nil || r.Rejected() {
			t.Fatalf("answer %s: %v", a.Data, err)
		}
		return &r
	}
	if r := send("tok-1"); r.Duplicate || r.State != job.StateQueued {
		t.Fatalf("first: %+v", r)
	}
	if r := send("tok-1"); r.Duplicate || r.State == "" {
		t.Fatalf("its copy: %+v, want it answered as the first", r)
	}
	for _, token := range []string{"tok-2", "", "not a token!"} {
		if r := send(token); !r.Duplicate {
			t.Fatalf("another submission (token %q): %+v, want a duplicate", token, r)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h, err := f.Client.History(ctx, "copied")
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Records) != 1 {
		t.Fatalf("the job has %d versions, want the one that queued it", len(h.Records))
	}
}
