package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/job"
)

// TestChaos runs 500 short jobs across three worker processes while one of
// them is SIGKILLed and restarted every 1.5 seconds. At the end every job
// has exactly one final result and one final event, none is lost, and each
// job's attempts add up: the last one plus one history entry for every
// attempt lost with a worker; and its history, as the pool's stream holds
// it, passes historytest, with no result heard twice.
func TestChaos(t *testing.T) {
	const jobs = 500
	f := fleettest.Start(t)
	env := []string{"FLEET_NATS_URL=" + f.NATS.URL(), "FLEET_DATA_DIR=" + t.TempDir(), "FLEET_REDIS_URL="}
	start := func(i int) *fleettest.Proc {
		p := fleettest.StartProc(t, "worker", env, "--id", fmt.Sprintf("chaos-%d", i), "--slots", "8",
			"--ack-wait", "2s", "--grace", "100ms", "--log-level", "warn")
		return p
	}
	// The jobs are queued as the workers start: whoever is up pulls them.
	workers := []*fleettest.Proc{start(0), start(1), start(2)}
	nc := f.NATS.Connect(t)
	ear := listen(t, nc, job.DefaultTenant, "default")

	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// A job may be unlucky several times in a row: a kill every 1.5 s.
	maxLost := 10
	var ids []string
	for i := 0; i < jobs; i++ {
		ids = append(ids, fmt.Sprintf("chaos-%03d", i))
		r := &job.Request{ID: ids[i], Command: []string{"sleep", "0.5"},
			Retry: &job.RetryPolicy{MaxAttempts: 10, MaxLost: &maxLost, InitialBackoff: dur(50 * time.Millisecond)}}
		if _, err := f.Client.Submit(ctx, r); err != nil {
			t.Fatal(err)
		}
	}

	js, _ := jetstream.New(nc)
	// A job's final record, with its one result, is on its r subject.
	results, err := js.Stream(ctx, "FLEET_POOL_default")
	if err != nil {
		t.Fatal(err)
	}
	kills := 0
	for {
		info, err := results.Info(ctx, jetstream.WithSubjectFilter("fleet.p.default.r.>"))
		if err != nil {
			t.Fatal(err)
		}
		if len(info.State.Subjects) >= jobs {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("only %d of %d results after %s", info.State.Msgs, jobs, time.Since(began))
		}
		time.Sleep(1500 * time.Millisecond)
		victim := kills % len(workers)
		workers[victim].Kill()
		kills++
		time.Sleep(300 * time.Millisecond)
		workers[victim] = start(victim)
	}
	elapsed := time.Since(began)

	// Exactly one result per job.
	info, err := results.Info(ctx, jetstream.WithSubjectFilter("fleet.p.default.r.>"))
	if err != nil {
		t.Fatal(err)
	}
	var count uint64 // State.Msgs counts the whole stream; the filter narrows only Subjects
	for _, n := range info.State.Subjects {
		count += n
	}
	if count != jobs || len(info.State.Subjects) != jobs {
		t.Fatalf("%d results on %d subjects for %d jobs", count, len(info.State.Subjects), jobs)
	}
	for subj, n := range info.State.Subjects {
		if n != 1 {
			t.Errorf("%s: %d results", subj, n)
		}
	}
	attempts, lost := 0, 0
	for i := 0; i < jobs; i++ {
		r := f.Await(t, fmt.Sprintf("chaos-%03d", i), 10*time.Second)
		if r.Status != job.StatusSucceeded {
			t.Errorf("%s: %s (%+v)", r.JobID, r.Status, r.Failure)
		}
		if r.Attempts != len(r.History)+1 {
			t.Errorf("%s: %d attempts but %d in its history", r.JobID, r.Attempts, len(r.History))
		}
		for _, h := range r.History {
			if h.Failure == nil || h.Failure.Code != job.CodeWorkerLost {
				t.Errorf("%s: attempt %d failed for another reason: %+v", r.JobID, h.Attempt, h.Failure)
			}
		}
		attempts += r.Attempts
		lost += len(r.History)
	}

	// Exactly one final event per job, and it is the last. A worker
	// publishes the final event just after the result: read until every
	// job has one, or a few seconds have passed.
	var finals map[string]int
	var last map[string]job.EventType
	for deadline := time.Now().Add(10 * time.Second); ; {
		finals, last = readEvents(t, ctx, js)
		if len(finals) == jobs || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for i := 0; i < jobs; i++ {
		id := fmt.Sprintf("chaos-%03d", i)
		if finals[id] != 1 || last[id] != job.EventSucceeded {
			t.Errorf("%s: %d final events, the last event is %s", id, finals[id], last[id])
		}
	}
	t.Logf("chaos: %d jobs, 3 workers, %d SIGKILLs in %s; %d attempts, %d lost with their worker; every job one result",
		jobs, kills, elapsed.Round(100*time.Millisecond), attempts, lost)
	requireHistory(t, nc, job.DefaultTenant, "default", "chaos-", ids, ear)
}

// readEvents reads the lifecycle events of the default pool's stream, one
// or two per record version: the final events per job, and each job's
// last event.
func readEvents(t *testing.T, ctx context.Context, js jetstream.JetStream) (map[string]int, map[string]job.EventType) {
	finals := map[string]int{}
	last := map[string]job.EventType{}
	cons, err := js.OrderedConsumer(ctx, "FLEET_POOL_default", jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for {
		batch, err := cons.FetchNoWait(500)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			var r job.Record
			if err := json.Unmarshal(m.Data(), &r); err != nil {
				t.Fatal(err)
			}
			for _, e := range job.EventsOf(&r) {
				if e.Type.Final() {
					finals[e.JobID]++
				}
				last[e.JobID] = e.Type
			}
		}
		if n == 0 {
			return finals, last
		}
	}
}
