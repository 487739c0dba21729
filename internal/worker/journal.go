package worker

import (
	"context"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// journal is what a delivery reads and writes about its job besides the
// job message itself: the versions of the job's record (each says what
// happened; the final one carries the result), its heartbeat and log
// events, and its dead letter. Only settle writes through it, but for the
// best-effort heartbeat and log events of a running attempt. The
// Worker's journal is JetStream's (jsJournal); the unit tests give settle
// an in-memory one.
type journal interface {
	// Record returns the last version of the job's record and its
	// revision, or queue.ErrNotFound.
	Record(ctx context.Context, k queue.JobKey) (*job.Record, uint64, error)
	// WriteRecord stores a new version of the record if the last is still
	// at revision rev, and returns the new revision; queue.ErrConflict if
	// it is not, queue.ErrFinal for a final version when the job has one
	// already, whatever rev is.
	WriteRecord(ctx context.Context, rec *job.Record, rev uint64) (uint64, error)
	// SendRecord sends a new version of the record as WriteRecord does,
	// without waiting: one of the answer's channels says how it went
	// (PubAck.Sequence, the new revision; a duplicate or an error: see
	// WriteRecord, which is the way to make it again).
	SendRecord(rec *job.Record, rev uint64) (answer, error)
	// Notice sends a heartbeat or log event, best effort.
	Notice(e *job.Event) error
	// NodeEnded sends that a run's node's job ended, without waiting:
	// what takes the nodes after it on (see package runs).
	NodeEnded(tenant string, e *job.NodeEnded) (pending, error)
	// DeadLetter copies a job's message to its pool's dead letters, with
	// its last failure and attempts (queue.DeadLetterBody), without
	// waiting.
	DeadLetter(k queue.JobKey, msg []byte, f *job.Failure, attempts int) (pending, error)
}

// answer is the answer to come of a publication sent without waiting;
// a jetstream.PubAckFuture is one.
type answer interface {
	Ok() <-chan *jetstream.PubAck
	Err() <-chan error
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
	jobs  *queue.Jobs
	names queue.Names
}

func (j *jsJournal) Record(ctx context.Context, k queue.JobKey) (*job.Record, uint64, error) {
	return j.jobs.Latest(ctx, k)
}

func (j *jsJournal) WriteRecord(ctx context.Context, rec *job.Record, rev uint64) (uint64, error) {
	return j.jobs.Write(ctx, rec, rev)
}

func (j *jsJournal) SendRecord(rec *job.Record, rev uint64) (answer, error) {
	return j.jobs.WriteAsync(rec, rev)
}

func (j *jsJournal) Notice(e *job.Event) error {
	m, err := j.names.NoticeMsg(e)
	if err != nil {
		return err
	}
	return j.nc.PublishMsg(m)
}

func (j *jsJournal) NodeEnded(tenant string, e *job.NodeEnded) (pending, error) {
	m, err := j.names.NodeEndedMsg(e, tenant)
	if err != nil {
		return nil, err
	}
	fut, err := j.js.PublishMsgAsync(m)
	if err != nil {
		return nil, err
	}
	return jsPending{j.js, fut}, nil
}

func (j *jsJournal) DeadLetter(k queue.JobKey, msg []byte, f *job.Failure, attempts int) (pending, error) {
	body, err := queue.DeadLetterBody(msg, f, attempts)
	if err != nil {
		return nil, err
	}
	m := nats.NewMsg(j.names.DLQV2(k.Pool, k.Tenant, k.ID))
	m.Data = body
	// The body has the failure and attempts; the headers too, for the
	// readers of before.
	m.Header.Set(queue.HeaderMsgID, k.Tenant+"/"+k.ID+"/dlq/"+strconv.Itoa(attempts))
	m.Header.Set(queue.HeaderFailureClass, string(f.Class))
	m.Header.Set(queue.HeaderFailureCode, string(f.Code))
	m.Header.Set(queue.HeaderFailureMessage, f.Message)
	m.Header.Set(queue.HeaderAttempts, strconv.Itoa(attempts))
	fut, err := j.js.PublishMsgAsync(m)
	if err != nil {
		return nil, err
	}
	return jsPending{j.js, fut}, nil
}

type jsPending struct {
	js jetstream.JetStream
	f  jetstream.PubAckFuture
}

func (p jsPending) Wait(ctx context.Context) error {
	_, err := queue.Await(ctx, p.js, p.f)
	return err
}
