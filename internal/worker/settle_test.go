package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/fleet-dev/fleet/internal/capacity"
	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

var noopMeter = noop.NewMeterProvider().Meter("test")

// settleCase is one verb carried out by settle: from a stored record, what
// is written, published and acknowledged, in order, and what the record
// says after.
type settleCase struct {
	name string
	rec  func() *job.Record // the stored record; queued attempt 0 when nil
	n    int                // the delivery's attempt
	act  action
	// fail names journal operations that fail once (see memJournal.fail).
	fail    []string
	onWrite func(j *memJournal, rec *job.Record)
	want    []string
	wantErr error
	// check looks at the stored record (nil when the job has none) and the
	// journal after.
	check func(t *testing.T, rec *job.Record, j *memJournal)
}

// TestSettleCarriesOutEachVerb holds settle to what each verb writes,
// publishes and acknowledges, in which order, and to what happens when a
// write fails.
func TestSettleCarriesOutEachVerb(t *testing.T) {
	started := time.Now().Add(-10 * time.Second)
	running := func() *job.Record {
		return &job.Record{ID: "j", Pool: "default", State: job.StateRunning, Attempt: 1, WorkerID: "w1", StartedAt: &started}
	}
	exit := func(c int) *int { return &c }
	succeeded := &executor.Outcome{Status: job.StatusSucceeded, ExitCode: exit(0), StartedAt: started, FinishedAt: time.Now()}
	failed := &executor.Outcome{Status: job.StatusFailed, ExitCode: exit(3), StartedAt: started, FinishedAt: time.Now(),
		Failure: job.Failf(job.ClassExecution, job.CodeExitCode, "exit code 3")}
	lost := job.Attempt{Attempt: 1, WorkerID: "w0", Failure: job.Failf(job.ClassInfrastructure, job.CodeWorkerLost, "worker w0 stopped")}
	found := &executor.Found{Standing: executor.Running, Handle: "container c1", StartedAt: started}

	cases := []settleCase{
		{
			name: "run records the attempt running, which announces it; nothing is acknowledged",
			n:    1, act: action{verb: doRun, attempt: 1},
			want: []string{"record running 1 started"},
			check: func(t *testing.T, rec *job.Record, _ *memJournal) {
				if rec.WorkerID != "w1" || rec.StartedAt == nil || rec.Backend != "test" || rec.Request != nil {
					t.Errorf("record %+v", rec)
				}
			},
		},
		{
			name: "run after a lost attempt records it in the history and says the next starts now",
			rec:  running, n: 2, act: action{verb: doRun, attempt: 2, lost: []job.Attempt{lost}, restart: true},
			want: []string{"record running 2 started"},
			check: func(t *testing.T, rec *job.Record, _ *memJournal) {
				if len(rec.History) != 1 || rec.History[0].Failure.Code != job.CodeWorkerLost || rec.Failure == nil ||
					!strings.Contains(rec.Message, "attempt 2 starts now") {
					t.Errorf("history %+v failure %+v message %q", rec.History, rec.Failure, rec.Message)
				}
			},
		},
		{
			name: "run whose compare-and-set is refused writes nothing",
			n:    1, act: action{verb: doRun, attempt: 1},
			onWrite: func(j *memJournal, _ *job.Record) {
				j.put(&job.Record{ID: "j", Pool: "default", State: job.StateQueued, CancelRequested: true})
			},
			want:    []string{"record running 1 started"},
			wantErr: queue.ErrConflict,
			check: func(t *testing.T, rec *job.Record, _ *memJournal) {
				if rec.State != job.StateQueued || !rec.CancelRequested {
					t.Errorf("the cancel was overwritten: %+v", rec)
				}
			},
		},
		{
			name: "adopt names this worker in the record, which announces the adoption",
			rec: func() *job.Record {
				r := running()
				r.WorkerID = "w0"
				return r
			},
			n: 1, act: action{verb: doAdopt, attempt: 1, found: found},
			want: []string{"record running 1 heartbeat/adopted"},
			check: func(t *testing.T, rec *job.Record, _ *memJournal) {
				if rec.WorkerID != "w1" || rec.Adoptions != 1 || rec.Attempt != 1 || !strings.Contains(rec.Message, "from worker w0") {
					t.Errorf("record %+v", rec)
				}
			},
		},
		{
			name: "later naks with the delay and writes nothing",
			n:    1, act: action{verb: doLater, attempt: 1, delay: 3 * time.Second, why: "not before"},
			want: []string{"nak 3s"},
		},
		{
			name: "later without a delay waits laterDelay",
			n:    1, act: action{verb: doLater, attempt: 1},
			want: []string{"nak 2s"},
		},
		{
			name: "ack only acknowledges",
			rec:  func() *job.Record { r := running(); r.State = job.StateSucceeded; return r },
			n:    2, act: action{verb: doAck, attempt: 2},
			want: []string{"ack"},
		},
		{
			name: "refuse finishes the job failed with the reason, then terminates",
			n:    1, act: action{verb: doRefuse, why: "invalid request: command is missing"},
			want: []string{"record failed 0 failed +result", "term malformed request"},
			check: func(t *testing.T, rec *job.Record, _ *memJournal) {
				if rec.Result == nil || rec.Result.Failure.Class != job.ClassRejected || !strings.Contains(rec.Message, "command is missing") {
					t.Errorf("record %+v", rec)
				}
			},
		},
		{
			name: "requeue of a running attempt undoes it in a record that says the job is queued again, then naks at once",
			rec:  running, n: 1, act: action{verb: doRequeue, attempt: 1, why: "the worker is shutting down"},
			want: []string{"record queued 0 queued", "nak"},
			check: func(t *testing.T, rec *job.Record, _ *memJournal) {
				if rec.Handbacks != 1 || rec.StartedAt != nil || !strings.Contains(rec.Message, "shutting down") {
					t.Errorf("record %+v", rec)
				}
			},
		},
		{
			name: "requeue whose record write fails leaves the message for redelivery",
			rec:  running, n: 1, act: action{verb: doRequeue, attempt: 1, why: "shutting down"},
			fail:    []string{"record"},
			want:    []string{"record queued 0 queued"},
			wantErr: errNATS,
		},
		{
			name: "retry records the failed attempt and the next, then naks with the backoff",
			rec:  running, n: 1, act: action{verb: doRetry, attempt: 1, outcome: failed, delay: 5 * time.Second, memory: "512Mi"},
			want: []string{"record retrying 1 retry_scheduled", "nak 5s"},
			check: func(t *testing.T, rec *job.Record, _ *memJournal) {
				if len(rec.History) != 1 || rec.NextAttemptAt == nil || rec.MemoryOverride != "512Mi" || rec.Failure.Code != job.CodeExitCode {
					t.Errorf("record %+v", rec)
				}
			},
		},
		{
			name: "retry whose record is not stored leaves the message for redelivery",
			rec:  running, n: 1, act: action{verb: doRetry, attempt: 1, outcome: failed, delay: time.Second},
			fail:    []string{"record"},
			want:    []string{"record retrying 1 retry_scheduled"},
			wantErr: errNATS,
		},
		{
			name: "await owner notes since when in a record that says so, and naks with the delay",
			rec:  func() *job.Record { r := running(); r.WorkerID = "w0"; return r },
			n:    1, act: action{verb: doAwaitOwner, attempt: 1, delay: 5 * time.Second, why: "on another host"},
			want: []string{"record running 1 heartbeat/awaiting_owner", "nak 5s"},
			check: func(t *testing.T, rec *job.Record, _ *memJournal) {
				if rec.AwaitingSince == nil || rec.WorkerID != "w0" {
					t.Errorf("record %+v", rec)
				}
			},
		},
		{
			name: "leave running says so best effort and naks at once; the record still says it runs",
			rec:  running, n: 1, act: action{verb: doLeaveRunning, attempt: 1},
			want: []string{"notice heartbeat/handed_off", "nak"},
			check: func(t *testing.T, rec *job.Record, _ *memJournal) {
				if rec.State != job.StateRunning || rec.WorkerID != "w1" {
					t.Errorf("record %+v", rec)
				}
			},
		},
		{
			name: "finish writes the final record with the result, then acknowledges",
			rec:  running, n: 1, act: action{verb: doFinish, attempt: 1, attempts: 1, outcome: succeeded},
			want: []string{"record succeeded 1 succeeded +result", "ack"},
			check: func(t *testing.T, rec *job.Record, _ *memJournal) {
				if rec.FinishedAt == nil || rec.Result.Attempts != 1 || rec.Result.Status != job.StatusSucceeded {
					t.Errorf("record %+v", rec)
				}
			},
		},
		{
			name: "finish of a failed job dead-letters it before the final record, and terminates",
			rec:  running, n: 1, act: action{verb: doFinish, attempt: 1, attempts: 1, outcome: failed},
			want: []string{"dead letter", "record failed 1 failed +result", "stored dead letter", "term dead-lettered: execution"},
		},
		{
			name: "finish with lost attempts puts them in the result's and the record's history",
			rec:  running, n: 2, act: action{verb: doFinish, attempt: 2, attempts: 1, lost: []job.Attempt{lost},
				outcome: &executor.Outcome{Status: job.StatusFailed, Failure: lost.Failure}},
			want: []string{"dead letter", "record failed 1 failed +result", "stored dead letter", "term dead-lettered: infrastructure"},
			check: func(t *testing.T, rec *job.Record, _ *memJournal) {
				if len(rec.History) != 1 || len(rec.Result.History) != 1 {
					t.Errorf("history: record %+v, result %+v", rec.History, rec.Result.History)
				}
			},
		},
		{
			name: "finish whose final record is not stored leaves the message for redelivery",
			rec:  running, n: 1, act: action{verb: doFinish, attempt: 1, attempts: 1, outcome: succeeded},
			fail:    []string{"record"},
			want:    []string{"record succeeded 1 succeeded +result"},
			wantErr: errNATS,
		},
		{
			name: "finish whose final record is refused by a cancel writes again on what it read",
			rec:  running, n: 1, act: action{verb: doFinish, attempt: 1, attempts: 1, outcome: succeeded},
			onWrite: func(j *memJournal, _ *job.Record) {
				r := running()
				r.CancelRequested = true
				j.put(r)
			},
			want: []string{"record succeeded 1 succeeded +result", "read record", "record succeeded 1 succeeded +result", "ack"},
			check: func(t *testing.T, rec *job.Record, _ *memJournal) {
				if rec.State != job.StateSucceeded || !rec.CancelRequested {
					t.Errorf("record %+v", rec)
				}
			},
		},
		{
			name: "finish after another finished the job acknowledges, and its result stands",
			rec:  running, n: 1, act: action{verb: doFinish, attempt: 1, attempts: 1, outcome: succeeded},
			onWrite: func(j *memJournal, _ *job.Record) {
				r := running()
				r.State, r.Result = job.StateCancelled, &job.Result{JobID: "j", Status: job.StatusCancelled}
				j.put(r)
			},
			want: []string{"record succeeded 1 succeeded +result", "read record", "ack"},
			check: func(t *testing.T, rec *job.Record, _ *memJournal) {
				if rec.State != job.StateCancelled || rec.Result.Status != job.StatusCancelled {
					t.Errorf("the result that stood was overwritten: %+v", rec)
				}
			},
		},
		{
			name: "finish superseded by a later attempt leaves the job and its message alone",
			rec:  running, n: 1, act: action{verb: doFinish, attempt: 1, attempts: 1, outcome: succeeded},
			onWrite: func(j *memJournal, _ *job.Record) {
				r := running()
				r.Attempt, r.WorkerID = 2, "w2"
				j.put(r)
			},
			want: []string{"record succeeded 1 succeeded +result", "read record"},
			check: func(t *testing.T, rec *job.Record, _ *memJournal) {
				if rec.Attempt != 2 || rec.State != job.StateRunning {
					t.Errorf("the later attempt's record was overwritten: %+v", rec)
				}
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := &ops{}
			j := newJournal(o)
			rec := &job.Record{ID: "j", Pool: "default", State: job.StateQueued}
			if c.rec != nil {
				rec = c.rec()
			}
			rev := j.put(rec)
			for _, f := range c.fail {
				j.fail[f] = errNATS
			}
			j.onWrite = c.onWrite
			w := testWorker(t, j, Config{})
			req := &job.Request{ID: "j", Command: []string{"true"}}
			key := queue.JobKey{Tenant: job.DefaultTenant, Pool: "default", ID: "j"}
			d := &delivery{w: w, msg: jobMessage(t, o, req, rev, 1), key: key, id: "j", n: c.n, req: req, rev: rev}
			d.rec, _, _ = j.Record(context.Background(), key)
			d.ctx, d.cancel = context.WithCancelCause(w.scope.run)
			o.log = nil // the read above is the test's

			act := c.act
			act.rev = rev // decided on the stored record
			err := d.settle(context.Background(), act)
			if c.wantErr != nil {
				if !errors.Is(err, c.wantErr) {
					t.Errorf("settle: %v, want %v", err, c.wantErr)
				}
			} else if err != nil {
				t.Errorf("settle: %v", err)
			}
			wantOps(t, o.all(), c.want)
			if c.check != nil {
				c.check(t, j.get("j"), j)
			}
		})
	}
}

// blocking is an executor whose attempts run until their context ends.
type blocking struct{ started chan struct{} }

func (b blocking) Run(ctx context.Context, t *executor.Task) (*executor.Outcome, error) {
	close(b.started)
	<-ctx.Done()
	return executor.CancelledOutcome(ctx, time.Now()), nil
}

// TestCancelReachesARunningDelivery drives the whole pipeline of one
// delivery (receive, decide, record, run, settle) with a cancel arriving
// from another goroutine while it runs, as the dispatcher's notice does:
// under -race, the cancel path reads only what was set before the delivery
// was registered.
func TestCancelReachesARunningDelivery(t *testing.T) {
	o := &ops{}
	j := newJournal(o)
	rev := j.put(queuedRecord(&job.Request{ID: "c", Command: []string{"sleep", "60"}}))
	w := testWorker(t, j, Config{})
	exec := blocking{started: make(chan struct{})}
	w.exec = exec
	w.handlers.attempts.Add(1)
	msg := jobMessage(t, o, &job.Request{ID: "c", Command: []string{"sleep", "60"}}, rev, 1)

	// Cancels arrive from the moment the delivery starts, as they may
	// when a job is cancelled as it is delivered.
	notice := nats.NewMsg(w.names.Stop("default", job.DefaultTenant, "c"))
	handled := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-handled:
				return
			default:
				w.onCancel(notice)
			}
		}
	}()
	w.handle(msg)
	close(handled)
	wg.Wait()

	// Two writes: the attempt's start, and its end with the result.
	wantOps(t, o.all(), []string{"record running 1 started", "record cancelled 1 cancelled +result", "ack"})
	if rec := j.get("c"); rec.State != job.StateCancelled {
		t.Errorf("record %+v", rec)
	}
	if n := w.Running(); n != 0 {
		t.Errorf("%d deliveries still registered", n)
	}
}

// TestNoCapacityWritesNothing: a reservation that the worker's capacity
// refuses comes before any write, so the job is left for a worker with
// room and nothing is undone.
func TestNoCapacityWritesNothing(t *testing.T) {
	o := &ops{}
	j := newJournal(o)
	rev := j.put(queuedRecord(&job.Request{ID: "n", Command: []string{"true"}}))
	w := testWorker(t, j, Config{})
	w.cfg.Capacity = full{}
	w.exec = blocking{started: make(chan struct{})}
	w.handlers.attempts.Add(1)
	w.handle(jobMessage(t, o, &job.Request{ID: "n", Command: []string{"true"}}, rev, 1))
	wantOps(t, o.all(), []string{"nak 1s"})
	if rec := j.get("n"); rec.State != job.StateQueued || rec.Attempt != 0 {
		t.Errorf("record %+v", rec)
	}
}

// full is a capacity without room.
type full struct{}

func (full) Reserve(context.Context, capacity.Lease) error {
	return fmt.Errorf("%w: all slots are in use", capacity.ErrNoCapacity)
}
func (full) Release(context.Context, capacity.Lease) error { return nil }
