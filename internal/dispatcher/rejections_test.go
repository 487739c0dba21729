package dispatcher_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/internal/executor/noop"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/historytest"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/internal/worker"
	"github.com/fleet-dev/fleet/job"
)

// TestAWatcherOfHowJobsEndHearsARejection: a subscriber of the subjects
// the contract names for how a tenant's jobs end, kinds r and x
// (fleet.t.<tenant>.job.*.r.> and fleet.t.<tenant>.job.*.x.>), hears a
// request refused on either submit path (the request/reply subject, and
// the intake stream, whose producer waits for no answer) as its rejected
// record, on kind x; a valid submission of the id then replaces the
// rejection, and the subscriber hears the job's result, on kind r, after
// it. No rejection is ever on kind r, whose versions are final, and the
// history passes historytest.
func TestAWatcherOfHowJobsEndHearsARejection(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t)
	f.Worker(t, noop.Executor{}, worker.Config{Backend: "noop", Slots: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nc := f.NATS.Connect(t)
	heard := make(chan *nats.Msg, 64)
	for _, subject := range []string{"fleet.t.default.job.*.r.>", "fleet.t.default.job.*.x.>"} {
		if _, err := nc.ChanSubscribe(subject, heard); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	ear := historytest.Listen(t, nc, queue.Names{}, job.DefaultTenant, job.DefaultPool)
	// hear waits for the next version heard of job id.
	hear := func(id string) (string, *job.Record) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for {
			select {
			case m := <-heard:
				if !strings.HasSuffix(m.Subject, "."+id) {
					continue
				}
				var rec job.Record
				if err := json.Unmarshal(m.Data, &rec); err != nil {
					t.Fatalf("%s: %v", m.Subject, err)
				}
				return m.Subject, &rec
			case <-deadline:
				t.Fatalf("a watcher of how jobs end (kinds r and x) heard nothing of %s", id)
			}
		}
	}

	// Refused on the request/reply subject: a duration that is none.
	_, err := f.Client.SubmitJSON(ctx, []byte(`{"id":"refused","timeout":"soon","command":["true"]}`))
	var rej *client.RejectedError
	if !errors.As(err, &rej) {
		t.Fatalf("submit of a bad request: %v", err)
	}
	if subject, rec := hear("refused"); subject != "fleet.t.default.job.default.x.refused" || rec.State != job.StateRejected ||
		!strings.Contains(rec.Message, "timeout") {
		t.Fatalf("heard %s: %s %q, want the rejection on kind x", subject, rec.State, rec.Message)
	}

	// Refused from the intake stream: nobody is answered.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "fleet.t.default.intake", []byte(`{"id":"refused-stored","timeout":"soon","command":["true"]}`)); err != nil {
		t.Fatal(err)
	}
	if subject, rec := hear("refused-stored"); subject != "fleet.t.default.job.default.x.refused-stored" || rec.State != job.StateRejected {
		t.Fatalf("heard %s: %s, want the rejection on kind x", subject, rec.State)
	}

	// Sent again, valid: it replaces the rejection, runs, and its result
	// is heard on kind r.
	s, err := f.Client.Submit(ctx, &job.Request{ID: "refused", Command: []string{"true"}})
	if err != nil || s.Duplicate || s.State != job.StateQueued {
		t.Fatalf("submit again: %+v, %v", s, err)
	}
	if subject, rec := hear("refused"); subject != "fleet.t.default.job.default.r.refused" || rec.State != job.StateSucceeded || rec.Result == nil {
		t.Fatalf("heard %s: %s, want the result on kind r", subject, rec.State)
	}
	if r, err := f.Client.Result(ctx, "refused"); err != nil || r.Status != job.StatusSucceeded {
		t.Fatalf("result of the job submitted again: %+v, %v", r, err)
	}
	wait, stop := context.WithTimeout(ctx, 5*time.Second)
	_, err = f.Client.Result(wait, "refused-stored")
	stop()
	if !errors.As(err, &rej) {
		t.Errorf("result of the job still rejected: %v, want a *client.RejectedError", err)
	}
	p := historytest.Require(t, js, queue.Names{}, job.DefaultTenant, job.DefaultPool, "refused", []string{"refused"}, ear)
	var kinds []string
	for _, v := range p.Jobs["default/refused"] {
		kinds = append(kinds, v.Kind)
	}
	if got := strings.Join(kinds, " "); got != "x q3 s r" {
		t.Errorf("the versions of the job rejected, then submitted again, are of kinds %s, want x q3 s r", got)
	}
}

// TestARequestRefusedAgainKeepsOneRejection: the same request refused
// again for the same reason (a producer's copy sent again while the first
// waited for its answer, or a user's retry) adds no version: the job keeps
// the one rejection, which says it all. Refused for another reason, the
// new reason replaces it, as a watcher of the id must hear.
func TestARequestRefusedAgainKeepsOneRejection(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc := f.NATS.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	submit := func(doc string) {
		t.Helper()
		var rej *client.RejectedError
		if _, err := f.Client.SubmitJSON(ctx, []byte(doc)); !errors.As(err, &rej) {
			t.Fatalf("submit of %s: %v, want a rejection", doc, err)
		}
	}
	for range 3 {
		submit(`{"id":"again","timeout":"soon","command":["true"]}`)
	}
	kinds := func() []string {
		t.Helper()
		// Read, not Require: a job only ever rejected has no final version.
		names := queue.Names{}
		p, err := historytest.Read(ctx, js, names, job.DefaultPool, names.PoolJob(job.DefaultPool, "*", job.DefaultTenant, ">"))
		if err != nil {
			t.Fatal(err)
		}
		var kinds []string
		for _, v := range p.Jobs["default/again"] {
			kinds = append(kinds, v.Kind)
		}
		return kinds
	}
	if got := strings.Join(kinds(), " "); got != "x" {
		t.Fatalf("a request refused three times for one reason left versions of kinds %s, want one x", got)
	}
	submit(`{"id":"again","priority":99,"command":["true"]}`)
	if got := strings.Join(kinds(), " "); got != "x x" {
		t.Fatalf("refused again for another reason: versions of kinds %s, want x x", got)
	}
	st, err := f.Client.Status(ctx, "again")
	if err != nil || st.Job.State != job.StateRejected || !strings.Contains(st.Job.Message, "priority") {
		t.Fatalf("status after the second reason: %+v, %v, want the priority's rejection", st, err)
	}
}
