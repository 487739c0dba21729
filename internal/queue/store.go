package queue

import (
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
	e, err := s.kv.Get(ctx, id)
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
	data, err := json.Marshal(rec)
	if err != nil {
		return 0, err
	}
	rev, err := s.kv.Create(ctx, rec.ID, data)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return 0, ErrExists
	}
	if err != nil {
		return 0, fmt.Errorf("create record of job %s: %w", rec.ID, err)
	}
	return rev, nil
}

// Update replaces a record if it is still at revision rev.
func (s *Store) Update(ctx context.Context, rec *job.Record, rev uint64) (uint64, error) {
	f, err := s.UpdateAsync(rec, rev)
	if err != nil {
		return 0, err
	}
	return s.Wait(ctx, f)
}

// UpdateAsync starts an Update without waiting for the server; pass the
// future to Wait. A rev of 0 means the key must not exist yet.
func (s *Store) UpdateAsync(rec *job.Record, rev uint64) (jetstream.PubAckFuture, error) {
	data, err := json.Marshal(rec)
	if err != nil {
		return nil, err
	}
	m := nats.NewMsg(s.names.KVSubject(rec.ID))
	m.Data = data
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev, 10))
	f, err := s.js.PublishMsgAsync(m)
	if err != nil {
		return nil, fmt.Errorf("update record of job %s: %w", rec.ID, err)
	}
	return f, nil
}

// Wait waits for an UpdateAsync and returns the new revision.
func (s *Store) Wait(ctx context.Context, f jetstream.PubAckFuture) (uint64, error) {
	select {
	case ack := <-f.Ok():
		return ack.Sequence, nil
	case err := <-f.Err():
		if IsWrongLastSequence(err) {
			return 0, ErrConflict
		}
		return 0, fmt.Errorf("update job record: %w", err)
	case <-ctx.Done():
		return 0, fmt.Errorf("update job record: %w", ctx.Err())
	}
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
