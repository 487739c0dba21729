package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// finals are n deliveries of jobs j0…jn-1, each holding the final version
// of its job to write against the revision it read, beside the stored
// records in j.
func finals(t *testing.T, w *Worker, j *memJournal, o *ops, n int) []*completion {
	t.Helper()
	var xs []*completion
	for i := range n {
		id := fmt.Sprintf("j%d", i)
		rev := j.put(&job.Record{ID: id, Pool: "default", State: job.StateRunning, Attempt: 1, WorkerID: "w1"})
		req := &job.Request{ID: id, Command: []string{"true"}}
		d := &delivery{w: w, msg: jobMessage(t, o, req, rev, 1), id: id, n: 1, req: req, rev: rev,
			key: queue.JobKey{Tenant: job.DefaultTenant, Pool: "default", ID: id}}
		rec := &job.Record{ID: id, Pool: "default", State: job.StateSucceeded, Attempt: 1, Event: job.EventSucceeded,
			Result: &job.Result{JobID: id, Status: job.StatusSucceeded}}
		xs = append(xs, &completion{d: d, rec: rec, rev: rev, done: make(chan struct{})})
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
	c := newCompleter(w, 8) // not running yet: what is handed on waits
	xs := finals(t, w, j, o, 5)
	var wg sync.WaitGroup
	acked := make([]bool, len(xs))
	for i, x := range xs {
		wg.Go(func() {
			var refused error
			acked[i], refused = c.complete(x.d, x.rec, x.rev)
			if refused != nil {
				t.Errorf("%s refused: %v", x.d.id, refused)
			}
		})
	}
	for len(c.in) < len(xs) {
		time.Sleep(time.Millisecond)
	}
	go c.run()
	wg.Wait()
	c.close()

	want := []string{}
	for range xs {
		want = append(want, "record succeeded 1 succeeded +result")
	}
	for range xs {
		want = append(want, "ack")
	}
	wantOps(t, o.all(), want)
	for i, x := range xs {
		if !acked[i] {
			t.Errorf("%s: not acknowledged", x.d.id)
		}
		if rec := j.get(x.d.id); rec.State != job.StateSucceeded {
			t.Errorf("%s stored as %s", x.d.id, rec.State)
		}
		if x.d.rev != x.rev+1 || x.d.rec != x.rec {
			t.Errorf("%s: the delivery holds revision %d, want the stored version's %d", x.d.id, x.d.rev, x.rev+1)
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
				xs := finals(t, w, j, o, 1)
				x := xs[0]
				start := time.Now()
				acked, refused := w.completer.complete(x.d, x.rec, x.rev)
				if acked || !errors.Is(refused, tc.want) || (tc.want == nil && refused != nil) {
					t.Errorf("complete: acked %v, refused %v; want not acknowledged, refused %v", acked, refused, tc.want)
				}
				if waited := time.Since(start); tc.name == cases[3].name && waited != firstAnswer {
					t.Errorf("handed back after %s, want %s", waited, firstAnswer)
				}
				if x.d.rev != x.rev {
					t.Errorf("the delivery moved to revision %d with nothing stored", x.d.rev)
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
		xs := finals(t, w, j, o, 1)
		d := xs[0].d
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
