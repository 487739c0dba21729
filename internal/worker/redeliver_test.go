package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/executor/noop"
	"github.com/fleet-dev/fleet/internal/historytest"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// The one-result promise, at every point of a delivery's pipeline, on
// fakes: a job message delivered again after each of the first delivery's
// writes (its worker died there) and after its ack (the ack was lost), both
// as a redelivery (delivered twice) and as a first delivery (what JetStream
// does after a server restart that lost the consumer's state), and the
// record moved by someone else under each of its compare-and-sets. In
// every case the job ends with one final version and a history
// historytest finds nothing wrong with.

// store is a pool's stream in memory, as the servers keep it: every
// version of each job's record with its sequence, each write a
// compare-and-set on the job's last version, and a second final version
// refused (the servers refuse a final version's message id twice).
type store struct {
	mu       sync.Mutex
	seq      uint64
	versions map[string][]historytest.Version
}

func newStore() *store { return &store{versions: map[string][]historytest.Version{}} }

func kindOfRecord(r *job.Record) string {
	switch {
	case r.State.Final():
		return queue.KindResult
	case r.Request != nil && r.State == job.StateQueued:
		return queue.KindQueued(r.Priority)
	}
	return queue.KindState
}

// write stores rec if the job's last version is at rev.
func (s *store) write(rec *job.Record, rev uint64) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	vs := s.versions[rec.ID]
	last := uint64(0)
	if len(vs) > 0 {
		last = vs[len(vs)-1].Seq
	}
	if last != rev {
		return 0, queue.ErrConflict
	}
	if rec.State.Final() {
		for _, v := range vs {
			if v.Rec.State.Final() {
				return 0, queue.ErrFinal // its message id is taken
			}
		}
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return 0, err
	}
	var stored job.Record
	if err := json.Unmarshal(data, &stored); err != nil {
		return 0, err
	}
	s.seq++
	s.versions[rec.ID] = append(vs, historytest.Version{Seq: s.seq, Kind: kindOfRecord(rec), Expected: rev, CAS: true, Rec: &stored})
	return s.seq, nil
}

func (s *store) last(id string) (*job.Record, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	vs := s.versions[id]
	if len(vs) == 0 {
		return nil, 0
	}
	v := vs[len(vs)-1]
	c := *v.Rec
	return &c, v.Seq
}

func (s *store) history(id string) []historytest.Version {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]historytest.Version(nil), s.versions[id]...)
}

// errDead is what a dead worker's calls come to: nothing.
var errDead = errors.New("the worker is dead")

// hand is one worker's view of the store: a journal that dies after a
// number of stored writes (every later call fails and changes nothing),
// and may let someone else move the record before one of its writes.
type hand struct {
	st *store
	o  *ops
	mu sync.Mutex
	// writes counts this worker's stored record writes; after dieAfter of
	// them (when > 0) the worker is dead.
	writes, dieAfter int
	// before, when set, runs before write number at (from 1), once.
	at     int
	before func(st *store)
	tries  int
}

func (h *hand) dead() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.dieAfter > 0 && h.writes >= h.dieAfter
}

func (h *hand) Record(_ context.Context, k queue.JobKey) (*job.Record, uint64, error) {
	if h.dead() {
		return nil, 0, errDead
	}
	rec, rev := h.st.last(k.ID)
	if rec == nil {
		return nil, 0, queue.ErrNotFound
	}
	return rec, rev, nil
}

func (h *hand) WriteRecord(_ context.Context, rec *job.Record, rev uint64) (uint64, error) {
	if h.dead() {
		return 0, errDead
	}
	h.mu.Lock()
	h.tries++
	if h.before != nil && h.tries == h.at {
		f := h.before
		h.before = nil
		h.mu.Unlock()
		f(h.st)
		h.mu.Lock()
	}
	h.mu.Unlock()
	seq, err := h.st.write(rec, rev)
	if err == nil {
		h.mu.Lock()
		h.writes++
		h.mu.Unlock()
		h.o.add("record %s %d", rec.State, rec.Attempt)
	}
	return seq, err
}

func (h *hand) SendRecord(rec *job.Record, rev uint64) (answer, error) {
	return sendBy(h.WriteRecord, rec, rev)
}

func (h *hand) Notice(*job.Event) error {
	if h.dead() {
		return errDead
	}
	return nil
}

func (h *hand) NodeEnded(string, *job.NodeEnded) (pending, error) {
	if h.dead() {
		return nil, errDead
	}
	return donePending{}, nil
}

func (h *hand) DeadLetter(queue.JobKey, []byte, *job.Failure, int) (pending, error) {
	if h.dead() {
		return nil, errDead
	}
	return donePending{}, nil
}

type donePending struct{}

func (donePending) Wait(context.Context) error { return nil }

// deadMsg is a job message whose acks a dead worker sends to no one.
type deadMsg struct {
	*fakeMsg
	h *hand
}

func (m deadMsg) Ack() error {
	if m.h.dead() {
		return errDead
	}
	return m.fakeMsg.Ack()
}

func (m deadMsg) Nak() error {
	if m.h.dead() {
		return errDead
	}
	return m.fakeMsg.Nak()
}

func (m deadMsg) NakWithDelay(d time.Duration) error {
	if m.h.dead() {
		return errDead
	}
	return m.fakeMsg.NakWithDelay(d)
}

func (m deadMsg) TermWithReason(r string) error {
	if m.h.dead() {
		return errDead
	}
	return m.fakeMsg.TermWithReason(r)
}

// deliver hands msg to a fresh worker id on h and runs its pipeline to its
// end.
func deliver(t *testing.T, h *hand, id string, exec executor.Executor, msg *fakeMsg) {
	t.Helper()
	w := testWorker(t, h, Config{ID: id})
	w.exec = exec
	w.handlers.attempts.Add(1)
	// A dead worker's settlement gives up at once rather than retrying.
	if h.dieAfter > 0 {
		ctx, cancel := context.WithCancel(context.Background())
		w.scope.settle, w.scope.giveUp = ctx, cancel
		w.scope.run, w.scope.stopRuns = context.WithCancelCause(ctx)
	}
	w.handle(deadMsg{fakeMsg: msg, h: h})
}

// requireOneResult fails t unless the job's history is sound and ends with
// one final version of status want.
func requireOneResult(t *testing.T, st *store, id string, want job.State) {
	t.Helper()
	vs := st.history(id)
	for _, v := range historytest.Check("default/"+id, vs) {
		t.Errorf("%s", v)
	}
	finals := 0
	for _, v := range vs {
		if v.Rec.State.Final() {
			finals++
		}
	}
	last := vs[len(vs)-1].Rec
	if finals != 1 || last.State != want {
		t.Errorf("%d final versions, last %s; want one, %s", finals, last.State, want)
	}
	if t.Failed() {
		for _, v := range vs {
			t.Logf("  %s", v)
		}
	}
}

// queueJob writes a job's queued version into st and returns its message,
// delivered delivered times.
func queueJob(t *testing.T, st *store, o *ops, r *job.Request, delivered uint64) *fakeMsg {
	t.Helper()
	r.Normalize()
	rev, err := st.write(queuedRecord(r), 0)
	if err != nil {
		t.Fatal(err)
	}
	return jobMessage(t, o, r, rev, delivered)
}

// TestRedeliveredAfterEveryWriteEndsOnce kills the first delivery's
// worker after each of its writes (running, then the final version), and
// after its ack; another worker is then given the message again, as a
// redelivery and as a first delivery.
func TestRedeliveredAfterEveryWriteEndsOnce(t *testing.T) {
	// A delivery of a job that succeeds writes two versions: running,
	// then the final one; then it acknowledges. dieAfter 0 is the ack
	// lost: the first delivery did everything.
	for _, dieAfter := range []int{1, 2, 0} {
		for _, again := range []uint64{1, 2} {
			name := fmt.Sprintf("worker dies after write %d, delivered again as delivery %d", dieAfter, again)
			if dieAfter == 0 {
				name = fmt.Sprintf("ack lost, delivered again as delivery %d", again)
			}
			t.Run(name, func(t *testing.T) {
				st, o := newStore(), &ops{}
				r := &job.Request{ID: "j", Command: []string{"true"}}
				msg := queueJob(t, st, o, r, 1)
				first := &hand{st: st, o: o, dieAfter: dieAfter}
				deliver(t, first, "w1", noop.Executor{}, msg)

				msg.delivered = again
				o.log = nil
				deliver(t, &hand{st: st, o: o}, "w2", noop.Executor{}, msg)
				requireOneResult(t, st, "j", job.StateSucceeded)
				if dieAfter == 0 || dieAfter == 2 {
					// The job had ended: the second delivery only acknowledges.
					wantOps(t, o.all(), []string{"ack"})
				}
			})
		}
	}
}

// TestRecordMovedUnderEveryWriteEndsOnce lets someone else change the
// job's record just before each write of a delivery: another delivery
// that finished the job, a cancel, another worker that took the job over.
// The delivery, delivered as a first or a second delivery, decides again
// on what it reads and the job still ends once.
func TestRecordMovedUnderEveryWriteEndsOnce(t *testing.T) {
	finishedBy := func(st *store) {
		rec, rev := st.last("j")
		now := time.Now()
		rec.Request, rec.Event, rec.State, rec.Attempt, rec.WorkerID = nil, job.EventSucceeded, job.StateSucceeded, max(rec.Attempt, 1), "w0"
		rec.FinishedAt = &now
		rec.Result = &job.Result{JobID: "j", Pool: "default", Status: job.StatusSucceeded, Attempts: rec.Attempt, FinishedAt: now}
		if _, err := st.write(rec, rev); err != nil {
			panic(err)
		}
	}
	cancelled := func(st *store) {
		rec, rev := st.last("j")
		rec.Request, rec.Event, rec.CancelRequested, rec.Message = nil, job.EventHeartbeat, true, "cancel requested"
		if _, err := st.write(rec, rev); err != nil {
			panic(err)
		}
	}
	takenOver := func(st *store) {
		rec, rev := st.last("j")
		now := time.Now()
		if rec.State == job.StateRunning {
			// It found the attempt lost with its worker.
			rec.History = append(rec.History, job.Attempt{Attempt: rec.Attempt, WorkerID: rec.WorkerID,
				Failure: job.Failf(job.ClassInfrastructure, job.CodeWorkerLost, "worker %s stopped responding", rec.WorkerID)})
		}
		rec.Request, rec.Event, rec.State, rec.Attempt, rec.WorkerID, rec.StartedAt = nil, job.EventStarted, job.StateRunning, rec.Attempt+1, "w0", &now
		if _, err := st.write(rec, rev); err != nil {
			panic(err)
		}
	}
	movers := []struct {
		name string
		move func(*store)
		// want is how the job ends once the mover's change stands and
		// the delivery has settled; for a take-over, once its own
		// delivery (played afterwards) has.
		want job.State
	}{
		{"another delivery finished the job", finishedBy, job.StateSucceeded},
		{"a cancel was requested", cancelled, job.StateCancelled},
		{"another worker took the job over", takenOver, job.StateSucceeded},
	}
	for _, m := range movers {
		for _, at := range []int{1, 2} {
			for _, delivered := range []uint64{1, 2} {
				t.Run(fmt.Sprintf("%s before write %d of delivery %d", m.name, at, delivered), func(t *testing.T) {
					st, o := newStore(), &ops{}
					r := &job.Request{ID: "j", Command: []string{"true"}}
					msg := queueJob(t, st, o, r, delivered)
					deliver(t, &hand{st: st, o: o, at: at, before: m.move}, "w1", noop.Executor{}, msg)
					if rec, _ := st.last("j"); !rec.State.Final() {
						// The job is another worker's now, or was handed
						// back: its next delivery settles it.
						msg.delivered++
						deliver(t, &hand{st: st, o: o}, "w3", noop.Executor{}, msg)
					}
					state := m.want
					if m.name == "a cancel was requested" && at == 2 {
						// The attempt had ended when the cancel came: it stands.
						state = job.StateSucceeded
					}
					requireOneResult(t, st, "j", state)
				})
			}
		}
	}
}
