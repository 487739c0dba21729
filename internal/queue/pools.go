package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/job"
)

// ReadPool returns what the pools bucket holds about pool: a state that is
// not paused when it holds nothing.
func ReadPool(ctx context.Context, kv jetstream.KeyValue, pool string) (*job.PoolState, error) {
	s, _, err := ReadPoolAt(ctx, kv, pool)
	return s, err
}

// ReadPoolAt is ReadPool with the revision of the entry read (0 when the
// bucket holds nothing about pool).
func ReadPoolAt(ctx context.Context, kv jetstream.KeyValue, pool string) (*job.PoolState, uint64, error) {
	e, err := kv.Get(ctx, pool)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return &job.PoolState{Pool: pool}, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("read pool %s: %w", pool, err)
	}
	var s job.PoolState
	if err := json.Unmarshal(e.Value(), &s); err != nil {
		return nil, 0, fmt.Errorf("read pool %s: %w", pool, err)
	}
	s.Pool = pool
	return &s, e.Revision(), nil
}

// UpdatePool changes a pool's state with change, as a compare-and-set on
// the entry it read, trying again until ctx ends when another writer came
// between; it returns the state written and its revision.
func UpdatePool(ctx context.Context, kv jetstream.KeyValue, pool string, change func(*job.PoolState) error) (*job.PoolState, uint64, error) {
	for try := 0; ; try++ {
		var rev uint64
		s := &job.PoolState{Pool: pool}
		e, err := kv.Get(ctx, pool)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return nil, 0, fmt.Errorf("read pool %s: %w", pool, err)
		default:
			rev = e.Revision()
			if err := json.Unmarshal(e.Value(), s); err != nil {
				return nil, 0, fmt.Errorf("read pool %s: %w", pool, err)
			}
			s.Pool = pool
		}
		if err := change(s); err != nil {
			return nil, 0, err
		}
		s.Tenants, s.Slots = nil, 0 // never stored
		data, err := json.Marshal(s)
		if err != nil {
			return nil, 0, fmt.Errorf("write pool %s: %w", pool, err)
		}
		var written uint64
		if rev == 0 {
			written, err = kv.Create(ctx, pool, data)
		} else {
			written, err = kv.Update(ctx, pool, data, rev)
		}
		if err == nil {
			return s, written, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !IsWrongLastSequence(err) {
			return nil, 0, fmt.Errorf("write pool %s: %w", pool, err)
		}
		// Another writer came between, or the entry was read from a
		// replica still catching up (a server just back): read again.
		select {
		case <-time.After(min(20*time.Millisecond<<min(try, 5), 500*time.Millisecond)):
		case <-ctx.Done():
			return nil, 0, fmt.Errorf("write pool %s: %w", pool, err)
		}
	}
}
