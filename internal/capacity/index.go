package capacity

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Stale lists the workers of pool whose last heartbeat in the pool's index
// is older than before.
func (s *Store) Stale(ctx context.Context, pool string, before time.Time) ([]string, error) {
	until := strconv.FormatInt(before.UnixMilli(), 10)
	ids, err := s.rdb.ZRangeByScore(ctx, s.poolKey(pool), &redis.ZRangeBy{Min: "-inf", Max: until}).Result()
	if err != nil {
		return nil, fmt.Errorf("list workers of %s: %w", pool, err)
	}
	return ids, nil
}

// Alive reports whether the heartbeat of a worker of pool has not expired.
func (s *Store) Alive(ctx context.Context, pool, worker string) (bool, error) {
	n, err := s.rdb.Exists(ctx, s.hbKey(pool, worker)).Result()
	if err != nil {
		return false, fmt.Errorf("heartbeat of %s: %w", worker, err)
	}
	return n == 1, nil
}

// Unindex removes a worker from its pool's index. It reports whether this
// call removed it: of several callers, exactly one gets true.
func (s *Store) Unindex(ctx context.Context, pool, worker string) (bool, error) {
	n, err := s.rdb.ZRem(ctx, s.poolKey(pool), worker).Result()
	if err != nil {
		return false, fmt.Errorf("remove %s from %s: %w", worker, pool, err)
	}
	return n == 1, nil
}

// Forget removes what a dead worker of pool left: its last heartbeat, its
// leases and its tenants' counts (one DEL: they share a slot), so that its
// tenants' quotas count them no more.
func (s *Store) Forget(ctx context.Context, pool, worker string) error {
	if err := s.rdb.Del(ctx, s.lastKey(pool, worker), s.slotsKey(pool, worker), s.tenantsKey(pool, worker)).Err(); err != nil {
		return fmt.Errorf("forget %s: %w", worker, err)
	}
	return nil
}
