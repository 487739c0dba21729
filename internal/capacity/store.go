// Package capacity is the fleet's capacity model in Redis, shared by both
// sides: every worker's heartbeat (its capacity-heartbeat document, with a
// TTL of three intervals), an index of the live workers of each pool, and
// each worker's slot leases, reserved and released atomically by Lua
// scripts. A worker that stops heartbeating loses its leases when their key
// expires; its jobs come back through JetStream redelivery.
//
// The worker's side (local accounting, batched leases, the heartbeat) is
// the package ledger; the dispatcher's (admission, the reaper, the
// overview) is the package monitor. This package knows neither.
//
// Keys, for the prefix "fleet":
//
//	fleet:{p:<pool>}:w:<worker>:hb       the worker's last heartbeat (JSON), expiring after 3 intervals
//	fleet:{p:<pool>}:w:<worker>:last     the same, without expiry, for the reaper to read after the worker died
//	fleet:{p:<pool>}:w:<worker>:slots    hash of the worker's totals, counters and leases (see scripts.go)
//	fleet:{p:<pool>}:w:<worker>:tenants  hash of what the worker's leases hold, by tenant
//	fleet:{p:<pool>}:workers             sorted set of the pool's workers by last heartbeat (ms)
//	fleet:{p:<pool>}:usage               hash of the tenants' running slots integrated over time, decayed
//	fleet:pools                          set of pools that have had workers
//
// The braces are a Redis Cluster hash tag: every key of a pool, its
// workers' included, hashes to one slot, so that one script can hold a
// worker's lease and check it against what the tenant runs on every worker
// of the pool (its quota), atomically, on a Cluster too. No command and no
// script touches the keys of two pools at once; what reads many pools
// pipelines one command per key. A pool's traffic is one slot's: pools
// spread over a Cluster's masters, a pool does not.
package capacity

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric"

	"github.com/fleet-dev/fleet/job"
)

// DefaultHeartbeatInterval is the time between a worker's heartbeats: it
// is forgotten after three missed, and its leases two intervals later.
const DefaultHeartbeatInterval = 3 * time.Second

// Store is the fleet's capacity in Redis: one server, a Sentinel-managed
// master, or a Cluster (see Open).
type Store struct {
	rdb     redis.UniversalClient
	prefix  string
	breaker *Breaker
	gauge   metric.Registration
}

// Close stops the Breaker's probe and closes the connections.
func (s *Store) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.breaker.stop(ctx)
	if s.gauge != nil {
		_ = s.gauge.Unregister()
	}
	return s.rdb.Close()
}

// Breaker is the Store's breaker: whether calls go to Redis now.
func (s *Store) Breaker() *Breaker { return s.breaker }

// Up reports whether calls go to Redis (the Breaker is closed).
func (s *Store) Up() bool { return s.breaker.Up() }

// Ping checks that Redis answers.
func (s *Store) Ping(ctx context.Context) error { return s.rdb.Ping(ctx).Err() }

// poolTag is the start of a pool's keys, their hash tag included.
func (s *Store) poolTag(pool string) string { return s.prefix + ":{p:" + pool + "}" }

// workerKey is the start of a worker's keys.
func (s *Store) workerKey(pool, worker string) string  { return s.poolTag(pool) + ":w:" + worker }
func (s *Store) hbKey(pool, worker string) string      { return s.workerKey(pool, worker) + ":hb" }
func (s *Store) lastKey(pool, worker string) string    { return s.workerKey(pool, worker) + ":last" }
func (s *Store) slotsKey(pool, worker string) string   { return s.workerKey(pool, worker) + ":slots" }
func (s *Store) tenantsKey(pool, worker string) string { return s.workerKey(pool, worker) + ":tenants" }
func (s *Store) poolKey(pool string) string            { return s.poolTag(pool) + ":workers" }
func (s *Store) usageKey(pool string) string           { return s.poolTag(pool) + ":usage" }
func (s *Store) poolsKey() string                      { return s.prefix + ":pools" }

// Pools lists the pools that have had workers.
func (s *Store) Pools(ctx context.Context) ([]string, error) {
	pools, err := s.rdb.SMembers(ctx, s.poolsKey()).Result()
	if err != nil {
		return nil, fmt.Errorf("list pools: %w", err)
	}
	sort.Strings(pools)
	return pools, nil
}

// Workers returns the heartbeats of the live workers of pool, or of every
// pool when pool is empty, sorted by pool and id. A worker is live while
// its heartbeat has not expired.
func (s *Store) Workers(ctx context.Context, pool string) ([]*job.Heartbeat, error) {
	pools := []string{pool}
	if pool == "" {
		var err error
		if pools, err = s.Pools(ctx); err != nil {
			return nil, err
		}
	}
	type member struct{ pool, id string }
	var ids []member
	for _, p := range pools {
		members, err := s.rdb.ZRange(ctx, s.poolKey(p), 0, -1).Result()
		if err != nil {
			return nil, fmt.Errorf("list workers of %s: %w", p, err)
		}
		for _, id := range members {
			ids = append(ids, member{p, id})
		}
	}
	if len(ids) == 0 {
		return nil, nil
	}
	// One GET per worker, pipelined: the pools' keys lie in different
	// slots of a Cluster, where an MGET of them would fail.
	gets := make([]*redis.StringCmd, len(ids))
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, m := range ids {
			gets[i] = p.Get(ctx, s.hbKey(m.pool, m.id))
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("read heartbeats: %w", err)
	}
	var out []*job.Heartbeat
	for _, g := range gets {
		data, err := g.Bytes()
		if errors.Is(err, redis.Nil) {
			continue // expired: the reaper will clean its index entry
		}
		if err != nil {
			return nil, fmt.Errorf("read heartbeats: %w", err)
		}
		hb, err := job.DecodeHeartbeat(data)
		if err != nil {
			continue // not ours to trust
		}
		out = append(out, hb)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Pool != out[j].Pool {
			return out[i].Pool < out[j].Pool
		}
		return out[i].WorkerID < out[j].WorkerID
	})
	return out, nil
}

// Leases reads the leases of a worker of pool as Redis holds them.
func (s *Store) Leases(ctx context.Context, pool, worker string) ([]Lease, error) {
	m, err := s.rdb.HGetAll(ctx, s.slotsKey(pool, worker)).Result()
	if err != nil {
		return nil, fmt.Errorf("read leases of %s: %w", worker, err)
	}
	var out []Lease
	for k, v := range m {
		rest, ok := strings.CutPrefix(k, "l:")
		if !ok {
			continue
		}
		var l Lease
		slash := strings.LastIndexByte(rest, '/')
		if slash < 0 {
			continue
		}
		l.JobID = rest[:slash]
		if t, id, ok := strings.Cut(l.JobID, "/"); ok {
			l.Tenant, l.JobID = t, id
		}
		if _, err := fmt.Sscanf(rest[slash+1:], "%d", &l.Attempt); err != nil {
			continue
		}
		if _, err := fmt.Sscanf(v, "%d %d %d", &l.CPUMilli, &l.MemoryBytes, &l.GPUs); err != nil {
			continue
		}
		if f := strings.Fields(v); len(f) > 3 && f[3] != "-" {
			l.Handle = f[3]
		}
		out = append(out, l)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].JobID < out[j].JobID })
	return out, nil
}

// Usage is what Redis counts as used on a worker.
type Usage struct {
	Slots, SlotsUsed int
	CPUUsed, MemUsed int64
	GPUsUsed         int
}

// Usage reads the totals and counters of a worker of pool.
func (s *Store) Usage(ctx context.Context, pool, worker string) (Usage, error) {
	vals, err := s.rdb.HMGet(ctx, s.slotsKey(pool, worker), "slots", "used", "cpu_used", "mem_used", "gpu_used").Result()
	if err != nil {
		return Usage{}, fmt.Errorf("read usage of %s: %w", worker, err)
	}
	n := func(i int) int64 {
		var v int64
		if s, ok := vals[i].(string); ok {
			_, _ = fmt.Sscanf(s, "%d", &v)
		}
		return v
	}
	return Usage{Slots: int(n(0)), SlotsUsed: int(n(1)), CPUUsed: n(2), MemUsed: n(3), GPUsUsed: int(n(4))}, nil
}

// LastHeartbeat reads what a worker last reported, which outlives its
// heartbeat: the reaper reads it after the worker died. Nil when there is
// none.
func (s *Store) LastHeartbeat(ctx context.Context, pool, worker string) (*job.Heartbeat, error) {
	data, err := s.rdb.Get(ctx, s.lastKey(pool, worker)).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the last heartbeat of %s: %w", worker, err)
	}
	var hb job.Heartbeat
	if err := json.Unmarshal(data, &hb); err != nil {
		return nil, fmt.Errorf("decode the last heartbeat of %s: %w", worker, err)
	}
	return &hb, nil
}
