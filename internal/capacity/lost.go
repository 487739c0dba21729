package capacity

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// LostWorker is a worker the reaper found dead: when, what it last
// reported, and the jobs it held.
type LostWorker struct {
	WorkerID string    `json:"worker_id"`
	Pool     string    `json:"pool"`
	Backend  string    `json:"backend,omitempty"`
	Version  string    `json:"version,omitempty"`
	LostAt   time.Time `json:"lost_at"`
	LastSeen time.Time `json:"last_seen,omitzero"`
	Jobs     []Held    `json:"jobs,omitempty"`
}

// Held is one attempt a lost worker held.
type Held struct {
	JobID   string `json:"job_id"`
	Attempt int    `json:"attempt"`
}

// Bounds of the lost-workers record: the newest MaxLost, none older than
// LostFor.
const (
	MaxLost = 200
	LostFor = 24 * time.Hour
)

// lostKey is a sorted set of lost workers (JSON) by the time they were
// found lost (ms). One key: on a Cluster it lives in one slot.
func (s *Store) lostKey() string { return s.prefix + ":lost" }

// RecordLost adds a lost worker to the shared record, and trims it by age
// and count, in one round trip.
func (s *Store) RecordLost(ctx context.Context, w LostWorker) error {
	data, err := json.Marshal(w)
	if err != nil {
		return fmt.Errorf("encode lost worker %s: %w", w.WorkerID, err)
	}
	key := s.lostKey()
	_, err = s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.ZAdd(ctx, key, redis.Z{Score: float64(w.LostAt.UnixMilli()), Member: data})
		p.ZRemRangeByScore(ctx, key, "-inf", "("+strconv.FormatInt(w.LostAt.Add(-LostFor).UnixMilli(), 10))
		p.ZRemRangeByRank(ctx, key, 0, -MaxLost-1)
		p.Expire(ctx, key, LostFor)
		return nil
	})
	if err != nil {
		return fmt.Errorf("record lost worker %s: %w", w.WorkerID, err)
	}
	return nil
}

// Lost lists the workers lost in the last LostFor, newest first, at most
// limit of them (all kept when limit <= 0).
func (s *Store) Lost(ctx context.Context, limit int) ([]LostWorker, error) {
	since := strconv.FormatInt(time.Now().Add(-LostFor).UnixMilli(), 10)
	opt := &redis.ZRangeBy{Min: since, Max: "+inf"}
	if limit > 0 {
		opt.Count = int64(limit)
	}
	members, err := s.rdb.ZRevRangeByScore(ctx, s.lostKey(), opt).Result()
	if err != nil {
		return nil, fmt.Errorf("list lost workers: %w", err)
	}
	out := make([]LostWorker, 0, len(members))
	for _, m := range members {
		var w LostWorker
		if json.Unmarshal([]byte(m), &w) == nil {
			out = append(out, w)
		}
	}
	return out, nil
}
