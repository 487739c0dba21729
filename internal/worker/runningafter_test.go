package worker

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/executor/noop"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// A worker with RunningAfter records an attempt as running only once it
// has run that long (runningafter: begin holds the running version back,
// its clock stores it). These tests play whole deliveries against the
// store of redeliver_test.go, whose history checker holds every job to
// the one-result promise.

// runAfter delivers msg to worker id on h with RunningAfter d.
func runAfter(t *testing.T, h *hand, id string, d time.Duration, exec executor.Executor, msg *fakeMsg) {
	t.Helper()
	w := testWorker(t, h, Config{ID: id, RunningAfter: d})
	w.exec = exec
	w.handlers.attempts.Add(1)
	w.handle(deadMsg{fakeMsg: msg, h: h})
}

// kinds lists the kinds and states of a job's stored versions.
func kinds(st *store, id string) string {
	s := ""
	for _, v := range st.history(id) {
		s += fmt.Sprintf("%s:%s ", v.Kind, v.Rec.State)
	}
	return s
}

// An attempt that ends before RunningAfter writes one version, its end:
// queued, then the final version, against the queued one, which records
// the attempt's start (attempt 1, its worker, its start time).
func TestAnAttemptEndedSoonerWritesNoRunningVersion(t *testing.T) {
	st, o := newStore(), &ops{}
	msg := queueJob(t, st, o, &job.Request{ID: "j", Command: []string{"true"}}, 1)
	runAfter(t, &hand{st: st, o: o}, "w1", time.Minute, noop.Executor{}, msg)
	requireOneResult(t, st, "j", job.StateSucceeded)
	if got := kinds(st, "j"); got != "q3:queued r:succeeded " {
		t.Fatalf("versions %s; want the queued one and the final one", got)
	}
	final, _ := st.last("j")
	if !final.AttemptStarted || final.Attempt != 1 || final.WorkerID != "w1" || final.StartedAt == nil ||
		final.Result.StartedAt == nil || final.Result.WorkerID != "w1" {
		t.Errorf("final version %+v: want it to record attempt 1's start by w1", final)
	}
	wantOps(t, o.all(), []string{"record succeeded 1", "ack"})
}

// slow is an executor whose attempts run for d.
type slow struct{ d time.Duration }

func (s slow) Run(ctx context.Context, t *executor.Task) (*executor.Outcome, error) {
	start := time.Now()
	select {
	case <-time.After(s.d):
		return &executor.Outcome{Status: job.StatusSucceeded, StartedAt: start, FinishedAt: time.Now()}, nil
	case <-ctx.Done():
		return executor.CancelledOutcome(ctx, start), nil
	}
}

// An attempt that outlives RunningAfter is recorded as running then,
// while it runs, and its end is a version like any other.
func TestAnAttemptThatRunsOnIsRecordedRunning(t *testing.T) {
	st, o := newStore(), &ops{}
	msg := queueJob(t, st, o, &job.Request{ID: "j", Command: []string{"sleep", "1"}}, 1)
	start := time.Now()
	runAfter(t, &hand{st: st, o: o}, "w1", 20*time.Millisecond, slow{300 * time.Millisecond}, msg)
	requireOneResult(t, st, "j", job.StateSucceeded)
	if got := kinds(st, "j"); got != "q3:queued s:running r:succeeded " {
		t.Fatalf("versions %s; want queued, running, succeeded", got)
	}
	vs := st.history("j")
	running, final := vs[1].Rec, vs[2].Rec
	if at := running.UpdatedAt.Sub(start); at > 250*time.Millisecond {
		t.Errorf("running recorded %s after the delivery began; want about 20ms in", at)
	}
	if running.Event != job.EventStarted || running.WorkerID != "w1" || running.AttemptStarted || final.AttemptStarted {
		t.Errorf("running %+v, final %+v: want a started version, and neither recording a start held back", running, final)
	}
}

// A cancel in an attempt's first moment, before it was recorded running,
// finds the job queued: the dispatcher ends it there (cancelled before it
// ran). The worker's running version is then refused, and the attempt
// stopped; its end writes nothing over the cancel.
func TestACancelBeforeTheRunningVersionStopsTheAttempt(t *testing.T) {
	st, o := newStore(), &ops{}
	msg := queueJob(t, st, o, &job.Request{ID: "j", Command: []string{"sleep", "60"}}, 1)
	exec := blocking{started: make(chan struct{})}
	go func() {
		<-exec.started
		rec, rev := st.last("j")
		now := time.Now()
		f := job.Failf(job.ClassCancelled, job.CodeCancelled, "cancelled while queued")
		rec = rec.Version()
		rec.State, rec.Event, rec.Failure, rec.FinishedAt = job.StateCancelled, job.EventCancelled, f, &now
		rec.Result = &job.Result{JobID: "j", Pool: "default", Status: job.StatusCancelled, FinishedAt: now, Failure: f}
		if _, err := st.write(rec, rev); err != nil {
			panic(err)
		}
	}()
	done := make(chan struct{})
	go func() {
		defer close(done)
		runAfter(t, &hand{st: st, o: o}, "w1", 50*time.Millisecond, exec, msg)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the attempt was not stopped within 10s of the cancel")
	}
	requireOneResult(t, st, "j", job.StateCancelled)
	if got := kinds(st, "j"); got != "q3:queued r:cancelled " {
		t.Errorf("versions %s; want queued, then the dispatcher's cancel alone", got)
	}
}

// The redeliveries of TestRedeliveredAfterEveryWriteEndsOnce, for a
// worker that holds the running version back: dead after its one write
// (the final version), or its ack lost, the job still ends once.
func TestRedeliveredWithRunningHeldBackEndsOnce(t *testing.T) {
	for _, dieAfter := range []int{1, 0} {
		for _, again := range []uint64{1, 2} {
			t.Run(fmt.Sprintf("dies after write %d, delivered again as delivery %d", dieAfter, again), func(t *testing.T) {
				st, o := newStore(), &ops{}
				msg := queueJob(t, st, o, &job.Request{ID: "j", Command: []string{"true"}}, 1)
				runAfter(t, &hand{st: st, o: o, dieAfter: dieAfter}, "w1", time.Minute, noop.Executor{}, msg)
				msg.delivered = again
				o.log = nil
				runAfter(t, &hand{st: st, o: o}, "w2", time.Minute, noop.Executor{}, msg)
				requireOneResult(t, st, "j", job.StateSucceeded)
				wantOps(t, o.all(), []string{"ack"})
			})
		}
	}
}

// A delivery after the first records its attempt as running before it
// starts, RunningAfter or not: the first may have died in its first
// moment, and a job that kills its worker at once must be counted lost.
func TestALaterDeliveryRecordsRunningAtOnce(t *testing.T) {
	st, o := newStore(), &ops{}
	msg := queueJob(t, st, o, &job.Request{ID: "j", Command: []string{"true"}}, 2)
	runAfter(t, &hand{st: st, o: o}, "w1", time.Minute, noop.Executor{}, msg)
	requireOneResult(t, st, "j", job.StateSucceeded)
	if got := kinds(st, "j"); got != "q3:queued s:running r:succeeded " {
		t.Fatalf("versions %s; want queued, running, succeeded", got)
	}
}

// lagging is a journal whose running versions' writes go wrong as a
// cluster's can: with lose, the first is stored but its answer lost, and
// the read after it is answered by a replica that is behind (the version
// before); with refuse, none gets through.
type lagging struct {
	*hand
	mu            sync.Mutex
	lose, refuse  bool
	lost, stale   bool
	runningWrites int
}

func (l *lagging) WriteRecord(ctx context.Context, rec *job.Record, rev uint64) (uint64, error) {
	if rec.State == job.StateRunning && l.refuse {
		return 0, errNATS
	}
	seq, err := l.hand.WriteRecord(ctx, rec, rev)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err == nil && rec.State == job.StateRunning && l.lose && !l.lost {
		l.lost, l.stale = true, true
		return 0, context.DeadlineExceeded
	}
	return seq, err
}

func (l *lagging) Record(ctx context.Context, k queue.JobKey) (*job.Record, uint64, error) {
	l.mu.Lock()
	stale := l.stale
	l.stale = false
	l.mu.Unlock()
	if vs := l.st.history(k.ID); stale && len(vs) > 1 {
		before := vs[len(vs)-2]
		c := *before.Rec
		return &c, before.Seq, nil
	}
	return l.hand.Record(ctx, k)
}

func (l *lagging) SendRecord(rec *job.Record, rev uint64) (answer, error) {
	return sendBy(l.WriteRecord, rec, rev)
}

// progressed is a job message that counts the progress acks it is sent.
type progressed struct {
	deadMsg
	n *atomic.Int32
}

func (m progressed) InProgress() error { m.n.Add(1); return nil }

// runLagging delivers msg to a worker on j with RunningAfter 20ms and a
// progress every 100ms, and returns how many progress acks it sent.
func runLagging(t *testing.T, j *lagging, exec executor.Executor, msg *fakeMsg) int {
	t.Helper()
	w := testWorker(t, j, Config{ID: "w1", RunningAfter: 20 * time.Millisecond, Progress: 100 * time.Millisecond})
	w.exec = exec
	w.handlers.attempts.Add(1)
	var n atomic.Int32
	w.handle(progressed{deadMsg{fakeMsg: msg, h: j.hand}, &n})
	return int(n.Load())
}

// The running version's write stored but its answer lost, and the read
// after the refusal of its second try answered by a replica still at the
// queued version: the attempt is this one's, and it runs on. Before, the
// read was taken for a record someone else had moved, and the attempt
// was stopped.
func TestARunningVersionWhoseAnswerWasLostIsNotTakenForAnothers(t *testing.T) {
	st, o := newStore(), &ops{}
	msg := queueJob(t, st, o, &job.Request{ID: "j", Command: []string{"sleep", "1"}}, 1)
	runLagging(t, &lagging{hand: &hand{st: st, o: o}, lose: true}, slow{500 * time.Millisecond}, msg)
	requireOneResult(t, st, "j", job.StateSucceeded)
	if got := kinds(st, "j"); got != "q3:queued s:running r:succeeded " {
		t.Errorf("versions %s; want queued, running, succeeded", got)
	}
}

// While its running version cannot be stored, an attempt still tells
// JetStream it is alive, every progress: else the job is delivered again
// after the ack wait while it runs. Before, no progress ack was sent until
// the version was stored.
func TestAnAttemptNotYetRecordedRunningStillSaysItLives(t *testing.T) {
	st, o := newStore(), &ops{}
	msg := queueJob(t, st, o, &job.Request{ID: "j", Command: []string{"sleep", "1"}}, 1)
	acks := runLagging(t, &lagging{hand: &hand{st: st, o: o}, refuse: true}, slow{500 * time.Millisecond}, msg)
	requireOneResult(t, st, "j", job.StateSucceeded)
	if acks < 3 {
		t.Errorf("%d progress acks in an attempt of 500ms, progress every 100ms, its running version never stored; want at least 3", acks)
	}
	if final, _ := st.last("j"); !final.AttemptStarted {
		t.Errorf("the final version does not record the attempt's start: %+v", final)
	}
}
