package capacity

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/telemetry"

	"github.com/fleet-dev/fleet/internal/worker"
	"github.com/fleet-dev/fleet/job"
)

// ReporterConfig configures a worker's Reporter.
type ReporterConfig struct {
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
	// namespace's quota). Optional.
	Platform executor.CapacityReader
	// Draining reports whether the worker is shutting down.
	Draining func() bool
	// Interval between heartbeats. Defaults to 3 seconds; the heartbeat and
	// the leases expire after three intervals.
	Interval time.Duration
	Logger   *slog.Logger
}

// Reporter is a worker's side of capacity: it reserves and releases slot
// leases, batching them into one Redis round trip, and writes the
// heartbeat. Local accounting is the first check and goes on alone while
// Redis is away; each heartbeat replaces the leases in Redis with the
// local truth, which reconciles them after an outage.
//
// It implements worker.Capacity.
type Reporter struct {
	s   *Store
	cfg ReporterConfig
	log *slog.Logger

	mu      sync.Mutex
	leases  map[string]Lease // by field
	cpuUsed int64
	memUsed int64
	gpuUsed int
	totals  totals
	backend *executor.Capacity
	ops     []op
	wake    chan struct{}
	outage  bool

	stop  chan struct{}
	done  chan struct{}
	calls metric.Int64Counter
}

type totals struct {
	cpu, mem *int64
	gpu      int
}

type op struct {
	release bool
	lease   Lease
	reply   chan error // reservations only
}

var _ worker.Capacity = (*Reporter)(nil)

// NewReporter returns a Reporter; Start starts its heartbeat.
func NewReporter(s *Store, cfg ReporterConfig) *Reporter {
	if cfg.Interval <= 0 {
		cfg.Interval = 3 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Draining == nil {
		cfg.Draining = func() bool { return false }
	}
	calls, _ := telemetry.Meter().Int64Counter("fleet.capacity.redis.calls",
		metric.WithDescription("Round trips to Redis for leases and heartbeats"))
	return &Reporter{s: s, cfg: cfg, log: cfg.Logger.With("component", "capacity"),
		leases: map[string]Lease{}, totals: totals{cpu: cfg.CPUMilli, mem: cfg.MemoryBytes, gpu: cfg.GPUs},
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}), calls: calls}
}

// ttl is how long the heartbeat lives: three intervals.
func (r *Reporter) ttl() time.Duration { return 3 * r.cfg.Interval }

// leaseTTL is how long the leases live: two intervals longer, so that the
// reaper, which runs every interval, can read what a dead worker held after
// its heartbeat is gone. A dead worker is out of every capacity view as
// soon as its heartbeat expires.
func (r *Reporter) leaseTTL() time.Duration { return 5 * r.cfg.Interval }

// Start writes the first heartbeat (or notes that Redis is away) and
// starts the loop that batches leases and repeats the heartbeat.
func (r *Reporter) Start(ctx context.Context) {
	r.refreshBackend(ctx)
	r.heartbeat(ctx)
	go r.loop()
}

// Stop stops the heartbeat and removes the worker from Redis: a worker that
// leaves cleanly does not wait for its keys to expire.
func (r *Reporter) Stop(ctx context.Context) {
	close(r.stop)
	<-r.done
	p := r.s.rdb.TxPipeline()
	p.Del(ctx, r.s.hbKey(r.cfg.WorkerID), r.s.lastKey(r.cfg.WorkerID), r.s.slotsKey(r.cfg.WorkerID))
	p.ZRem(ctx, r.s.poolKey(r.cfg.Pool), r.cfg.WorkerID)
	if _, err := p.Exec(ctx); err != nil {
		r.log.Warn("could not remove the worker from Redis; its keys will expire", "err", err)
	}
}

// Reserve takes a lease for an attempt: ErrNoCapacity if the worker has not
// that much left, locally or as Redis counts it.
func (r *Reporter) Reserve(ctx context.Context, res worker.Reservation) error {
	l := Lease{JobID: res.JobID, Attempt: res.Attempt, CPUMilli: res.CPUMilli, MemoryBytes: res.MemoryBytes,
		GPUs: res.GPUs, StartedAt: res.StartedAt}
	r.mu.Lock()
	if why := r.fitsLocked(l); why != "" {
		r.mu.Unlock()
		return fmt.Errorf("%w: %s", worker.ErrNoCapacity, why)
	}
	r.addLocked(l)
	reply := make(chan error, 1)
	r.ops = append(r.ops, op{lease: l, reply: reply})
	r.mu.Unlock()
	r.poke()
	select {
	case err := <-reply:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Release gives a lease back. It does not wait for Redis.
func (r *Reporter) Release(ctx context.Context, res worker.Reservation) error {
	l := Lease{JobID: res.JobID, Attempt: res.Attempt}
	r.mu.Lock()
	if held, ok := r.leases[l.field()]; ok {
		r.removeLocked(held)
		r.ops = append(r.ops, op{release: true, lease: held})
	}
	r.mu.Unlock()
	r.poke()
	return nil
}

// The size of a job that names none, for Room.
var defCPU, _ = job.ParseCPU(job.DefaultCPU)
var defMem, _ = job.ParseMemory(job.DefaultMemory)

// Room returns how many more jobs of the default size the worker's
// resources hold, beyond its slots; large when they are unknown.
func (r *Reporter) Room() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	room := 1 << 30
	if t := r.totals.cpu; t != nil {
		room = min(room, int((*t-r.cpuUsed)/defCPU))
	}
	if t := r.totals.mem; t != nil {
		room = min(room, int((*t-r.memUsed)/defMem))
	}
	return max(room, 0)
}

func (r *Reporter) fitsLocked(l Lease) string {
	switch {
	case len(r.leases) >= r.cfg.Slots:
		return "all slots are in use"
	case r.totals.cpu != nil && r.cpuUsed+l.CPUMilli > *r.totals.cpu:
		return fmt.Sprintf("needs %s CPU, %s left", job.FormatCPU(l.CPUMilli), job.FormatCPU(*r.totals.cpu-r.cpuUsed))
	case r.totals.mem != nil && r.memUsed+l.MemoryBytes > *r.totals.mem:
		return fmt.Sprintf("needs %s memory, %s left", job.FormatMemory(l.MemoryBytes), job.FormatMemory(*r.totals.mem-r.memUsed))
	case l.GPUs > 0 && r.gpuUsed+l.GPUs > r.totals.gpu:
		return fmt.Sprintf("needs %d GPUs, %d left", l.GPUs, r.totals.gpu-r.gpuUsed)
	}
	return ""
}

func (r *Reporter) addLocked(l Lease) {
	r.leases[l.field()] = l
	r.cpuUsed += l.CPUMilli
	r.memUsed += l.MemoryBytes
	r.gpuUsed += l.GPUs
}

func (r *Reporter) removeLocked(l Lease) {
	delete(r.leases, l.field())
	r.cpuUsed -= l.CPUMilli
	r.memUsed -= l.MemoryBytes
	r.gpuUsed -= l.GPUs
}

func (r *Reporter) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// loop sends queued lease operations to Redis in batches, and the
// heartbeat every interval.
func (r *Reporter) loop() {
	defer close(r.done)
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	ctx := context.Background()
	for {
		select {
		case <-r.stop:
			r.flush(ctx)
			return
		case <-r.wake:
			r.flush(ctx)
		case <-t.C:
			r.flush(ctx)
			r.refreshBackend(ctx)
			r.heartbeat(ctx)
		}
	}
}

// flush sends every queued operation in one script call.
func (r *Reporter) flush(ctx context.Context) {
	r.mu.Lock()
	ops := r.ops
	r.ops = nil
	outage := r.outage
	r.mu.Unlock()
	if len(ops) == 0 {
		return
	}
	var reserves []op
	for _, o := range ops {
		if !o.release {
			reserves = append(reserves, o)
		}
	}
	var replies []string
	var err error
	if !outage {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		replies, err = r.s.apply(cctx, r.cfg.WorkerID, r.leaseTTL(), ops)
		cancel()
		r.calls.Add(ctx, 1)
		if err != nil {
			r.noteOutage(err)
		}
	}
	for i, o := range reserves {
		if err != nil || outage || i >= len(replies) {
			o.reply <- nil // Redis is away: local accounting decided
			continue
		}
		switch s := replies[i]; s {
		case "ok", "dup", "unknown":
			o.reply <- nil
		default:
			r.mu.Lock()
			r.removeLocked(o.lease)
			r.mu.Unlock()
			o.reply <- fmt.Errorf("%w: Redis counts %s full for this worker", worker.ErrNoCapacity, s[len("no:"):])
		}
	}
}

func (r *Reporter) noteOutage(err error) {
	r.mu.Lock()
	first := !r.outage
	r.outage = true
	r.mu.Unlock()
	if first {
		r.log.Warn("Redis is unreachable: running jobs go on, slots are counted locally, and leases are reconciled when it returns", "err", err)
	}
}

func (r *Reporter) refreshBackend(ctx context.Context) {
	if r.cfg.Platform == nil {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	bc, err := r.cfg.Platform.Capacity(cctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.backend = &executor.Capacity{Health: job.HealthUnhealthy, Reason: err.Error()}
		return
	}
	r.backend = bc
	if r.cfg.CPUMilli == nil {
		r.totals.cpu = bc.CPUMilli
	}
	if r.cfg.MemoryBytes == nil {
		r.totals.mem = bc.MemoryBytes
	}
	if r.cfg.GPUs == 0 {
		r.totals.gpu = bc.GPUs
	}
}

// Snapshot builds the worker's heartbeat document.
func (r *Reporter) Snapshot() *job.Heartbeat {
	r.mu.Lock()
	defer r.mu.Unlock()
	hb := &job.Heartbeat{
		WorkerID: r.cfg.WorkerID, Pool: r.cfg.Pool, Backend: r.cfg.Backend, Labels: r.cfg.Labels,
		Version: r.cfg.Version, ObservedAt: time.Now().UTC(), Health: job.HealthHealthy,
		Slots:       job.Slots{Total: r.cfg.Slots, Used: len(r.leases), Available: max(0, r.cfg.Slots-len(r.leases))},
		CPUMilli:    amount(r.totals.cpu, r.cpuUsed),
		MemoryBytes: amount(r.totals.mem, r.memUsed),
		GPUs:        job.GPUs{Total: r.totals.gpu, Reserved: r.gpuUsed},
		Running:     make([]job.RunningAttempt, 0, len(r.leases)),
	}
	for _, l := range r.leases {
		hb.Running = append(hb.Running, job.RunningAttempt{JobID: l.JobID, Attempt: l.Attempt, StartedAt: l.StartedAt,
			CPUMilli: l.CPUMilli, MemoryBytes: l.MemoryBytes, GPUs: l.GPUs})
	}
	if b := r.backend; b != nil {
		hb.Host, hb.Containers = b.Host, b.Containers
		if b.Health != "" && b.Health != job.HealthHealthy {
			hb.Health, hb.Reason = b.Health, b.Reason
		}
	}
	if hb.Host == nil {
		hb.Host = LocalHost()
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
func (r *Reporter) heartbeat(ctx context.Context) {
	hb := r.Snapshot()
	data, err := json.Marshal(hb)
	if err != nil {
		r.log.Error("encode heartbeat", "err", err)
		return
	}
	r.mu.Lock()
	args := syncArgs(r.leaseTTL(), r.cfg.Slots, r.totals, r.leases)
	r.mu.Unlock()

	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	r.calls.Add(ctx, 1)
	id := r.cfg.WorkerID
	_, err = r.s.rdb.Pipelined(cctx, func(p redis.Pipeliner) error {
		p.Set(cctx, r.s.hbKey(id), data, r.ttl())
		p.Set(cctx, r.s.lastKey(id), data, 0)
		p.ZAdd(cctx, r.s.poolKey(r.cfg.Pool), redis.Z{Score: float64(time.Now().UnixMilli()), Member: id})
		p.SAdd(cctx, r.s.poolsKey(), r.cfg.Pool)
		syncScript.Run(cctx, p, []string{r.s.slotsKey(id)}, args...)
		return nil
	})
	if isNoScript(err) {
		// The script cache was flushed (a Redis restart): load and retry.
		if lerr := syncScript.Load(cctx, r.s.rdb).Err(); lerr == nil {
			err = syncScript.Run(cctx, r.s.rdb, []string{r.s.slotsKey(id)}, args...).Err()
		}
	}
	if err != nil {
		r.noteOutage(err)
		return
	}
	r.mu.Lock()
	was := r.outage
	r.outage = false
	n := len(r.leases)
	r.mu.Unlock()
	if was {
		r.log.Info("Redis is reachable again; leases reconciled", "running", n)
	}
}

func orUnknown(v *int64) string {
	if v == nil {
		return "-1"
	}
	return strconv.FormatInt(*v, 10)
}

func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}

// apply runs a batch of lease operations on a worker's hash in one script
// call, and returns the answers to the reservations, in order.
func (s *Store) apply(ctx context.Context, worker string, ttl time.Duration, ops []op) ([]string, error) {
	args := []any{ttl.Milliseconds()}
	for _, o := range ops {
		if o.release {
			args = append(args, "-", o.lease.field())
		} else {
			args = append(args, "+", o.lease.field(), o.lease.CPUMilli, o.lease.MemoryBytes, o.lease.GPUs)
		}
	}
	replies, err := leaseScript.Run(ctx, s.rdb, []string{s.slotsKey(worker)}, args...).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("leases of %s: %w", worker, err)
	}
	return replies, nil
}

func syncArgs(ttl time.Duration, slots int, t totals, leases map[string]Lease) []any {
	args := []any{ttl.Milliseconds(), slots, orUnknown(t.cpu), orUnknown(t.mem), t.gpu}
	for f, l := range leases {
		args = append(args, f, l.CPUMilli, l.MemoryBytes, l.GPUs)
	}
	return args
}
