package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/job"
)

// ReadPool returns what the pools bucket holds about pool: a state that is
// not paused when it holds nothing.
func ReadPool(ctx context.Context, kv jetstream.KeyValue, pool string) (*job.PoolState, error) {
	e, err := kv.Get(ctx, pool)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return &job.PoolState{Pool: pool}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read pool %s: %w", pool, err)
	}
	var s job.PoolState
	if err := json.Unmarshal(e.Value(), &s); err != nil {
		return nil, fmt.Errorf("read pool %s: %w", pool, err)
	}
	s.Pool = pool
	return &s, nil
}

// WritePool stores a pool's state.
func WritePool(ctx context.Context, kv jetstream.KeyValue, s *job.PoolState) error {
	data, err := json.Marshal(s)
	if err != nil {
		return fmt.Errorf("write pool %s: %w", s.Pool, err)
	}
	if _, err := kv.Put(ctx, s.Pool, data); err != nil {
		return fmt.Errorf("write pool %s: %w", s.Pool, err)
	}
	return nil
}
