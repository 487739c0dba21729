// Package monitor is the dispatcher's side of the fleet's capacity: it
// admits requests against what the live workers of their pool could ever
// run, reaps the workers whose heartbeat expired, and sums the heartbeats
// for the capacity API.
package monitor

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/fleet-dev/fleet/internal/capacity"
	"github.com/fleet-dev/fleet/internal/lifecycle"
	"github.com/fleet-dev/fleet/internal/telemetry"
	"github.com/fleet-dev/fleet/job"
)

// Admission modes.
const (
	// AdmitReject refuses a request no live worker of its pool could ever
	// run. The default.
	AdmitReject = "reject"
	// AdmitQueue accepts it with a warning: a worker that fits may come
	// (autoscaling from zero).
	AdmitQueue = "queue"
	// AdmitOff does not look at capacity.
	AdmitOff = "off"
)

// Admission checks requests at submit against what the live workers of
// their pool could ever hold: their totals, not what is free now. It reads
// a view of the pools that it refreshes every second, so a submission
// costs no Redis round trip. It never refuses a request on a view read
// before the request came: it reads the view again first (one read at a
// time, shared by the refusals waiting for it), so that a worker that has
// just started is not refused for the second until the next refresh.
//
// A request for a pool with no live worker is not refused at once: it
// waits up to FirstWorker (2 s) for one to report (see awaitWorker). A
// worker started a moment before the first request for its pool, as the
// README's tour does, writes its first heartbeat once it has connected to
// NATS and Redis, which may be just after the request comes.
//
// When Redis is away (the Store's Breaker is open), reading costs nothing:
// it fails at once. Admission judges by the last view it read for 10
// seconds (the pools' totals rarely change), then lets every request
// through, with a warning that capacity is unknown. When Redis answers
// again, the view is read within a second and admission refuses again
// what no worker could run; for Settle after that, the workers of the view
// read before the outage count too, so that a pool whose workers have not
// written their heartbeats again yet (Redis came back empty) is not
// refused as having none.
type Admission struct {
	s    *capacity.Store
	mode string
	log  *slog.Logger

	// Settle is how long after an outage the workers seen before it count
	// while they write their heartbeats again. Defaults to one heartbeat
	// TTL at the default interval (3 × capacity.DefaultHeartbeatInterval).
	// Set it before Start.
	Settle time.Duration

	// FirstWorker is how long a request for a pool with no live worker
	// waits for one to report before it is refused (mode AdmitReject).
	// The requests for the pool that come meanwhile wait with it, and all
	// are answered when a worker reports or the wait ends: a producer
	// whose tries each wait less than this for an answer (the Go client's
	// first waits 500 ms) gets one within a try, not never. 0 refuses at
	// once. Defaults to DefaultFirstWorker. Set it before Start.
	FirstWorker time.Duration

	// rechecking lets one refusal at a time read the view again; the
	// others wait for it and use what it read.
	rechecking sync.Mutex

	// bg ends the waits for a first worker at Stop; pollers are those
	// waits' goroutines.
	bg      context.Context
	stopBg  context.CancelFunc
	pollers sync.WaitGroup

	mu      sync.Mutex
	pools   map[string]*poolView
	workers []*job.Heartbeat
	fresh   time.Time
	lastErr error
	// waits are the pools whose requests wait for a first worker: each
	// closes when one reports or the wait ends.
	waits map[string]chan struct{}
	// before is the view read before the last outage, and settled when it
	// stops counting.
	before  []*job.Heartbeat
	settled time.Time

	loop  *lifecycle.Every
	gauge metric.Registration
	wait  metric.Float64Histogram
}

type poolView struct {
	workers    int
	maxCPU     int64 // largest known total; meaningful only if !cpuUnknown
	maxMem     int64
	maxGPU     int
	cpuUnknown bool // some worker does not know its CPU: it might fit anything
	memUnknown bool
	backends   map[string]bool
	// gpuModels is the most GPUs of each model one node offers, over the
	// workers that report their models; none reported: models unknown.
	gpuModels map[string]int
	// keys are the placement keys the workers allow, when they report them.
	keys      map[string]bool
	keysKnown bool
	// nodes are the label sets a node selector is matched against: the
	// Kubernetes nodes the workers report, the other workers' own labels.
	// nodesUnknown: a Kubernetes worker reports no nodes (it may not list
	// them), so any selector might match.
	nodes        []map[string]string
	nodesUnknown bool
}

// NewAdmission returns an Admission in mode (AdmitReject, AdmitQueue or
// AdmitOff).
func NewAdmission(s *capacity.Store, mode string, log *slog.Logger) (*Admission, error) {
	switch mode {
	case AdmitReject, AdmitQueue, AdmitOff:
	default:
		return nil, fmt.Errorf("admission mode %q: use reject, queue or off", mode)
	}
	if log == nil {
		log = slog.Default()
	}
	a := &Admission{s: s, mode: mode, log: log.With("component", "admission"), pools: map[string]*poolView{},
		Settle: 3 * capacity.DefaultHeartbeatInterval, FirstWorker: DefaultFirstWorker, wait: capacity.WaitHistogram(),
		waits: map[string]chan struct{}{}}
	a.bg, a.stopBg = context.WithCancel(context.Background())
	a.loop = lifecycle.NewEvery(time.Second, a.refresh)
	return a, nil
}

// DefaultFirstWorker is how long a request for a pool with no live
// worker waits for one by default: a worker started with the request, or
// a moment before, has reported by then (it connects to NATS, then to
// Redis, and writes its heartbeat at once), and a refusal costs its
// producer no more than that.
const DefaultFirstWorker = 2 * time.Second

// firstWorkerPoll is how often the view is read again while requests
// wait for a pool's first worker.
const firstWorkerPoll = 100 * time.Millisecond

// Start refreshes the view now and then every second, until Stop. The view
// also feeds the fleet.pool.slots and fleet.worker.heartbeat.age gauges.
func (a *Admission) Start(ctx context.Context) error {
	if reg, err := a.observe(); err == nil {
		a.gauge = reg
	}
	return a.loop.Start(ctx)
}

// Stop stops refreshing the view; the requests waiting for a pool's first
// worker are refused.
func (a *Admission) Stop(ctx context.Context) error {
	if a.gauge != nil {
		_ = a.gauge.Unregister()
	}
	a.mu.Lock() // no wait starts after this (see awaitWorker)
	a.stopBg()
	a.mu.Unlock()
	a.pollers.Wait()
	return a.loop.Stop(ctx)
}

func (a *Admission) refresh(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	read := time.Now() // the view holds every heartbeat written before this
	hbs, err := a.s.Workers(cctx, "")
	a.mu.Lock()
	defer a.mu.Unlock()
	if err != nil {
		if a.lastErr == nil {
			a.log.Warn("cannot read capacity; judging by the last view for 10s, then admitting every request until Redis answers", "err", err)
			a.before = a.workers
		}
		a.lastErr = err
		return
	}
	if a.lastErr != nil {
		a.settled = read.Add(a.Settle)
		a.log.Info("capacity readable again; the workers seen before the outage count while they report again", "for", a.Settle)
	}
	a.lastErr = nil
	seen := hbs
	if read.Before(a.settled) {
		seen = withBefore(hbs, a.before)
	} else {
		a.before = nil
	}
	a.pools = view(seen)
	a.workers = hbs
	a.fresh = read
}

// withBefore adds to hbs the heartbeats of before whose workers hbs lacks.
func withBefore(hbs, before []*job.Heartbeat) []*job.Heartbeat {
	have := make(map[string]bool, len(hbs))
	for _, hb := range hbs {
		have[hb.WorkerID] = true
	}
	out := slices.Clone(hbs)
	for _, hb := range before {
		if !have[hb.WorkerID] {
			out = append(out, hb)
		}
	}
	return out
}

func view(hbs []*job.Heartbeat) map[string]*poolView {
	pools := map[string]*poolView{}
	for _, hb := range hbs {
		if hb.Health == job.HealthUnhealthy {
			continue
		}
		p := pools[hb.Pool]
		if p == nil {
			p = &poolView{backends: map[string]bool{}}
			pools[hb.Pool] = p
		}
		p.workers++
		p.backends[hb.Backend] = true
		if hb.CPUMilli.Total == nil {
			p.cpuUnknown = true
		} else {
			p.maxCPU = max(p.maxCPU, *hb.CPUMilli.Total)
		}
		if hb.MemoryBytes.Total == nil {
			p.memUnknown = true
		} else {
			p.maxMem = max(p.maxMem, *hb.MemoryBytes.Total)
		}
		p.maxGPU = max(p.maxGPU, hb.GPUs.Total)
		inv := hb.Inventory
		if inv != nil {
			for _, g := range inv.GPUs {
				if p.gpuModels == nil {
					p.gpuModels = map[string]int{}
				}
				p.gpuModels[g.Model] = max(p.gpuModels[g.Model], g.Count)
			}
			p.keysKnown = true
			if p.keys == nil {
				p.keys = map[string]bool{}
			}
			for _, k := range inv.PlacementKeys {
				p.keys[k] = true
			}
		}
		switch {
		case hb.Backend != "kubernetes":
			p.nodes = append(p.nodes, hb.Labels)
		case inv != nil && len(inv.Nodes) > 0:
			for _, n := range inv.Nodes {
				p.nodes = append(p.nodes, n.Labels)
			}
		default:
			p.nodesUnknown = true
		}
	}
	return pools
}

// Admit implements dispatcher.Admission.
func (a *Admission) Admit(ctx context.Context, r *job.Request) (string, error) {
	if a.mode == AdmitOff {
		return "", nil
	}
	asked := time.Now()
	p, fresh := a.pool(r.Pool)
	if fresh.IsZero() || asked.Sub(fresh) >= 10*time.Second {
		return "capacity is unknown (Redis unreachable): the request was not checked against the pool", nil
	}
	problem := unfit(r, p)
	if problem != "" && fresh.Before(asked) {
		a.rechecking.Lock()
		if _, f := a.pool(r.Pool); f.Before(asked) {
			start := time.Now()
			a.refresh(ctx)
			a.wait.Record(ctx, time.Since(start).Seconds(), opAdmit)
		}
		a.rechecking.Unlock()
		p, _ = a.pool(r.Pool)
		problem = unfit(r, p)
	}
	if problem != "" && a.mode == AdmitReject && noWorker(p) && a.FirstWorker > 0 {
		a.awaitWorker(ctx, r.Pool)
		p, _ = a.pool(r.Pool)
		problem = unfit(r, p)
	}
	switch {
	case problem == "":
		return "", nil
	case a.mode == AdmitQueue:
		return problem + "; queued anyway (admission=queue)", nil
	}
	return "", fmt.Errorf("%s", problem)
}

var opAdmit = metric.WithAttributeSet(attribute.NewSet(attribute.String("op", "admit")))

// noWorker reports a pool with no live worker in the view.
func noWorker(p *poolView) bool { return p == nil || p.workers == 0 }

// awaitWorker waits until pool has a live worker in the view, for at most
// FirstWorker from the first request that began waiting for it, or until
// ctx ends. The requests that come while one waits share its wait and its
// reads of the view; once it has ended, the next request for a pool still
// without a worker starts a new one.
func (a *Admission) awaitWorker(ctx context.Context, pool string) {
	a.mu.Lock()
	done := a.waits[pool]
	if done == nil && a.bg.Err() == nil {
		done = make(chan struct{})
		a.waits[pool] = done
		a.pollers.Add(1)
		go a.watchFor(pool, done)
	}
	a.mu.Unlock()
	if done == nil {
		return // stopped
	}
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// watchFor reads the view again every firstWorkerPoll until pool has a
// live worker or FirstWorker has passed, then closes done.
func (a *Admission) watchFor(pool string, done chan struct{}) {
	defer a.pollers.Done()
	defer func() {
		a.mu.Lock()
		delete(a.waits, pool)
		a.mu.Unlock()
		close(done)
	}()
	end := time.NewTimer(a.FirstWorker)
	defer end.Stop()
	tick := time.NewTicker(firstWorkerPoll)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
		case <-end.C:
			return
		case <-a.bg.Done():
			return
		}
		// One read of the view at a time, and none when another was
		// read since the last poll (the refresh loop's, another pool's).
		a.rechecking.Lock()
		if _, f := a.pool(pool); time.Since(f) >= firstWorkerPoll {
			a.refresh(a.bg)
		}
		a.rechecking.Unlock()
		if p, _ := a.pool(pool); !noWorker(p) {
			return
		}
	}
}

// pool returns the view of a pool and when the view was read.
func (a *Admission) pool(name string) (*poolView, time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.pools[name], a.fresh
}

// unfit says why no live worker of the pool could ever run r, or "".
func unfit(r *job.Request, p *poolView) string {
	if p == nil || p.workers == 0 {
		return fmt.Sprintf("pool %q has no live worker", r.Pool)
	}
	cpu, mem := r.Resources.CPUMilli(), r.Resources.MemoryBytes()
	var lacks []string
	if !p.cpuUnknown && cpu > p.maxCPU {
		lacks = append(lacks, fmt.Sprintf("%s CPU (the largest worker has %s)", job.FormatCPU(cpu), job.FormatCPU(p.maxCPU)))
	}
	if !p.memUnknown && mem > p.maxMem {
		lacks = append(lacks, fmt.Sprintf("%s memory (the largest worker has %s)", job.FormatMemory(mem), job.FormatMemory(p.maxMem)))
	}
	if r.Resources.GPU > p.maxGPU {
		lacks = append(lacks, fmt.Sprintf("%d GPUs (the largest worker has %d)", r.Resources.GPU, p.maxGPU))
	}
	if model := r.Resources.GPUModel; model != "" && len(p.gpuModels) > 0 && p.gpuModels[model] < r.Resources.GPU {
		lacks = append(lacks, fmt.Sprintf("%d GPUs of model %s (the pool has %s)", r.Resources.GPU, model, modelList(p.gpuModels)))
	}
	if len(lacks) > 0 {
		return fmt.Sprintf("no worker of pool %q could ever run it: it needs %s", r.Pool, strings.Join(lacks, " and "))
	}
	if why := unplaceable(r, p); why != "" {
		return fmt.Sprintf("no worker of pool %q could ever run it: %s", r.Pool, why)
	}
	containers := p.backends["docker"] || p.backends["kubernetes"]
	if r.Image == "" && containers && !p.backends["process"] && !p.backends["noop"] {
		return fmt.Sprintf("pool %q runs containers: the request needs an image", r.Pool)
	}
	if len(r.Command) == 0 && p.backends["process"] && len(p.backends) == 1 {
		return fmt.Sprintf("pool %q runs processes: the request needs a command", r.Pool)
	}
	return ""
}

// unplaceable says why no node of the pool matches the request's node
// selector, or "".
func unplaceable(r *job.Request, p *poolView) string {
	if r.Placement == nil || len(r.Placement.NodeSelector) == 0 {
		return ""
	}
	sel := r.Placement.NodeSelector
	keys := make([]string, 0, len(sel))
	for k := range sel {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if p.keysKnown {
		for _, k := range keys {
			if k != job.GPUModelLabel && !p.keys[k] {
				allowed := make([]string, 0, len(p.keys))
				for a := range p.keys {
					allowed = append(allowed, a)
				}
				slices.Sort(allowed)
				if len(allowed) == 0 {
					allowed = []string{"none"}
				}
				return fmt.Sprintf("placement.node_selector key %q is not one the pool allows (allowed: %s)", k, strings.Join(allowed, ", "))
			}
		}
	}
	if p.nodesUnknown {
		return ""
	}
	for _, n := range p.nodes {
		ok := true
		for _, k := range keys {
			if v, has := n[k]; !has || v != sel[k] {
				ok = false
				break
			}
		}
		if ok {
			return ""
		}
	}
	var want []string
	for _, k := range keys {
		want = append(want, k+"="+sel[k])
	}
	return fmt.Sprintf("no node carries the labels %s of placement.node_selector", strings.Join(want, ","))
}

// modelList writes GPU models with their counts, largest first.
func modelList(models map[string]int) string {
	names := make([]string, 0, len(models))
	for m := range models {
		names = append(names, m)
	}
	slices.SortFunc(names, func(a, b string) int {
		if models[a] != models[b] {
			return models[b] - models[a]
		}
		return strings.Compare(a, b)
	})
	var out []string
	for _, m := range names {
		out = append(out, fmt.Sprintf("%d×%s", models[m], m))
	}
	return strings.Join(out, ", ")
}

func (a *Admission) observe() (metric.Registration, error) {
	m := telemetry.Meter()
	slots, _ := m.Int64ObservableGauge("fleet.pool.slots", metric.WithDescription("Slots of a pool's live workers, by state (total, used)"))
	workers, _ := m.Int64ObservableGauge("fleet.pool.workers", metric.WithDescription("Live workers of a pool"))
	age, _ := m.Float64ObservableGauge("fleet.worker.heartbeat.age", metric.WithUnit("s"),
		metric.WithDescription("Time since a live worker's last heartbeat"))
	return m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		a.mu.Lock()
		hbs := a.workers
		a.mu.Unlock()
		for _, p := range Summarize(hbs) {
			pool := attribute.String("pool", p.Pool)
			o.ObserveInt64(slots, int64(p.Slots.Total), metric.WithAttributes(pool, attribute.String("state", "total")))
			o.ObserveInt64(slots, int64(p.Slots.Used), metric.WithAttributes(pool, attribute.String("state", "used")))
			o.ObserveInt64(workers, int64(p.Workers), metric.WithAttributes(pool))
		}
		for _, hb := range hbs {
			o.ObserveFloat64(age, time.Since(hb.ObservedAt).Seconds(),
				metric.WithAttributes(attribute.String("pool", hb.Pool), attribute.String("worker", hb.WorkerID)))
		}
		return nil
	}, slots, workers, age)
}
