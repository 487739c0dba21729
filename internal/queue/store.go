package queue

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/job"
)

// Errors of the job store.
var (
	ErrNotFound = errors.New("job not found")
	ErrExists   = errors.New("job already exists")
	// ErrConflict means the record changed since it was read.
	ErrConflict = errors.New("job record changed concurrently")
	// ErrFinal means the stream refused a final version because the job
	// has one already, whatever revision the write named.
	ErrFinal = errors.New("the job has a final version already")
)

// Store keeps the latest job.Record of each job in the jobs bucket. Writes
// are compare-and-set on the key's revision, so a cancel and a worker's
// progress never silently overwrite each other.
type Store struct {
	js    jetstream.JetStream
	kv    jetstream.KeyValue
	names Names
}

// NewStore binds to the jobs bucket. It waits, logging why to log, while the
// bucket does not exist yet (a dispatcher creates it, see Setup) or the
// cluster elects its leaders.
func NewStore(ctx context.Context, js jetstream.JetStream, names Names, log *slog.Logger) (*Store, error) {
	kv, err := OpenBucket(ctx, js, names.Bucket(), log)
	if err != nil {
		return nil, err
	}
	return &Store{js: js, kv: kv, names: names}, nil
}

// Get returns a job's record and its revision.
func (s *Store) Get(ctx context.Context, id string) (*job.Record, uint64, error) {
	var e jetstream.KeyValueEntry
	err := Retry(ctx, func(ctx context.Context) (err error) {
		e, err = s.kv.Get(ctx, id)
		return err
	}, nil)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return nil, 0, ErrNotFound
	}
	if err != nil {
		return nil, 0, fmt.Errorf("get job %s: %w", id, err)
	}
	var rec job.Record
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return nil, 0, fmt.Errorf("decode record of job %s: %w", id, err)
	}
	return &rec, e.Revision(), nil
}

// Create stores the first record of a job; ErrExists if it has one.
func (s *Store) Create(ctx context.Context, rec *job.Record) (uint64, error) {
	return s.write(ctx, rec, 0, ErrExists)
}

// Update replaces a record if it is still at revision rev; ErrConflict if
// it is not.
func (s *Store) Update(ctx context.Context, rec *job.Record, rev uint64) (uint64, error) {
	return s.write(ctx, rec, rev, ErrConflict)
}

// write stores rec with compare-and-set against revision rev (0: the key
// must not exist), and returns the new revision. A write whose answer was
// lost (see Ambiguous) is sent again; if the second try finds the record
// changed, the change may be the first try's own: the stored value is read
// back, and if it is exactly what was written, the write succeeded.
func (s *Store) write(ctx context.Context, rec *job.Record, rev uint64, refused error) (uint64, error) {
	data, err := json.Marshal(rec)
	if err != nil {
		return 0, fmt.Errorf("encode record of job %s: %w", rec.ID, err)
	}
	var newRev uint64
	ambiguous := false
	err = Retry(ctx, func(ctx context.Context) error {
		m := nats.NewMsg(s.names.KVSubject(rec.ID))
		m.Data = data
		m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev, 10))
		ack, err := s.js.PublishMsg(ctx, m)
		if err == nil {
			newRev = ack.Sequence
		}
		ambiguous = ambiguous || Ambiguous(err)
		return err
	}, nil)
	if IsWrongLastSequence(err) {
		if ambiguous {
			if e, gerr := s.kv.Get(ctx, rec.ID); gerr == nil && bytes.Equal(e.Value(), data) {
				return e.Revision(), nil
			}
		}
		return 0, refused
	}
	if err != nil {
		return 0, fmt.Errorf("write record of job %s: %w", rec.ID, err)
	}
	return newRev, nil
}

// IsWrongLastSequence reports a failed compare-and-set.
func IsWrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
	}
	return false
}
