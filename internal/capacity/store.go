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
//	fleet:hb:<worker>     the worker's last heartbeat (JSON), expiring after 3 intervals
//	fleet:last:<worker>   the same, without expiry, for the reaper to read after the worker died
//	fleet:slots:<worker>  hash of the worker's totals, counters and leases (see scripts.go)
//	fleet:pool:<pool>     sorted set of the pool's workers by last heartbeat (ms)
//	fleet:pools           set of pools that have had workers
package capacity

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleet-dev/fleet/job"
)

// Store is the fleet's capacity in Redis.
type Store struct {
	rdb    *redis.Client
	prefix string
}

// TLS names the files of a TLS connection to Redis: a CA bundle to trust
// (the system's when empty) and a client certificate and key.
type TLS struct {
	CA, Cert, Key string
}

// Open connects to Redis at url: redis://[user:password@]host:port/db, or
// rediss:// for TLS. It does not wait for Redis to answer: callers work on
// while it is away.
func Open(url, prefix string, tlsFiles ...TLS) (*Store, error) {
	opts, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("redis url: %w", redactErr(err, url))
	}
	if len(tlsFiles) > 0 && opts.TLSConfig != nil {
		if err := tlsFiles[0].apply(opts.TLSConfig); err != nil {
			return nil, err
		}
	}
	opts.DialTimeout = 2 * time.Second
	opts.ReadTimeout = 2 * time.Second
	opts.WriteTimeout = 2 * time.Second
	opts.MaxRetries = 1
	if prefix == "" {
		prefix = "fleet"
	}
	return &Store{rdb: redis.NewClient(opts), prefix: prefix}, nil
}

// Close closes the connections.
func (s *Store) Close() error { return s.rdb.Close() }

// Ping checks that Redis answers.
func (s *Store) Ping(ctx context.Context) error { return s.rdb.Ping(ctx).Err() }

func (s *Store) hbKey(worker string) string    { return s.prefix + ":hb:" + worker }
func (s *Store) lastKey(worker string) string  { return s.prefix + ":last:" + worker }
func (s *Store) slotsKey(worker string) string { return s.prefix + ":slots:" + worker }
func (s *Store) poolKey(pool string) string    { return s.prefix + ":pool:" + pool }
func (s *Store) poolsKey() string              { return s.prefix + ":pools" }

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
	var ids []string
	for _, p := range pools {
		members, err := s.rdb.ZRange(ctx, s.poolKey(p), 0, -1).Result()
		if err != nil {
			return nil, fmt.Errorf("list workers of %s: %w", p, err)
		}
		ids = append(ids, members...)
	}
	if len(ids) == 0 {
		return nil, nil
	}
	keys := make([]string, len(ids))
	for i, id := range ids {
		keys[i] = s.hbKey(id)
	}
	vals, err := s.rdb.MGet(ctx, keys...).Result()
	if err != nil {
		return nil, fmt.Errorf("read heartbeats: %w", err)
	}
	var out []*job.Heartbeat
	for _, v := range vals {
		str, ok := v.(string)
		if !ok {
			continue // expired: the reaper will clean its index entry
		}
		hb, err := job.DecodeHeartbeat([]byte(str))
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

// Leases reads a worker's leases as Redis holds them.
func (s *Store) Leases(ctx context.Context, worker string) ([]Lease, error) {
	m, err := s.rdb.HGetAll(ctx, s.slotsKey(worker)).Result()
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
		if _, err := fmt.Sscanf(rest[slash+1:], "%d", &l.Attempt); err != nil {
			continue
		}
		if _, err := fmt.Sscanf(v, "%d %d %d", &l.CPUMilli, &l.MemoryBytes, &l.GPUs); err != nil {
			continue
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

// Usage reads a worker's totals and counters.
func (s *Store) Usage(ctx context.Context, worker string) (Usage, error) {
	vals, err := s.rdb.HMGet(ctx, s.slotsKey(worker), "slots", "used", "cpu_used", "mem_used", "gpu_used").Result()
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
func (s *Store) LastHeartbeat(ctx context.Context, worker string) (*job.Heartbeat, error) {
	data, err := s.rdb.Get(ctx, s.lastKey(worker)).Bytes()
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

// redactErr keeps a password in a URL out of error messages: errors about
// a URL with credentials say only that it does not parse.
func redactErr(err error, url string) error {
	if !strings.Contains(url, "@") {
		return err
	}
	return errors.New("the URL does not parse (its user name and password must be URL-escaped)")
}

func (t TLS) apply(c *tls.Config) error {
	if t.CA != "" {
		pem, err := os.ReadFile(t.CA)
		if err != nil {
			return fmt.Errorf("redis CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("redis CA: no certificate in %s", t.CA)
		}
		c.RootCAs = pool
	}
	if t.Cert != "" || t.Key != "" {
		cert, err := tls.LoadX509KeyPair(t.Cert, t.Key)
		if err != nil {
			return fmt.Errorf("redis client certificate: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return nil
}
