package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// finals are the final versions of n jobs j0…jn-1, each to write against
// the revision of its record stored in j, with its message.
func finals(t *testing.T, j *memJournal, o *ops, n int) []finalVersion {
	t.Helper()
	var xs []finalVersion
	for i := range n {
		id := fmt.Sprintf("j%d", i)
		rev := j.put(&job.Record{ID: id, Pool: "default", State: job.StateRunning, Attempt: 1, WorkerID: "w1"})
		req := &job.Request{ID: id, Command: []string{"true"}}
		rec := &job.Record{ID: id, Pool: "default", State: job.StateSucceeded, Attempt: 1, Event: job.EventSucceeded,
			Result: &job.Result{JobID: id, Status: job.StatusSucceeded}}
		xs = append(xs, finalVersion{msg: jobMessage(t, o, req, rev, 1), rec: rec, rev: rev, log: slog.Default})
	}
	o.log = nil // the set-up's writes are not the test's
	return xs
}

// TestTheCompleterStoresABatchThenAcknowledgesIt: final versions handed on
// together are sent together, and a message is acknowledged only once
// every version of its batch has been answered, its own stored.
func TestTheCompleterStoresABatchThenAcknowledgesIt(t *testing.T) {
	o := &ops{}
	j := newJournal(o)
	w := testWorker(t, j, Config{})
	c := newCompleter(j, 8, w.m) // not started yet: what is handed on waits
	xs := finals(t, j, o, 5)
	var wg sync.WaitGroup
	stored := make([]uint64, len(xs))
	for i, x := range xs {
		wg.Go(func() {
			var refused error
			stored[i], refused = c.complete(x)
			if refused != nil {
				t.Errorf("%s refused: %v", x.rec.ID, refused)
			}
		})
	}
	for len(c.in) < len(xs) {
		time.Sleep(time.Millisecond)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if err := c.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}

	want := []string{}
	for range xs {
		want = append(want, "record succeeded 1 succeeded +result")
	}
	for range xs {
		want = append(want, "ack")
	}
	wantOps(t, o.all(), want)
	for i, x := range xs {
		if stored[i] != x.rev+1 {
			t.Errorf("%s: stored at revision %d, want %d", x.rec.ID, stored[i], x.rev+1)
		}
		if rec := j.get(x.rec.ID); rec.State != job.StateSucceeded {
			t.Errorf("%s stored as %s", x.rec.ID, rec.State)
		}
	}
}

// TestTheCompleterHandsBackWhatItDoesNotKnowStored: a version the stream
// refuses is handed back with the refusal (the record moved; the job has
// a final version), one it cannot send or whose answer does not come in
// time with nothing, and none of their messages is acknowledged.
func TestTheCompleterHandsBackWhatItDoesNotKnowStored(t *testing.T) {
	cases := []struct {
		name string
		give func(a memAnswer)
		want error
	}{
		{"a wrong last sequence: the record moved", func(a memAnswer) {
			a.err <- &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamWrongLastSequence}
		}, queue.ErrConflict},
		{"a duplicate: the job has its final version", func(a memAnswer) {
			a.ok <- &jetstream.PubAck{Sequence: 7, Duplicate: true}
		}, queue.ErrFinal},
		{"another error: nothing known", func(a memAnswer) { a.err <- errNATS }, nil},
		{"no answer in time: nothing known", func(memAnswer) {}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				o := &ops{}
				j := newJournal(o)
				w := testWorker(t, answering{memJournal: j, give: tc.give}, Config{})
				x := finals(t, j, o, 1)[0]
				start := time.Now()
				stored, refused := w.completer.complete(x)
				if stored != 0 || !errors.Is(refused, tc.want) || (tc.want == nil && refused != nil) {
					t.Errorf("complete: stored at %d, refused %v; want nothing stored, refused %v", stored, refused, tc.want)
				}
				if waited := time.Since(start); tc.name == cases[3].name && waited != firstAnswer {
					t.Errorf("handed back after %s, want %s", waited, firstAnswer)
				}
				wantOps(t, o.all(), nil)
			})
		})
	}
}

// TestAFinalVersionTheCompleterDoesNotKnowStoredIsWrittenAlone: through
// settle, an answer lost on the way is written again by the delivery, the
// same version to the byte, and the job has one final version.
func TestAFinalVersionTheCompleterDoesNotKnowStoredIsWrittenAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := &ops{}
		j := newJournal(o)
		var sent *job.Record
		lost := func(memAnswer) {} // stored, say, but the answer is lost
		w := testWorker(t, answering{memJournal: j, give: lost, sent: func(r *job.Record) { sent = r }}, Config{})
		x := finals(t, j, o, 1)[0]
		d := &delivery{w: w, msg: x.msg, id: x.rec.ID, n: 1, req: &job.Request{ID: x.rec.ID, Command: []string{"true"}}, rev: x.rev,
			key: queue.JobKey{Tenant: job.DefaultTenant, Pool: "default", ID: x.rec.ID}}
		d.rec, _, _ = j.Record(context.Background(), d.key)
		d.ctx, d.cancel = context.WithCancelCause(w.scope.run)
		o.log = nil
		out := &executor.Outcome{Status: job.StatusSucceeded, StartedAt: time.Now(), FinishedAt: time.Now()}
		err := d.settle(context.Background(), action{verb: doFinish, rev: d.rev, attempts: 1, outcome: out})
		if err != nil {
			t.Fatalf("settle: %v", err)
		}
		wantOps(t, o.all(), []string{"record succeeded 1 succeeded +result", "ack"})
		if sent == nil {
			t.Fatal("the completer sent nothing")
		}
		want, _ := json.Marshal(sent)
		if got := j.records[d.id]; !bytes.Equal(got, want) {
			t.Errorf("written alone:\n%s\nwant the version the completer sent:\n%s", got, want)
		}
	})
}

// answering is a journal whose SendRecord sends nothing, and answers as
// give says; sent, when set, is told what it was given.
type answering struct {
	*memJournal
	give func(memAnswer)
	sent func(*job.Record)
}

func (a answering) SendRecord(rec *job.Record, _ uint64) (answer, error) {
	if a.sent != nil {
		a.sent(rec)
	}
	m := memAnswer{ok: make(chan *jetstream.PubAck, 1), err: make(chan error, 1)}
	a.give(m)
	return m, nil
}
