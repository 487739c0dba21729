package queue

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/job"
)

// Jobs keeps the records of jobs in their pools' streams (contract v2).
//
// A job's record has several versions, each a message of its pool's stream
// FLEET_POOL_<pool> on one of the job's subjects, <prefix>.p.<pool>.<kind>.
// <tenant>.<id>: the first, of kind q<priority>, queues the job with its
// request, and is what the pool's workers are delivered; later ones are of
// kind s, and the final one, with the job's result, of kind r. A rejected
// request's version is of kind x (s before this kind existed): the
// dispatcher writes it where it would have queued the job, and a later
// valid submission of the id queues the job over it. Every write
// is a compare-and-set against the last message on any of the job's
// subjects (Nats-Expected-Last-Subject-Sequence with
// Nats-Expected-Last-Subject-Sequence-Subject), so the first version is the
// job's idempotency gate, a cancel and a worker's start never overwrite
// each other, and a job has one final version, one result. A version's
// revision is its stream sequence. What a reader believes of the versions
// is in find.go: a version whose body names another job than its subject
// is ignored.
type Jobs struct {
	nc    *nats.Conn
	js    jetstream.JetStream
	names Names
	log   *slog.Logger
	// batches receives the answers of Find's direct gets.
	batches *batches
}

// NewJobs returns the job store of a connection.
func NewJobs(js jetstream.JetStream, names Names) *Jobs {
	return &Jobs{nc: js.Conn(), js: js, names: names, batches: &batches{nc: js.Conn()}}
}

// WithLogger returns the store logging to log (the versions it ignores).
// Defaults to slog.Default().
func (j *Jobs) WithLogger(log *slog.Logger) *Jobs {
	c := *j
	c.log = log
	return &c
}

func (j *Jobs) logger() *slog.Logger {
	if j.log == nil {
		return slog.Default()
	}
	return j.log
}

// Key returns a record's place.
func Key(r *job.Record) JobKey { return JobKey{Tenant: r.Tenant, Pool: r.Pool, ID: r.ID} }

// kindOf is the subject kind of a record version.
func kindOf(r *job.Record) string {
	switch {
	case r.State.Final():
		return KindResult
	case r.Request != nil && r.State == job.StateQueued:
		return KindQueued(r.Priority)
	case r.State == job.StateRejected:
		return KindRejected
	}
	return KindState
}

// Queue writes the version of a job's record that queues it, with the
// request, if the job's last version is at revision rev (0: it has none):
// ErrExists if it is not. hdr, which may be nil, goes with it (the trace
// context). It returns the version's revision.
func (j *Jobs) Queue(ctx context.Context, rec *job.Record, rev uint64, hdr nats.Header) (uint64, error) {
	return j.write(ctx, rec, rev, ErrExists, hdr)
}

// QueueAsync sends the first version of a job's record as Queue does,
// with headers hdr, and returns without waiting for its answer: the
// future says whether it was stored. Many sent at once share the
// connection's writes and the stream's. A write that fails, or whose
// answer does not come, is Queue's to make again: its compare-and-set on
// "no record yet" then finds the job queued if this one was stored after
// all, which the submission's token in hdr tells from another's.
func (j *Jobs) QueueAsync(rec *job.Record, hdr nats.Header) (jetstream.PubAckFuture, error) {
	m, err := j.Msg(rec, 0)
	if err != nil {
		return nil, err
	}
	for k, v := range hdr {
		m.Header[k] = v
	}
	f, err := j.js.PublishMsgAsync(m)
	if err != nil {
		return nil, fmt.Errorf("write record of job %s: %w", rec.ID, err)
	}
	return f, nil
}

// WriteAsync sends a later version of a job's record as Write does, and
// returns without waiting: the future says whether it was stored, with
// Write's meanings (a wrong last sequence: the record moved; a duplicate:
// the job has a final version already). Many sent at once share the
// connection's writes and the stream's. A write whose answer does not come
// is Write's to make again, with the same record: the stream then knows
// the final version's message id, and Write reads back whether it was this
// one.
func (j *Jobs) WriteAsync(rec *job.Record, rev uint64) (jetstream.PubAckFuture, error) {
	m, err := j.Msg(rec, rev)
	if err != nil {
		return nil, err
	}
	f, err := j.js.PublishMsgAsync(m)
	if err != nil {
		return nil, fmt.Errorf("write record of job %s: %w", rec.ID, err)
	}
	return f, nil
}

// Write stores a later version of a job's record if the job's last
// version is still at revision rev (its stream sequence), and returns the
// new revision; ErrConflict if it is not. A final record goes on the
// job's result subject, and is refused with ErrFinal when the job has a
// final version already, whatever rev says.
func (j *Jobs) Write(ctx context.Context, rec *job.Record, rev uint64) (uint64, error) {
	return j.write(ctx, rec, rev, ErrConflict, nil)
}

// Msg builds the message of a record version, with its compare-and-set
// against revision rev.
func (j *Jobs) Msg(rec *job.Record, rev uint64) (*nats.Msg, error) {
	data, err := json.Marshal(rec)
	if err != nil {
		return nil, fmt.Errorf("encode record of job %s: %w", rec.ID, err)
	}
	k := Key(rec)
	kind := kindOf(rec)
	m := nats.NewMsg(j.names.PoolJob(k.Pool, kind, k.Tenant, k.ID))
	m.Data = data
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev, 10))
	m.Header.Set(jetstream.ExpectedLastSubjSeqSubjHeader, j.names.PoolJobAll(k.Pool, k.Tenant, k.ID))
	if kind == KindResult {
		m.Header.Set(jetstream.MsgIDHeader, FinalMsgID(k))
	}
	return m, nil
}

// FinalMsgID is the message id of a job's final version. The servers keep
// the ids of the pool's stream for its duplicate window and store no
// second message with one of them, whatever its compare-and-set says: a
// second final version of a job is refused as the stream stores it, on
// top of the compare-and-set that orders every version.
func FinalMsgID(k JobKey) string { return k.Tenant + "/" + k.ID + "/final" }

// firstWrite is how long the first try of a record's write waits for its
// answer: far longer than a quorum write takes on a busy cluster.
const firstWrite = 500 * time.Millisecond

// write stores rec with compare-and-set against revision rev. A write
// whose answer was lost (see Ambiguous) is sent again; if the second try
// finds the record changed, the change may be the first try's own: the
// last version is read back, and if it is exactly what was written, the
// write succeeded.
func (j *Jobs) write(ctx context.Context, rec *job.Record, rev uint64, refused error, hdr nats.Header) (uint64, error) {
	m, err := j.Msg(rec, rev)
	if err != nil {
		return 0, err
	}
	for k, v := range hdr {
		m.Header[k] = v
	}
	var newRev uint64
	ambiguous := false
	// The first try waits for its answer firstWrite at most: a write the
	// stream's leader took as it handed its leadership over (to the server
	// of the pool's queues, see Placed) is never answered, and waiting for
	// the asynchronous publish's own timeout would hold the job that long.
	// Then the tries of Retry take over.
	duplicate := false
	f, err := j.js.PublishMsgAsync(m)
	if err == nil {
		t := time.NewTimer(firstWrite)
		select {
		case ack := <-f.Ok():
			newRev, duplicate = ack.Sequence, ack.Duplicate
		case err = <-f.Err():
		case <-t.C:
			err = jetstream.ErrAsyncPublishTimeout
		case <-electionsOf(ctx):
			err = jetstream.ErrAsyncPublishTimeout // sent again at once (see Elections)
		case <-ctx.Done():
			err = ctx.Err()
		}
		t.Stop()
	}
	if err != nil && Ambiguous(err) && ctx.Err() == nil {
		ambiguous = true
		err = Retry(ctx, func(ctx context.Context) error {
			ack, err := j.js.PublishMsg(ctx, m)
			if err == nil {
				newRev, duplicate = ack.Sequence, ack.Duplicate
			}
			// A try cut short (an election woke it) may have been stored too.
			ambiguous = ambiguous || Ambiguous(err) || errors.Is(err, context.Canceled)
			return err
		}, nil)
	}
	if err == nil && duplicate {
		// A final version of the job is stored already: this one's own
		// first try, whose answer was lost, or another's, and then this
		// one is refused.
		if data, seq, gerr := j.last(ctx, Key(rec)); gerr == nil && seq == newRev && bytes.Equal(data, m.Data) {
			return seq, nil
		}
		return 0, fmt.Errorf("write record of job %s: %w (version %d)", rec.ID, ErrFinal, newRev)
	}
	if IsWrongLastSequence(err) {
		if ambiguous {
			if data, seq, gerr := j.last(ctx, Key(rec)); gerr == nil && bytes.Equal(data, m.Data) {
				return seq, nil
			}
		}
		return 0, refused
	}
	if errors.Is(err, jetstream.ErrNoStreamResponse) || IsNoStream(err) {
		return 0, fmt.Errorf("write record of job %s: pool %s has no stream: %w", rec.ID, rec.Pool, err)
	}
	if err != nil {
		return 0, fmt.Errorf("write record of job %s: %w", rec.ID, err)
	}
	return newRev, nil
}

// Latest returns the last version of a job's record that agrees with its
// subject, and its revision: the sequence of the job's last message, which
// a compare-and-set is against. The common case costs one direct get; when
// the last version is ignored (see find.go), the job's history is read for
// the last one that is not. ErrNotFound when the job has no version that
// agrees; the revision is then still the last message's (0: none), so that
// a dispatcher can queue the job over what is there.
func (j *Jobs) Latest(ctx context.Context, k JobKey) (*job.Record, uint64, error) {
	var data []byte
	var seq uint64
	err := Retry(ctx, func(ctx context.Context) (err error) {
		data, seq, err = j.last(ctx, k)
		return err
	}, nil)
	if err != nil {
		return nil, 0, fmt.Errorf("read job %s: %w", k.ID, err)
	}
	if data == nil {
		return nil, 0, ErrNotFound
	}
	if rec, ok := decodeVersion(data, k); ok {
		return rec, seq, nil
	}
	rec, rev, err := j.lastAgreeing(ctx, k)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return nil, 0, fmt.Errorf("read job %s: %w", k.ID, err)
	}
	return rec, rev, err
}

// Submission returns the job.SubmissionHeader of the version that queued
// job k at priority, "" when it carries none or the job has no such
// version.
func (j *Jobs) Submission(ctx context.Context, k JobKey, priority int) (string, error) {
	m, err := j.lastOn(ctx, k.Pool, j.names.PoolJob(k.Pool, KindQueued(priority), k.Tenant, k.ID))
	if err != nil {
		return "", fmt.Errorf("read the submission of job %s: %w", k.ID, err)
	}
	if m == nil {
		return "", nil
	}
	return m.Header.Get(job.SubmissionHeader), nil
}

// LastState returns the state of the last version of a job's record,
// cheaply: only the fields that name the job and its state are decoded; a
// version of kind r is final. A last version that names another job is
// ignored, as by Latest. ErrNotFound when the job has no record.
func (j *Jobs) LastState(ctx context.Context, k JobKey) (state job.State, final bool, err error) {
	m, err := j.lastOn(ctx, k.Pool, j.names.PoolJobAll(k.Pool, k.Tenant, k.ID))
	if err != nil {
		return "", false, fmt.Errorf("read the state of job %s: %w", k.ID, err)
	}
	if m == nil {
		return "", false, ErrNotFound
	}
	if c, state, err := claims(m.Data); err == nil && agrees(c, k) {
		kind, _, _ := j.names.ParsePoolJob(m.Header.Get(jetstream.SubjectHeader))
		return state, kind == KindResult || state.Final(), nil
	}
	rec, _, err := j.lastAgreeing(ctx, k)
	if err != nil {
		return "", false, fmt.Errorf("read the state of job %s: %w", k.ID, err)
	}
	return rec.State, rec.State.Final(), nil
}

// lastOn reads the last message on subject of pool's stream with a direct
// get, tried again as Retry does; nil when there is none.
func (j *Jobs) lastOn(ctx context.Context, pool, subject string) (*nats.Msg, error) {
	var m *nats.Msg
	err := Retry(ctx, func(ctx context.Context) (err error) {
		m, err = directLast(ctx, j.nc, j.names.PoolStreamV2(pool), subject)
		return err
	}, nil)
	return m, err
}

// last reads the last message on any of a job's subjects with one direct
// get; nil data when the job has none.
func (j *Jobs) last(ctx context.Context, k JobKey) ([]byte, uint64, error) {
	m, err := directLast(ctx, j.nc, j.names.PoolStreamV2(k.Pool), j.names.PoolJobAll(k.Pool, k.Tenant, k.ID))
	if err != nil || m == nil {
		return nil, 0, err
	}
	seq, _ := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
	return m.Data, seq, nil
}

// History returns every version of a job's record still in its pool's
// stream that agrees with its subject, oldest first, with their sequences
// (see find.go: the others are logged and left out).
func (j *Jobs) History(ctx context.Context, k JobKey) ([]*job.Record, []uint64, error) {
	vs, _, err := j.versions(ctx, k)
	if err != nil {
		return nil, nil, err
	}
	var out []*job.Record
	var seqs []uint64
	for _, v := range vs {
		out, seqs = append(out, v.rec), append(seqs, v.seq)
	}
	return out, seqs, nil
}

// Pools lists the pools that have a stream of jobs (contract v2).
func (j *Jobs) Pools(ctx context.Context) ([]string, error) {
	names := j.js.StreamNames(ctx, jetstream.WithStreamListSubject(j.names.prefix()+".p.>"))
	var pools []string
	prefix := j.names.PoolStreamV2("")
	for n := range names.Name() {
		if p, ok := cutPrefix(n, prefix); ok && p != "" {
			pools = append(pools, p)
		}
	}
	if err := names.Err(); err != nil {
		return pools, fmt.Errorf("list pools: %w", err)
	}
	return pools, nil
}

func cutPrefix(s, p string) (string, bool) {
	if len(s) < len(p) || s[:len(p)] != p {
		return "", false
	}
	return s[len(p):], true
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// IsNoStream reports a publish that no stream captured.
func IsNoStream(err error) bool { return errors.Is(err, jetstream.ErrNoStreamResponse) }

// Notices returns a job's heartbeat and log events that the events stream
// holds, oldest first.
func Notices(ctx context.Context, js jetstream.JetStream, n Names, k JobKey) ([]*job.Event, error) {
	var out []*job.Event
	err := readAll(ctx, js, n.EventsStream(), jetstream.ConsumerConfig{
		FilterSubjects: []string{n.JobNotices(k.Tenant, k.Pool, k.ID)}}, 256, func(m jetstream.Msg) error {
		if e, err := job.DecodeEvent(m.Data()); err == nil {
			out = append(out, e)
		}
		return nil
	})
	if err != nil {
		return out, fmt.Errorf("notices of job %s: %w", k.ID, err)
	}
	return out, nil
}
