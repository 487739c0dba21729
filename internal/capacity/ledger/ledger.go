// Package ledger is a worker's side of the fleet's capacity: it counts
// what the worker's attempts hold, reserves and releases their slot leases
// in Redis in batches, and writes the worker's heartbeat. Local accounting
// is the first check and goes on alone while Redis is away: once a call
// has found Redis away, the Store's Breaker is open and the ledger does not
// wait on Redis at all until a probe gets an answer; then it heartbeats at
// once, which replaces the leases in Redis with what runs.
package ledger

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/fleet-dev/fleet/internal/capacity"
	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/hostinfo"
	"github.com/fleet-dev/fleet/internal/lifecycle"
	"github.com/fleet-dev/fleet/internal/telemetry"
	"github.com/fleet-dev/fleet/job"
)

// Config configures a worker's Ledger.
type Config struct {
	WorkerID, Pool, Version string
	// Backend names the executor: process, docker, kubernetes or noop.
	Backend string
	Labels  map[string]string
	// Slots is the worker's slot count.
	Slots int
	// CPUMilli, MemoryBytes and GPUs are the worker's totals. Nil CPU or
	// memory are taken from the backend when it knows them, else unknown:
	// then only slots limit the worker.
	CPUMilli, MemoryBytes *int64
	GPUs                  int
	// Platform reports what the executor's platform holds (a Docker host, a
	// namespace's quota). Optional. When it is also an
	// executor.InventoryReader, the heartbeat carries its inventory.
	Platform executor.CapacityReader
	// Usage reads what running attempts use, for the heartbeat. Defaults to
	// a sampler of Platform when it is an executor.UsageReader.
	Usage *executor.UsageSampler
	// Draining reports whether the worker is shutting down.
	Draining func() bool
	// Interval between heartbeats. Defaults to 3 seconds; the heartbeat and
	// the leases expire after three intervals.
	Interval time.Duration
	Logger   *slog.Logger
}

// Ledger is a worker's side of capacity: it reserves and releases slot
// leases, batching them into one Redis round trip, and writes the
// heartbeat. Local accounting is the first check and goes on alone while
// Redis is away; each heartbeat replaces the leases in Redis with the
// local truth, which reconciles them after an outage.
//
// It implements capacity.Capacity, Holder, Peers and Room.
type Ledger struct {
	s   *capacity.Store
	cfg Config
	log *slog.Logger

	mu     sync.Mutex
	leases map[key]capacity.Lease
	// asking holds the leases Redis is asked to check (a quota or the
	// pool's bound) and has not yet answered: counted here, but not
	// written by a heartbeat, which would put them in Redis unchecked.
	asking map[key]bool
	// accrued is, per lease, until when its run time was counted in its
	// tenant's usage.
	accrued map[key]time.Time
	cpuUsed int64
	memUsed int64
	gpuUsed int
	totals  capacity.Totals
	backend *executor.Capacity
	usage   map[executor.AttemptID]*job.Usage
	inv     *job.Inventory
	ops     []op
	wake    chan struct{}
	// sending is held while a batch or a heartbeat goes to Redis, so that
	// they reach it in the order they were taken: by the loop, or by a
	// reservation that finds nothing being sent and sends its batch itself
	// (see Reserve).
	sending sync.Mutex
	// outage: a call found Redis away, and no heartbeat has reconciled the
	// leases since; lease batches are not sent meanwhile.
	outage      bool
	outageSince time.Time
	// beatNow asks the loop for a heartbeat at its next wake: Redis
	// answers again.
	beatNow bool
	stopUp  func()

	run   lifecycle.Runner
	calls metric.Int64Counter
	// wait is the time attempts spent waiting on Redis, by operation.
	wait metric.Float64Histogram

	// peers caches the images the pool's other workers report, for one
	// interval.
	peersMu sync.Mutex
	peers   map[string]bool
	peersAt time.Time

	// share is what the ledger knows of the pool's tenants (see share.go).
	share share
}

// key names a lease in the ledger: one per attempt.
type key struct {
	tenant, job string
	attempt     int
}

func keyOf(l capacity.Lease) key { return key{l.Tenant, l.JobID, l.Attempt} }

type op struct {
	capacity.LeaseOp
	// reply gets a reservation's answer from Redis; nil for a release, and
	// for a reservation that nothing in Redis can refuse, which was
	// answered at once (see Reserve).
	reply chan error
}

func (o op) answer(err error) {
	if o.reply != nil {
		o.reply <- err
	}
}

var (
	_ capacity.Peers    = (*Ledger)(nil)
	_ capacity.Capacity = (*Ledger)(nil)
	_ capacity.Holder   = (*Ledger)(nil)
	_ capacity.Room     = (*Ledger)(nil)
	_ capacity.Sharer   = (*Ledger)(nil)
)

// New returns a Ledger; Start starts its heartbeat.
func New(s *capacity.Store, cfg Config) *Ledger {
	if cfg.Interval <= 0 {
		cfg.Interval = capacity.DefaultHeartbeatInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Draining == nil {
		cfg.Draining = func() bool { return false }
	}
	if r, ok := cfg.Platform.(executor.UsageReader); ok && cfg.Usage == nil {
		cfg.Usage = executor.NewUsageSampler(r, cfg.Interval/2)
	}
	calls, _ := telemetry.Meter().Int64Counter("fleet.capacity.redis.calls",
		metric.WithDescription("Round trips to Redis for leases and heartbeats"))
	return &Ledger{
		s: s, cfg: cfg, log: cfg.Logger.With("component", "capacity"), calls: calls, wait: capacity.WaitHistogram(),
		leases: map[key]capacity.Lease{}, asking: map[key]bool{}, accrued: map[key]time.Time{},
		totals: capacity.Totals{Slots: cfg.Slots, CPUMilli: cfg.CPUMilli, MemoryBytes: cfg.MemoryBytes, GPUs: cfg.GPUs},
		wake:   make(chan struct{}, 1),
	}
}

var (
	opReserve = metric.WithAttributeSet(attribute.NewSet(attribute.String("op", "reserve")))
	opHolds   = metric.WithAttributeSet(attribute.NewSet(attribute.String("op", "holds")))
	opPeers   = metric.WithAttributeSet(attribute.NewSet(attribute.String("op", "peers")))
)

// CallTimeout bounds a lease batch and a heartbeat. Redis answers either
// in well under a millisecond; one that does not answer in time counts as
// away (the Store's Breaker opens), which costs the reservations waiting
// on that call this long, once: a Redis that hangs rather than refuses.
const CallTimeout = 500 * time.Millisecond

// ttl is how long the heartbeat lives: three intervals.
func (r *Ledger) ttl() time.Duration { return 3 * r.cfg.Interval }

// leaseTTL is how long the leases live: two intervals longer, so that the
// reaper, which runs every interval, can read what a dead worker held after
// its heartbeat is gone. A dead worker is out of every capacity view as
// soon as its heartbeat expires.
func (r *Ledger) leaseTTL() time.Duration { return 5 * r.cfg.Interval }

// Start writes the first heartbeat (or notes that Redis is away) and
// starts the loop that batches leases and repeats the heartbeat.
func (r *Ledger) Start(ctx context.Context) error {
	r.refreshBackend(ctx)
	r.sending.Lock()
	r.heartbeat(ctx)
	r.sending.Unlock()
	// When Redis answers again, the next heartbeat comes at once.
	r.stopUp = r.s.Breaker().OnUp(func() {
		r.mu.Lock()
		r.beatNow = true
		r.mu.Unlock()
		r.poke()
	})
	return r.run.Go(ctx, r.loop)
}

// Stop stops the heartbeat and removes the worker from Redis: a worker that
// leaves cleanly does not wait for its keys to expire. Stopping again does
// nothing more.
func (r *Ledger) Stop(ctx context.Context) error {
	select {
	case <-r.run.Done():
		return nil // stopped already, or never started
	default:
	}
	if r.stopUp != nil {
		r.stopUp()
	}
	if err := r.run.Stop(ctx); err != nil {
		return fmt.Errorf("stop ledger: %w", err)
	}
	if err := r.s.Remove(ctx, r.cfg.WorkerID, r.cfg.Pool); err != nil {
		r.log.Warn("could not remove the worker from Redis; its keys will expire", "err", err)
	}
	return nil
}

// Reserve takes a lease for an attempt: ErrNoCapacity if the worker has not
// that much left, locally or as Redis counts it. While Redis is away
// (the Store's Breaker is open) local accounting decides alone, at once;
// the heartbeat after Redis returns writes the lease.
func (r *Ledger) Reserve(ctx context.Context, l capacity.Lease) error {
	r.mu.Lock()
	why := r.fitsLocked(l)
	quota, maxRunning := r.share.limitsOf(l.TenantOf())
	if why == "" {
		why = r.quotaLocked(l, quota)
	}
	if why != "" {
		r.mu.Unlock()
		return fmt.Errorf("%w: %s", capacity.ErrNoCapacity, why)
	}
	r.addLocked(l)
	if !r.s.Up() {
		r.mu.Unlock()
		r.wait.Record(ctx, 0, opReserve)
		return nil
	}
	o := op{LeaseOp: capacity.LeaseOp{Lease: l, Quota: quota, MaxRunning: maxRunning}}
	if !o.Checks() {
		// Nothing Redis knows can refuse it: the worker's own slots and
		// resources are this ledger's to count, and the tenant has no
		// quota, nor the pool a bound. The lease goes with the next
		// batch, as a release does, and the attempt starts without the
		// round trip.
		r.ops = append(r.ops, o)
		r.mu.Unlock()
		r.wait.Record(ctx, 0, opReserve)
		r.poke()
		return nil
	}
	reply := make(chan error, 1)
	o.reply = reply
	r.ops = append(r.ops, o)
	r.asking[keyOf(l)] = true
	r.mu.Unlock()
	start := time.Now()
	defer func() { r.wait.Record(ctx, time.Since(start).Seconds(), opReserve) }()
	// When nothing is being sent, the reservation sends the batch itself
	// (with what else waits): no hand-off to the loop's goroutine and back
	// for a worker that is not busy. Otherwise what is being sent is a
	// batch's round trip, meanwhile the next one fills, and the loop sends
	// it.
	if r.sending.TryLock() {
		r.flush(context.WithoutCancel(ctx))
		r.sending.Unlock()
	}
	r.poke()
	select {
	case err := <-reply:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Holds implements capacity.Holder: whether another worker is alive and holds
// the lease of a job's attempt. While Redis is away it fails at once with
// capacity.ErrUnavailable: nobody can tell.
func (r *Ledger) Holds(ctx context.Context, workerID, tenant, jobID string, attempt int) (bool, error) {
	start := time.Now()
	defer func() { r.wait.Record(ctx, time.Since(start).Seconds(), opHolds) }()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return r.s.Holds(ctx, r.cfg.Pool, workerID, tenant, jobID, attempt)
}

// PeerHasImage implements capacity.Peers: whether another live, healthy
// worker of the pool reports the image cached. The pool's heartbeats are
// read at most once an interval; without Redis, no.
func (r *Ledger) PeerHasImage(ctx context.Context, image string) bool {
	r.peersMu.Lock()
	defer r.peersMu.Unlock()
	if r.peers == nil || time.Since(r.peersAt) >= r.cfg.Interval {
		start := time.Now()
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		hbs, err := r.s.Workers(ctx, r.cfg.Pool)
		r.wait.Record(ctx, time.Since(start).Seconds(), opPeers)
		r.peers, r.peersAt = map[string]bool{}, time.Now()
		if err != nil {
			return false
		}
		for _, hb := range hbs {
			if hb.WorkerID == r.cfg.WorkerID || hb.Health == job.HealthDraining || hb.Health == job.HealthUnhealthy || hb.Inventory == nil {
				continue
			}
			for _, img := range hb.Inventory.Images {
				r.peers[img] = true
			}
		}
	}
	return r.peers[image]
}

// Release gives a lease back. It does not wait for Redis; while Redis is
// away it is not sent (the heartbeat after Redis returns replaces the
// leases).
func (r *Ledger) Release(ctx context.Context, l capacity.Lease) error {
	r.mu.Lock()
	held, ok := r.leases[keyOf(l)]
	var accrued time.Duration
	if ok {
		accrued = r.accrue(held, time.Now())
		r.removeLocked(held)
	}
	send := ok && r.s.Up()
	if send {
		r.ops = append(r.ops, op{LeaseOp: capacity.LeaseOp{Release: true, Lease: held, Accrued: accrued}})
	}
	r.mu.Unlock()
	if send {
		r.poke()
	}
	return nil
}

// The size of a job that names none, for Room.
var defCPU, _ = job.ParseCPU(job.DefaultCPU)
var defMem, _ = job.ParseMemory(job.DefaultMemory)

// Room returns how many more jobs of the default size the worker's
// resources hold, beyond its slots; large when they are unknown.
func (r *Ledger) Room() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	room := 1 << 30
	if t := r.totals.CPUMilli; t != nil {
		room = min(room, int((*t-r.cpuUsed)/defCPU))
	}
	if t := r.totals.MemoryBytes; t != nil {
		room = min(room, int((*t-r.memUsed)/defMem))
	}
	return max(room, 0)
}

func (r *Ledger) fitsLocked(l capacity.Lease) string {
	switch {
	case len(r.leases) >= r.cfg.Slots:
		return "all slots are in use"
	case r.totals.CPUMilli != nil && r.cpuUsed+l.CPUMilli > *r.totals.CPUMilli:
		return fmt.Sprintf("needs %s CPU, %s left", job.FormatCPU(l.CPUMilli), job.FormatCPU(*r.totals.CPUMilli-r.cpuUsed))
	case r.totals.MemoryBytes != nil && r.memUsed+l.MemoryBytes > *r.totals.MemoryBytes:
		return fmt.Sprintf("needs %s memory, %s left", job.FormatMemory(l.MemoryBytes), job.FormatMemory(*r.totals.MemoryBytes-r.memUsed))
	case l.GPUs > 0 && r.gpuUsed+l.GPUs > r.totals.GPUs:
		return fmt.Sprintf("needs %d GPUs, %d left", l.GPUs, r.totals.GPUs-r.gpuUsed)
	}
	return ""
}

func (r *Ledger) addLocked(l capacity.Lease) {
	r.leases[keyOf(l)] = l
	r.accrued[keyOf(l)] = time.Now()
	r.cpuUsed += l.CPUMilli
	r.memUsed += l.MemoryBytes
	r.gpuUsed += l.GPUs
}

func (r *Ledger) removeLocked(l capacity.Lease) {
	delete(r.leases, keyOf(l))
	delete(r.accrued, keyOf(l))
	r.cpuUsed -= l.CPUMilli
	r.memUsed -= l.MemoryBytes
	r.gpuUsed -= l.GPUs
}

func (r *Ledger) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// loop sends queued lease operations to Redis in batches, and the
// heartbeat every interval and as soon as Redis answers after an outage,
// until ctx ends; then it sends what is left. One goroutine does both, so
// that a heartbeat's leases and the batches reach Redis in the order they
// were taken.
func (r *Ledger) loop(ctx context.Context) error {
	lifecycle.TickOrWake(ctx, r.cfg.Interval, r.wake, func(ctx context.Context) {
		r.sending.Lock()
		defer r.sending.Unlock()
		r.flush(ctx)
		r.mu.Lock()
		now := r.beatNow
		r.beatNow = false
		r.mu.Unlock()
		if now {
			r.heartbeat(ctx)
		}
	}, func(ctx context.Context) {
		r.refreshBackend(ctx)
		r.sending.Lock()
		defer r.sending.Unlock()
		r.flush(ctx)
		r.heartbeat(ctx)
	})
	r.sending.Lock()
	defer r.sending.Unlock()
	r.flush(context.WithoutCancel(ctx))
	return nil
}

// flush sends every queued operation in one script call.
func (r *Ledger) flush(ctx context.Context) {
	r.mu.Lock()
	ops := r.ops
	r.ops = nil
	outage := r.outage
	r.mu.Unlock()
	if len(ops) == 0 {
		return
	}
	var reserves []op
	batch := make([]capacity.LeaseOp, len(ops))
	for i, o := range ops {
		batch[i] = o.LeaseOp
		if !o.Release {
			reserves = append(reserves, o)
		}
	}
	var replies []string
	var err error
	if !outage {
		replies, err = r.apply(ctx, batch)
		if err != nil {
			r.noteOutage(err)
		}
	}
	r.mu.Lock()
	for _, o := range reserves {
		delete(r.asking, keyOf(o.Lease))
	}
	r.mu.Unlock()
	for i, o := range reserves {
		if err != nil || outage || i >= len(replies) {
			o.answer(nil) // Redis is away: local accounting decided
			continue
		}
		switch s := replies[i]; {
		case s == capacity.LeaseOK || s == capacity.LeaseDup || s == capacity.LeaseUnknown:
			o.answer(nil)
		case o.reply == nil:
			// Decided locally and running: Redis counts the worker's
			// leases otherwise than it does; the next heartbeat writes
			// them as they are.
			r.log.Warn("Redis refused a lease the worker's own accounting took; the next heartbeat writes it", "reply", s, "job_id", o.Lease.JobID)
		default:
			r.mu.Lock()
			r.removeLocked(o.Lease)
			r.mu.Unlock()
			o.answer(fmt.Errorf("%w: %s", capacity.ErrNoCapacity, refusal(s, o.Lease.TenantOf())))
		}
	}
}

func (r *Ledger) noteOutage(err error) {
	r.mu.Lock()
	first := !r.outage
	if first {
		r.outage, r.outageSince = true, time.Now()
	}
	r.mu.Unlock()
	if first {
		r.log.Warn("Redis is unreachable: running jobs go on, slots are counted locally, and leases are reconciled when it returns", "err", err)
	}
}

// MaxUsageReported bounds the running attempts whose usage one heartbeat
// carries.
const MaxUsageReported = 256

func (r *Ledger) refreshBackend(ctx context.Context) {
	if r.cfg.Platform == nil {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	bc, err := r.cfg.Platform.Capacity(cctx)
	usage := r.cfg.Usage.Latest(cctx)
	var inv *job.Inventory
	if ir, ok := r.cfg.Platform.(executor.InventoryReader); ok {
		var ierr error
		if inv, ierr = ir.Inventory(cctx); ierr != nil {
			r.log.Debug("inventory incomplete", "err", ierr)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.usage, r.inv = usage, inv
	if err != nil {
		r.backend = &executor.Capacity{Health: job.HealthUnhealthy, Reason: err.Error()}
		return
	}
	r.backend = bc
	if r.cfg.CPUMilli == nil {
		r.totals.CPUMilli = bc.CPUMilli
	}
	if r.cfg.MemoryBytes == nil {
		r.totals.MemoryBytes = bc.MemoryBytes
	}
	if r.cfg.GPUs == 0 {
		r.totals.GPUs = bc.GPUs
	}
}

// Snapshot builds the worker's heartbeat document.
func (r *Ledger) Snapshot() *job.Heartbeat {
	r.mu.Lock()
	defer r.mu.Unlock()
	hb := &job.Heartbeat{
		WorkerID: r.cfg.WorkerID, Pool: r.cfg.Pool, Backend: r.cfg.Backend, Labels: r.cfg.Labels,
		Version: r.cfg.Version, ObservedAt: time.Now().UTC(), Health: job.HealthHealthy,
		Slots:       job.Slots{Total: r.cfg.Slots, Used: len(r.leases), Available: max(0, r.cfg.Slots-len(r.leases))},
		CPUMilli:    amount(r.totals.CPUMilli, r.cpuUsed),
		MemoryBytes: amount(r.totals.MemoryBytes, r.memUsed),
		GPUs:        job.GPUs{Total: r.totals.GPUs, Reserved: r.gpuUsed},
		Running:     make([]job.RunningAttempt, 0, len(r.leases)),
	}
	for _, l := range r.leases {
		ra := job.RunningAttempt{Tenant: l.Tenant, JobID: l.JobID, Attempt: l.Attempt, StartedAt: l.StartedAt,
			CPUMilli: l.CPUMilli, MemoryBytes: l.MemoryBytes, GPUs: l.GPUs}
		if len(hb.Running) < MaxUsageReported {
			ra.Usage = r.usage[executor.AttemptID{JobID: l.JobID, Attempt: l.Attempt}]
		}
		hb.Running = append(hb.Running, ra)
	}
	hb.Inventory = r.inv
	if b := r.backend; b != nil {
		hb.Host, hb.Containers = b.Host, b.Containers
		if b.Health != "" && b.Health != job.HealthHealthy {
			hb.Health, hb.Reason = b.Health, b.Reason
		}
	}
	if hb.Host == nil {
		hb.Host = hostinfo.Local()
	}
	if r.cfg.Draining() {
		hb.Health = job.HealthDraining
	}
	return hb
}

func amount(total *int64, used int64) job.Amount {
	a := job.Amount{Total: total, Reserved: used}
	if total != nil {
		left := *total - used
		a.Available = &left
	}
	return a
}

// heartbeat writes the snapshot, refreshes the pool index and replaces the
// leases in Redis with the local ones, in one round trip.
func (r *Ledger) heartbeat(ctx context.Context) {
	b := capacity.Beat{Heartbeat: r.Snapshot(), TTL: r.ttl(), LeaseTTL: r.leaseTTL()}
	b.Peers, b.HalfLife = r.share.peersAndHalfLife()
	now := time.Now()
	r.mu.Lock()
	b.Totals = r.totals
	b.Leases = make([]capacity.Lease, 0, len(r.leases))
	b.Accrued = map[string]time.Duration{}
	up := r.s.Up()
	for k, l := range r.leases {
		if r.asking[k] {
			continue // Redis checks it with the batch that carries it
		}
		b.Leases = append(b.Leases, l)
		if up {
			b.Accrued[l.TenantOf()] += r.accrue(l, now)
		}
	}
	r.mu.Unlock()

	if !up {
		return // the outage is noted; the heartbeat after it comes at once
	}
	cctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	r.calls.Add(ctx, 1)
	view, err := r.s.Beat(cctx, b)
	if err != nil {
		r.noteOutage(err)
		return
	}
	r.share.view(view, b.Totals)
	r.mu.Lock()
	was, since := r.outage, r.outageSince
	r.outage = false
	n := len(r.leases)
	r.mu.Unlock()
	if was {
		r.log.Info("Redis is reachable again; leases reconciled", "running", n, "down_for", time.Since(since).Round(time.Millisecond))
	}
}
