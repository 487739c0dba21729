package console

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"
)

// snapshotEvery is how long a read through the dispatcher is shown before
// the next page or update reads again.
const snapshotEvery = time.Second

// snapshot is the last read of something the dispatcher answers (the
// schedules, the pools), shared by every page: read at most once every
// snapshotEvery whatever the number of open pages, with a version that
// moves when what was read changed.
type snapshot[T any] struct {
	what string // "the schedules", in errors
	read func(ctx context.Context) (T, error)

	mu      sync.Mutex // held while reading: one read at a time
	val     T
	at      time.Time
	err     error
	raw     []byte // what was read, to tell a change
	version uint64
}

// get returns what was last read, reading again when that read is older
// than snapshotEvery; the error is the last read's.
func (s *snapshot[T]) get(ctx context.Context) (T, time.Time, uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.read == nil {
		var zero T
		return zero, time.Time{}, 0, nil
	}
	if !s.at.IsZero() && time.Since(s.at) < snapshotEvery {
		return s.val, s.at, s.version, s.err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	val, err := s.read(ctx)
	s.at = time.Now()
	if err != nil {
		if s.err == nil {
			s.version++
		}
		s.err = fmt.Errorf("read %s: %w", s.what, err)
		return s.val, s.at, s.version, s.err
	}
	raw, _ := json.Marshal(val)
	if s.err != nil || !bytes.Equal(raw, s.raw) {
		s.version++
	}
	s.val, s.raw, s.err = val, raw, nil
	return s.val, s.at, s.version, nil
}

// changed is the version, read again if old, for the stream.
func (s *snapshot[T]) changed() uint64 {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _, v, _ := s.get(ctx)
	return v
}

// forget makes the next get read again, so that the page an action leads
// to shows what it did.
func (s *snapshot[T]) forget() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.at = time.Time{}
}
