package capacity

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleet-dev/fleet/job"
)

// Lease is one attempt's hold on a worker's capacity.
type Lease struct {
	// Tenant owns the job (contract v2); empty for the default tenant.
	Tenant      string    `json:"tenant,omitempty"`
	JobID       string    `json:"job_id"`
	Attempt     int       `json:"attempt"`
	CPUMilli    int64     `json:"cpu_milli"`
	MemoryBytes int64     `json:"memory_bytes"`
	GPUs        int       `json:"gpus"`
	StartedAt   time.Time `json:"started_at"`
	// Handle is the ack subject of the job message the attempt runs: a nak
	// through it gives the job back to its pool at once.
	Handle string `json:"-"`
}

// field names the lease in the worker's slots hash.
//
//	l:<job>/<attempt>           a default-tenant job's
//	l:<tenant>/<job>/<attempt>  another tenant's
func (l Lease) field() string {
	if l.Tenant == "" || l.Tenant == job.DefaultTenant {
		return fmt.Sprintf("l:%s/%d", l.JobID, l.Attempt)
	}
	return fmt.Sprintf("l:%s/%s/%d", l.Tenant, l.JobID, l.Attempt)
}

// handle is the lease's handle as stored: "-" when it has none.
func (l Lease) handle() string { return cmp.Or(l.Handle, "-") }

// LeaseOp is one operation of a batch: a reservation, or the release of
// the lease of the same job and attempt.
type LeaseOp struct {
	Release bool
	Lease   Lease
}

// Lease answers, one per reservation of a batch (see leaseScript).
const (
	LeaseOK      = "ok"      // reserved
	LeaseDup     = "dup"     // the lease was already held
	LeaseUnknown = "unknown" // the worker's totals are not in Redis yet
	// A refusal is "no:" and what is short: slots, cpu, memory or gpu.
	LeaseRefusedPrefix = "no:"
)

// ApplyLeases runs a batch of lease operations on a worker's slots hash in
// one script call, in order, and returns the answers to the reservations,
// in order. The hash lives for ttl after the call.
func (s *Store) ApplyLeases(ctx context.Context, worker string, ttl time.Duration, ops []LeaseOp) ([]string, error) {
	args := []any{ttl.Milliseconds()}
	for _, o := range ops {
		if o.Release {
			args = append(args, "-", o.Lease.field())
		} else {
			args = append(args, "+", o.Lease.field(), o.Lease.CPUMilli, o.Lease.MemoryBytes, o.Lease.GPUs, o.Lease.handle())
		}
	}
	replies, err := leaseScript.Run(ctx, s.rdb, []string{s.slotsKey(worker)}, args...).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("leases of %s: %w", worker, err)
	}
	return replies, nil
}

// Totals are what a worker may hand out. Nil CPU or memory is unknown:
// then only slots limit the worker.
type Totals struct {
	Slots       int
	CPUMilli    *int64
	MemoryBytes *int64
	GPUs        int
}

// Beat is one heartbeat of a worker.
type Beat struct {
	Heartbeat *job.Heartbeat
	// TTL is how long the heartbeat lives; LeaseTTL how long the slots hash
	// does.
	TTL, LeaseTTL time.Duration
	// Totals and Leases replace what Redis holds for the worker.
	Totals Totals
	Leases []Lease
}

// Beat writes a worker's heartbeat, refreshes its pool's index and
// replaces its totals and leases with b's, in one round trip.
func (s *Store) Beat(ctx context.Context, b Beat) error {
	hb := b.Heartbeat
	data, err := json.Marshal(hb)
	if err != nil {
		return fmt.Errorf("encode heartbeat: %w", err)
	}
	id := hb.WorkerID
	keys := []string{s.slotsKey(id)}
	args := syncArgs(b.LeaseTTL, b.Totals, b.Leases)
	// A pipeline, not a transaction: the pool's keys and the worker's lie
	// in different slots of a Cluster. Each command stands alone.
	var sync *redis.Cmd
	cmds, _ := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, s.hbKey(id), data, b.TTL)
		p.Set(ctx, s.lastKey(id), data, 0)
		p.ZAdd(ctx, s.poolKey(hb.Pool), redis.Z{Score: float64(time.Now().UnixMilli()), Member: id})
		p.SAdd(ctx, s.poolsKey(), hb.Pool)
		sync = syncScript.EvalSha(ctx, p, keys, args...)
		return nil
	})
	for _, c := range cmds {
		if c == redis.Cmder(sync) && isNoScript(c.Err()) {
			// The server does not have the script cached: it restarted, or
			// a replica became master (scripts are not replicated to its
			// cache). EVAL runs it and caches it.
			if err := syncScript.Eval(ctx, s.rdb, keys, args...).Err(); err != nil {
				return fmt.Errorf("heartbeat of %s: %w", id, err)
			}
			continue
		}
		if err := c.Err(); err != nil {
			return fmt.Errorf("heartbeat of %s: %w", id, err)
		}
	}
	return nil
}

// Remove takes a worker out of Redis: its keys (one DEL: they share a
// slot) and its pool's index entry, pipelined.
func (s *Store) Remove(ctx context.Context, worker, pool string) error {
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, s.hbKey(worker), s.lastKey(worker), s.slotsKey(worker))
		p.ZRem(ctx, s.poolKey(pool), worker)
		return nil
	})
	if err != nil {
		return fmt.Errorf("remove %s: %w", worker, err)
	}
	return nil
}

func isNoScript(err error) bool { return redis.HasErrorPrefix(err, "NOSCRIPT") }

func orUnknown(v *int64) string {
	if v == nil {
		return "-1"
	}
	return strconv.FormatInt(*v, 10)
}

// syncArgs are syncScript's ARGV.
func syncArgs(ttl time.Duration, t Totals, leases []Lease) []any {
	args := []any{ttl.Milliseconds(), t.Slots, orUnknown(t.CPUMilli), orUnknown(t.MemoryBytes), t.GPUs}
	for _, l := range leases {
		args = append(args, l.field(), l.CPUMilli, l.MemoryBytes, l.GPUs, l.handle())
	}
	return args
}

// Holds reports whether worker is alive (its heartbeat has not expired) and
// holds the lease of a job's attempt: then it still runs it.
func (s *Store) Holds(ctx context.Context, worker, tenant, jobID string, attempt int) (bool, error) {
	var alive *redis.IntCmd
	var held *redis.BoolCmd
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		alive = p.Exists(ctx, s.hbKey(worker))
		held = p.HExists(ctx, s.slotsKey(worker), Lease{Tenant: tenant, JobID: jobID, Attempt: attempt}.field())
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("leases of %s: %w", worker, err)
	}
	return alive.Val() == 1 && held.Val(), nil
}
