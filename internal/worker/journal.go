package worker

import (
	"context"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// journal is everything an attempt reads and writes about its job besides
// the job message itself: the record, the events, the result and the dead
// letter. Only settle writes through it. The Worker's journal is
// JetStream's (jsJournal); the unit tests give settle an in-memory one.
type journal interface {
	// Record returns the job's record and its revision, or
	// queue.ErrNotFound.
	Record(ctx context.Context, id string) (*job.Record, uint64, error)
	// WriteRecord replaces the record if it is still at revision rev and
	// returns the new revision; queue.ErrConflict if it is not.
	WriteRecord(ctx context.Context, rec *job.Record, rev uint64) (uint64, error)
	// Event publishes an event without waiting. Events of most types are
	// stored with an acknowledgement, which the returned pending waits for;
	// log and heartbeat events are sent best effort, and pending is nil.
	// seq numbers apart several events of one type and attempt.
	Event(e *job.Event, seq int) (pending, error)
	// DeadLetter copies a job's request to its pool's dead letters, with
	// its last failure, without waiting.
	DeadLetter(jobID, pool string, request []byte, submitted string, f *job.Failure, attempts int) (pending, error)
	// Result publishes the job's one result and returns the one that
	// stands: res, or one published before it.
	Result(ctx context.Context, res *job.Result) (*job.Result, error)
	// StoredResult returns the job's result; nil when it has none.
	StoredResult(ctx context.Context, id string) (*job.Result, error)
}

// pending is a publication under way.
type pending interface {
	// Wait returns once the message is stored, publishing it again while
	// the answer is ambiguous, or with the error that ends it.
	Wait(ctx context.Context) error
}

// jsJournal is the journal on JetStream, through package queue.
type jsJournal struct {
	nc    *nats.Conn
	js    jetstream.JetStream
	store *queue.Store
	names queue.Names
}

func (j *jsJournal) Record(ctx context.Context, id string) (*job.Record, uint64, error) {
	return j.store.Get(ctx, id)
}

func (j *jsJournal) WriteRecord(ctx context.Context, rec *job.Record, rev uint64) (uint64, error) {
	return j.store.Update(ctx, rec, rev)
}

func (j *jsJournal) Event(e *job.Event, seq int) (pending, error) {
	m, err := j.names.EventMsg(e, seq)
	if err != nil {
		return nil, err
	}
	if e.Type == job.EventLog || e.Type == job.EventHeartbeat {
		// Many, and best effort: stored without an acknowledgement.
		return nil, j.nc.PublishMsg(m)
	}
	return j.async(m)
}

func (j *jsJournal) DeadLetter(jobID, pool string, request []byte, submitted string, f *job.Failure, attempts int) (pending, error) {
	m := nats.NewMsg(j.names.DLQ(pool))
	m.Data = request
	m.Header.Set(queue.HeaderMsgID, jobID+"/dlq/"+strconv.Itoa(attempts))
	m.Header.Set(queue.HeaderFailureClass, string(f.Class))
	m.Header.Set(queue.HeaderFailureCode, string(f.Code))
	m.Header.Set(queue.HeaderFailureMessage, f.Message)
	m.Header.Set(queue.HeaderAttempts, strconv.Itoa(attempts))
	if submitted != "" {
		m.Header.Set(queue.HeaderSubmittedAt, submitted)
	}
	return j.async(m)
}

func (j *jsJournal) async(m *nats.Msg) (pending, error) {
	f, err := j.js.PublishMsgAsync(m)
	if err != nil {
		return nil, err
	}
	return jsPending{j.js, f}, nil
}

func (j *jsJournal) Result(ctx context.Context, res *job.Result) (*job.Result, error) {
	return queue.PublishResult(ctx, j.js, j.names, res)
}

func (j *jsJournal) StoredResult(ctx context.Context, id string) (*job.Result, error) {
	return queue.LastResult(ctx, j.js, j.names, id)
}

type jsPending struct {
	js jetstream.JetStream
	f  jetstream.PubAckFuture
}

func (p jsPending) Wait(ctx context.Context) error {
	_, err := queue.Await(ctx, p.js, p.f)
	return err
}
