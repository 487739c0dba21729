package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/dispatcher"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/worker"
	"github.com/fleet-dev/fleet/job"
)

// TestV1ProducersAndConsumersKeepWorking: with the dispatcher's --v1 (one
// release), a v1 producer submits on fleet.submit and fleet.submit.direct
// and cancels on fleet.cancel.<id>, and a v1 consumer reads
// fleet.events.<id>, fleet.results.<id> and the fleet-jobs bucket, as
// before: the bridge writes them from the v2 records, for the default
// tenant.
func TestV1ProducersAndConsumersKeepWorking(t *testing.T) {
	f := fleettest.Start(t, func(c *dispatcher.Config) { c.Queue.V1 = true })
	f.Worker(t, processExec(t), worker.Config{Slots: 4})
	nc := f.NATS.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// A v1 consumer listens before anything is submitted.
	results := make(chan *nats.Msg, 16)
	if _, err := nc.ChanSubscribe("fleet.results.>", results); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	// v1 producers: a request on fleet.submit (stored, answered by the
	// dispatcher that took it) and one on fleet.submit.direct.
	for subject, id := range map[string]string{"fleet.submit": "v1-stored", "fleet.submit.direct": "v1-direct"} {
		body, _ := json.Marshal(greeting(id))
		m, err := nc.RequestWithContext(ctx, subject, body)
		if err != nil {
			t.Fatalf("%s: %v", subject, err)
		}
		var a job.SubmitReply
		if err := json.Unmarshal(m.Data, &a); err != nil || a.JobID != id || a.Rejected() {
			t.Fatalf("%s: answer %s (%v)", subject, m.Data, err)
		}
	}

	// Each result once on fleet.results.<id>, as v1 said.
	heard := map[string]*job.Result{}
	for len(heard) < 2 {
		select {
		case m := <-results:
			r, err := job.DecodeResult(m.Data)
			if err != nil {
				t.Fatalf("a v1 result that does not decode as one: %v\n%s", err, m.Data)
			}
			if heard[r.JobID] != nil {
				t.Fatalf("the result of %s heard twice", r.JobID)
			}
			heard[r.JobID] = r
		case <-ctx.Done():
			t.Fatalf("v1 results heard: %v", heard)
		}
	}
	for _, id := range []string{"v1-stored", "v1-direct"} {
		checkGreeting(t, heard[id], id)
	}

	// The v1 results stream keeps it; the jobs bucket has its final record;
	// the events stream holds its lifecycle, ending with the final event.
	js, _ := jetstream.New(nc)
	st, err := js.Stream(ctx, "FLEET_RESULTS")
	if err != nil {
		t.Fatal(err)
	}
	if info, err := st.Info(ctx, jetstream.WithSubjectFilter("fleet.results.v1-direct")); err != nil || info.State.Subjects["fleet.results.v1-direct"] != 1 {
		t.Errorf("FLEET_RESULTS holds %v results of v1-direct (%v)", info.State.Subjects, err)
	}
	kv, err := js.KeyValue(ctx, "fleet-jobs")
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		e, err := kv.Get(ctx, "v1-direct")
		var rec job.Record
		if err == nil && json.Unmarshal(e.Value(), &rec) == nil && rec.State == job.StateSucceeded {
			if rec.Tenant != "" || rec.Request != nil || rec.Result != nil {
				t.Errorf("the v1 record carries v2 fields: %+v", rec)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the v1 record of v1-direct: %v, %+v", err, rec)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var types []string
	cons, err := js.OrderedConsumer(ctx, "FLEET_EVENTS", jetstream.OrderedConsumerConfig{FilterSubjects: []string{"fleet.events.v1-direct"}})
	if err != nil {
		t.Fatal(err)
	}
	for {
		m, err := cons.Next(jetstream.FetchMaxWait(2 * time.Second))
		if err != nil {
			break
		}
		e, err := job.DecodeEvent(m.Data())
		if err != nil {
			t.Fatalf("a v1 event that does not decode: %v", err)
		}
		types = append(types, string(e.Type))
		if e.Type.Final() {
			break
		}
	}
	if got := strings.Join(types, " "); got != "queued started log succeeded" {
		t.Errorf("v1 events of v1-direct: %q", got)
	}

	// A v1 cancel, of a job submitted on v1.
	body, _ := json.Marshal(&job.Request{ID: "v1-sleeper", Command: []string{"sleep", "30"}})
	if _, err := nc.RequestWithContext(ctx, "fleet.submit.direct", body); err != nil {
		t.Fatal(err)
	}
	for {
		st, err := f.Client.Status(ctx, "v1-sleeper")
		if err == nil && st.Job.State == job.StateRunning {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("v1-sleeper never ran")
		}
		time.Sleep(50 * time.Millisecond)
	}
	m, err := nc.RequestWithContext(ctx, "fleet.cancel.v1-sleeper", nil)
	if err != nil {
		t.Fatal(err)
	}
	var c job.CancelReply
	if err := json.Unmarshal(m.Data, &c); err != nil || !c.Cancelled {
		t.Fatalf("v1 cancel: %s (%v)", m.Data, err)
	}
	if r := f.Await(t, "v1-sleeper", 20*time.Second); r.Status != job.StatusCancelled {
		t.Errorf("v1-sleeper: %s", r.Status)
	}
}
