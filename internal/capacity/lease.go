package capacity

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
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

// TenantOf names the lease's tenant as the pool's counts do: "default" for
// the default tenant.
func (l Lease) TenantOf() string { return cmp.Or(l.Tenant, job.DefaultTenant) }

// handle is the lease's handle as stored: "-" when it has none.
func (l Lease) handle() string { return cmp.Or(l.Handle, "-") }

// LeaseOp is one operation of a batch: a reservation, or the release of
// the lease of the same job and attempt.
type LeaseOp struct {
	Release bool
	Lease   Lease
	// Quota bounds what the lease's tenant holds in the pool, with this
	// lease (reservations only); nil is none.
	Quota *job.QuotaLimits
	// MaxRunning bounds the leases of the whole pool (reservations only);
	// 0 is none.
	MaxRunning int
	// Accrued is the time the lease was held since it was last counted in
	// its tenant's usage (releases only).
	Accrued time.Duration
}

// Checks reports whether the reservation needs the pool's other workers:
// a tenant's quota or the pool's bound, which only Redis counts.
func (o LeaseOp) Checks() bool {
	return !o.Release && (o.MaxRunning > 0 || (o.Quota != nil && !o.Quota.Unbounded()))
}

// Lease answers, one per reservation of a batch (see leaseScript).
const (
	LeaseOK      = "ok"      // reserved
	LeaseDup     = "dup"     // the lease was already held
	LeaseUnknown = "unknown" // the worker's totals are not in Redis yet
	// A refusal is "no:" and what is short: slots, cpu, memory or gpu of
	// the worker, quota:slots (cpu, memory, gpu) of the tenant, or
	// max_running of the pool.
	LeaseRefusedPrefix = "no:"
	// LeaseQuotaPrefix starts the refusals of a tenant's quota, and
	// LeaseMaxRunning is the refusal of the pool's bound.
	LeaseQuotaPrefix = "no:quota:"
	LeaseMaxRunning  = "no:max_running"
)

// Holding is what one tenant's leases hold: slots and resources.
type Holding struct {
	Slots, CPUMilli, MemoryBytes, GPUs int64
}

// Add returns h and o together.
func (h Holding) Add(o Holding) Holding {
	return Holding{h.Slots + o.Slots, h.CPUMilli + o.CPUMilli, h.MemoryBytes + o.MemoryBytes, h.GPUs + o.GPUs}
}

// TenantUse is what a tenant holds on the other workers of a pool, and
// its usage: its running slots integrated over time and decayed with the
// pool's half-life, in slot-milliseconds, at the time of the answer.
type TenantUse struct {
	Others Holding
	Usage  float64
}

// LeaseBatch is a batch of lease operations on one worker of a pool.
type LeaseBatch struct {
	Pool, Worker string
	// TTL is how long the worker's hashes live after the call.
	TTL time.Duration
	Ops []LeaseOp
	// Peers are the pool's other workers, as the caller knows them.
	Peers []string
	// HalfLife decays the tenants' usage. Defaults to job.DefaultHalfLife.
	HalfLife time.Duration
}

// LeaseAnswer is what Redis answers to a batch.
type LeaseAnswer struct {
	// Replies answer the reservations, in order. Nil when the batch was not
	// applied because Peers were not the pool's other workers: then Peers
	// are, and the batch may be sent again with them.
	Replies []string
	Peers   []string
	// Tenants are what the batch's tenants hold on the peers, and their
	// usage.
	Tenants map[string]TenantUse
}

// Stale reports whether the batch was not applied (see Replies).
func (a *LeaseAnswer) Stale() bool { return a.Replies == nil }

// Apply runs a batch of lease operations on a worker's hashes in one
// script call, in order.
func (s *Store) Apply(ctx context.Context, b LeaseBatch) (*LeaseAnswer, error) {
	check := false
	for _, o := range b.Ops {
		check = check || o.Checks()
	}
	keys := []string{s.slotsKey(b.Pool, b.Worker), s.tenantsKey(b.Pool, b.Worker), s.poolKey(b.Pool), s.usageKey(b.Pool)}
	keys = append(keys, s.peerKeys(b.Pool, b.Peers)...)
	args := []any{b.TTL.Milliseconds(), time.Now().UnixMilli(), cmp.Or(b.HalfLife, job.DefaultHalfLife).Milliseconds(),
		map[bool]string{true: "1", false: "0"}[check], b.Worker, len(b.Peers)}
	for _, p := range b.Peers {
		args = append(args, p)
	}
	for _, o := range b.Ops {
		l := o.Lease
		if o.Release {
			args = append(args, "-", l.field(), l.TenantOf(), o.Accrued.Milliseconds())
			continue
		}
		q := job.NoLimits
		if o.Quota != nil {
			q = *o.Quota
		}
		args = append(args, "+", l.field(), l.TenantOf(), l.CPUMilli, l.MemoryBytes, l.GPUs, l.handle(),
			q.Slots, q.CPUMilli, q.MemoryBytes, q.GPUs, o.MaxRunning)
	}
	out, err := leaseScript.Run(ctx, s.rdb, keys, args...).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("leases of %s: %w", b.Worker, err)
	}
	a := &LeaseAnswer{}
	if len(out) > 0 && out[0] == "peers" {
		a.Peers = out[1:]
		if a.Peers == nil {
			a.Peers = []string{}
		}
		return a, nil
	}
	bar := indexOf(out, "|")
	if len(out) == 0 || out[0] != "ok" || bar < 0 {
		return nil, fmt.Errorf("leases of %s: unexpected answer %q", b.Worker, out)
	}
	a.Replies, a.Peers = out[1:bar], b.Peers
	if a.Replies == nil {
		a.Replies = []string{}
	}
	a.Tenants = parseTenants(out[bar+1:])
	return a, nil
}

// ApplyLeases runs a batch of lease operations on a worker's slots hash
// with no quota and no peers, and returns the answers to the
// reservations, in order.
func (s *Store) ApplyLeases(ctx context.Context, pool, worker string, ttl time.Duration, ops []LeaseOp) ([]string, error) {
	a, err := s.Apply(ctx, LeaseBatch{Pool: pool, Worker: worker, TTL: ttl, Ops: ops})
	if err != nil {
		return nil, err
	}
	if a.Stale() {
		return nil, fmt.Errorf("leases of %s: the pool's workers changed", worker)
	}
	return a.Replies, nil
}

func (s *Store) peerKeys(pool string, peers []string) []string {
	keys := make([]string, 0, 2*len(peers))
	for _, p := range peers {
		keys = append(keys, s.slotsKey(pool, p), s.tenantsKey(pool, p))
	}
	return keys
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// parseTenants reads the scripts' six strings per tenant.
func parseTenants(v []string) map[string]TenantUse {
	out := make(map[string]TenantUse, len(v)/6)
	n := func(s string) int64 { f, _ := strconv.ParseFloat(s, 64); return int64(f) }
	for i := 0; i+5 < len(v); i += 6 {
		u, _ := strconv.ParseFloat(v[i+5], 64)
		out[v[i]] = TenantUse{Others: Holding{n(v[i+1]), n(v[i+2]), n(v[i+3]), n(v[i+4])}, Usage: u}
	}
	return out
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
	// Peers are the pool's other workers, as the worker knows them.
	Peers []string
	// Accrued is what the worker's running leases were held since the
	// last heartbeat, by tenant, to add to their usage.
	Accrued map[string]time.Duration
	// HalfLife decays the tenants' usage. Defaults to job.DefaultHalfLife.
	HalfLife time.Duration
}

// PoolView is what a heartbeat learns of its pool.
type PoolView struct {
	// Peers are the pool's other workers.
	Peers []string
	// Slots, Used, CPUMilli, MemoryBytes and GPUs are the peers' totals
	// together (CPU and memory -1 when one does not know its own).
	Slots, Used, CPUMilli, MemoryBytes, GPUs int64
	// Tenants are what the tenants hold on the peers, and their usage.
	Tenants map[string]TenantUse
}

// Beat writes a worker's heartbeat, refreshes its pool's index and
// replaces its totals and leases with b's, in one round trip, and returns
// what it learned of the pool.
func (s *Store) Beat(ctx context.Context, b Beat) (*PoolView, error) {
	hb := b.Heartbeat
	data, err := json.Marshal(hb)
	if err != nil {
		return nil, fmt.Errorf("encode heartbeat: %w", err)
	}
	id, pool := hb.WorkerID, hb.Pool
	keys := append([]string{s.slotsKey(pool, id), s.tenantsKey(pool, id), s.poolKey(pool), s.usageKey(pool)},
		s.peerKeys(pool, b.Peers)...)
	args := syncArgs(b)
	// A pipeline, not a transaction: the pools set and the pool's keys lie
	// in different slots of a Cluster. Each command stands alone.
	var sync *redis.Cmd
	cmds, _ := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, s.hbKey(pool, id), data, b.TTL)
		p.Set(ctx, s.lastKey(pool, id), data, 0)
		p.SAdd(ctx, s.poolsKey(), pool)
		sync = syncScript.EvalSha(ctx, p, keys, args...)
		return nil
	})
	for _, c := range cmds {
		if c == redis.Cmder(sync) && isNoScript(c.Err()) {
			// The server does not have the script cached: it restarted, or
			// a replica became master (scripts are not replicated to its
			// cache). EVAL runs it and caches it.
			sync = syncScript.Eval(ctx, s.rdb, keys, args...)
			if err := sync.Err(); err != nil {
				return nil, fmt.Errorf("heartbeat of %s: %w", id, err)
			}
			continue
		}
		if err := c.Err(); err != nil {
			return nil, fmt.Errorf("heartbeat of %s: %w", id, err)
		}
	}
	out, err := sync.StringSlice()
	if err != nil {
		return nil, fmt.Errorf("heartbeat of %s: %w", id, err)
	}
	return parseView(out), nil
}

func parseView(out []string) *PoolView {
	v := &PoolView{Peers: []string{}}
	bar := indexOf(out, "|")
	if bar < 0 {
		return v
	}
	v.Peers = append(v.Peers, out[:bar]...)
	rest := out[bar+1:]
	if len(rest) < 6 {
		return v
	}
	n := func(s string) int64 { f, _ := strconv.ParseFloat(s, 64); return int64(f) }
	v.Slots, v.Used, v.CPUMilli, v.MemoryBytes, v.GPUs = n(rest[0]), n(rest[1]), n(rest[2]), n(rest[3]), n(rest[4])
	v.Tenants = parseTenants(rest[6:])
	return v
}

// Remove takes a worker out of Redis: its keys and its pool's index entry
// (one DEL and one ZREM, pipelined: they share a slot).
func (s *Store) Remove(ctx context.Context, worker, pool string) error {
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, s.hbKey(pool, worker), s.lastKey(pool, worker), s.slotsKey(pool, worker), s.tenantsKey(pool, worker))
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
func syncArgs(b Beat) []any {
	t := b.Totals
	args := []any{b.LeaseTTL.Milliseconds(), t.Slots, orUnknown(t.CPUMilli), orUnknown(t.MemoryBytes), t.GPUs,
		time.Now().UnixMilli(), cmp.Or(b.HalfLife, job.DefaultHalfLife).Milliseconds(), "", len(b.Peers)}
	if b.Heartbeat != nil {
		args[7] = b.Heartbeat.WorkerID
	}
	for _, p := range b.Peers {
		args = append(args, p)
	}
	args = append(args, len(b.Leases))
	for _, l := range b.Leases {
		args = append(args, l.field(), l.TenantOf(), l.CPUMilli, l.MemoryBytes, l.GPUs, l.handle())
	}
	for t, d := range b.Accrued {
		if d > 0 {
			args = append(args, t, d.Milliseconds())
		}
	}
	return args
}

// Holds reports whether a worker of pool is alive (its heartbeat has not
// expired) and holds the lease of a job's attempt: then it still runs it.
func (s *Store) Holds(ctx context.Context, pool, worker, tenant, jobID string, attempt int) (bool, error) {
	var alive *redis.IntCmd
	var held *redis.BoolCmd
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		alive = p.Exists(ctx, s.hbKey(pool, worker))
		held = p.HExists(ctx, s.slotsKey(pool, worker), Lease{Tenant: tenant, JobID: jobID, Attempt: attempt}.field())
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("leases of %s: %w", worker, err)
	}
	return alive.Val() == 1 && held.Val(), nil
}

// Tenants reads what every tenant holds in a pool, on all its workers
// together, and its usage: the dispatcher's view, for pool show and the
// fleet_tenant_* gauges, with usage decayed with halfLife. Slots is the
// pool's workers' slots.
func (s *Store) Tenants(ctx context.Context, pool string, halfLife time.Duration) (map[string]TenantUse, int64, error) {
	ids, err := s.rdb.ZRange(ctx, s.poolKey(pool), 0, -1).Result()
	if err != nil {
		return nil, 0, fmt.Errorf("tenants of %s: %w", pool, err)
	}
	var slots []*redis.StringCmd
	var held []*redis.MapStringStringCmd
	var usage *redis.MapStringStringCmd
	_, err = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, id := range ids {
			slots = append(slots, p.HGet(ctx, s.slotsKey(pool, id), "slots"))
			held = append(held, p.HGetAll(ctx, s.tenantsKey(pool, id)))
		}
		usage = p.HGetAll(ctx, s.usageKey(pool))
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, 0, fmt.Errorf("tenants of %s: %w", pool, err)
	}
	out := map[string]TenantUse{}
	var total int64
	for i := range ids {
		if n, err := slots[i].Int64(); err == nil {
			total += n
		}
		for f, v := range held[i].Val() {
			kind, t, ok := strings.Cut(f, ":")
			if !ok {
				continue
			}
			n, _ := strconv.ParseInt(v, 10, 64)
			u := out[t]
			switch kind {
			case "n":
				u.Others.Slots += n
			case "c":
				u.Others.CPUMilli += n
			case "m":
				u.Others.MemoryBytes += n
			case "g":
				u.Others.GPUs += n
			}
			out[t] = u
		}
	}
	now := time.Now().UnixMilli()
	hl := cmp.Or(halfLife, job.DefaultHalfLife)
	for t, v := range usage.Val() {
		val, at, ok := strings.Cut(v, " ")
		if !ok {
			continue
		}
		f, _ := strconv.ParseFloat(val, 64)
		a, _ := strconv.ParseInt(at, 10, 64)
		u := out[t]
		u.Usage = Decay(f, time.Duration(now-a)*time.Millisecond, hl)
		out[t] = u
	}
	return out, total, nil
}
