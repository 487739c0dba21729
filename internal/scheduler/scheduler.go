package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/fleet-dev/fleet/internal/lifecycle"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/internal/schedule"
	"github.com/fleet-dev/fleet/internal/telemetry"
	"github.com/fleet-dev/fleet/job"
)

// DefaultLease is how long the dispatcher that fires the schedules holds
// their lease without renewing it (Config.Lease): after a SIGKILL, the
// firings resume within it and a second.
const DefaultLease = 3 * time.Second

// scheduleFiresAtOnce bounds the schedules whose firings are made one
// schedule at a time (see fireDue: most are made in one batch);
// schedulePreparesAtOnce the firings being made ready before their time.
const (
	scheduleFiresAtOnce    = 64
	schedulePreparesAtOnce = 16
)

// Scheduler fires the schedules of every tenant from the dispatcher that
// holds the schedules' lease: it follows the schedules in their bucket,
// sleeps until the next firing is due, and makes it through Submit, as a
// producer's request would be, with the firing's id. What each firing did
// is kept in the bucket beside the schedule, so that the next holder of
// the lease goes on from there.
type Scheduler struct {
	d      Dispatcher
	kv     Bucket
	js     Publisher
	limits job.Limits
	log    *slog.Logger
	now    func() time.Time
	lease  *lease
	m      scheduleMetrics

	leasing lifecycle.Every
	// leading is the run of the lease's holder; nil when it does not hold
	// it.
	leading *lifecycle.Runner
	// leads is whether it holds the lease, for the gauge.
	leads atomic.Bool
	// unregister drops the gauges.
	unregister func()

	mu      sync.Mutex
	entries map[string]*entry // by <tenant>.<name>
	wake    chan struct{}
	// due takes the firings that are due to the scheduleFiresAtOnce
	// goroutines that make them, fired what they did to as many that
	// record it: a firing's place is free while it is recorded.
	due   chan *fired
	fired chan *fired
	// making counts the firings due and not made yet: the recordings wait
	// for them (at most recordAfter), which leaves NATS to the queue writes.
	making gate
	// prepping bounds the making ready of firings.
	prepping chan struct{}
	fires    sync.WaitGroup
}

// entry is one schedule as the lease's holder follows it.
type entry struct {
	s        *job.Schedule
	spec     *schedule.Spec
	state    job.ScheduleState
	stateRev uint64
	// next is when it fires next, zero when it does not (paused, ended);
	// busy while a firing is being made.
	next     time.Time
	busy     bool
	failures int
	// prep is its next firing made ready before its time; preparing while
	// it is being made ready.
	prep      *prepared
	preparing bool
}

// New returns the scheduler of cfg; Start starts it.
func New(cfg Config) *Scheduler {
	cfg = cfg.withDefaults()
	log := cfg.Logger.With("component", "scheduler")
	s := &Scheduler{d: cfg.Dispatcher, kv: cfg.Bucket, js: cfg.JetStream, limits: cfg.Limits, log: log, now: cfg.Now,
		lease: newLease(cfg.Bucket, cfg.Self, cfg.Lease, log),
		m:     newScheduleMetrics(telemetry.Meter()), wake: make(chan struct{}, 1),
		due: make(chan *fired), fired: make(chan *fired, firedBuffer), prepping: make(chan struct{}, schedulePreparesAtOnce),
		entries: map[string]*entry{}}
	s.leasing = lifecycle.Every{Interval: s.lease.every(), Fn: s.tick}
	return s
}

// Start starts taking part in the lease.
func (s *Scheduler) Start(ctx context.Context) error {
	s.unregister = s.gauges()
	return s.leasing.Start(ctx)
}

// Stop stops firing, and gives the lease up for another dispatcher to take
// at once.
func (s *Scheduler) Stop(ctx context.Context) error {
	err := s.leasing.Stop(ctx)
	s.stopLeading(ctx)
	s.lease.release(ctx)
	s.leads.Store(false)
	if s.unregister != nil {
		s.unregister()
	}
	return err
}

// tick keeps the lease, and starts or stops firing as it is held or not.
func (s *Scheduler) tick(ctx context.Context) {
	held := s.lease.keep(ctx)
	s.leads.Store(held)
	switch {
	case held && s.leading == nil:
		s.log.Info("firing the schedules: this dispatcher holds their lease")
		s.leading = &lifecycle.Runner{}
		_ = s.leading.Go(ctx, s.lead)
	case !held && s.leading != nil:
		s.stopLeading(ctx)
	case held && s.leading != nil:
		select {
		case <-s.leading.Done(): // its feed broke off: start it again
			s.log.Warn("following the schedules stopped; starting again", "err", s.leading.Err())
			s.leading = &lifecycle.Runner{}
			_ = s.leading.Go(ctx, s.lead)
		default:
		}
	}
}

func (s *Scheduler) stopLeading(ctx context.Context) {
	if s.leading == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := s.leading.Stop(ctx); err != nil {
		s.log.Warn("stopping the firings", "err", err)
	}
	s.leading = nil
	s.mu.Lock()
	s.entries = map[string]*entry{}
	s.mu.Unlock()
}

// lead fires the schedules until ctx ends: it reads what their firings
// did, follows the schedules, and makes each firing when it is due.
func (s *Scheduler) lead(ctx context.Context) error {
	defer s.fires.Wait()
	states, err := s.states(ctx)
	if err != nil {
		return err
	}
	w, err := s.kv.Watch(ctx, "spec.>")
	if err != nil {
		return fmt.Errorf("follow the schedules: %w", err)
	}
	defer func() { _ = w.Stop() }()
	// The schedules as they are, then every change. Stopped, or the watch
	// ended, before the first were all read, the lead ends there.
	if err := queue.Current(ctx, w, func(e jetstream.KeyValueEntry) { s.apply(e, states) }); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return errFeedEnded
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	fed := make(chan struct{})
	go func() {
		defer close(fed)
		for e := range queue.Watched(ctx, w) {
			s.apply(e, nil)
		}
		cancel(errFeedEnded) // if ctx ended first, its cause stays
	}()
	for range scheduleFiresAtOnce {
		s.fires.Add(1)
		go func() {
			defer s.fires.Done()
			s.firing(ctx)
		}()
	}
	for range recorders {
		s.fires.Add(1)
		go func() {
			defer s.fires.Done()
			s.recording(ctx)
		}()
	}
	lifecycle.Alarm(ctx, s.wake, s.dispatch)
	_ = w.Stop()
	<-fed
	if err := context.Cause(ctx); errors.Is(err, errFeedEnded) {
		return err
	}
	return nil
}

// firing makes the firings that are due until ctx ends, and hands what
// they did to recording.
func (s *Scheduler) firing(ctx context.Context) {
	for {
		select {
		case r := <-s.due:
			s.fire(ctx, r)
			s.making.done(1)
			select {
			case s.fired <- r:
			case <-ctx.Done():
				s.settle(ctx, r)
			}
		case <-ctx.Done():
			return
		}
	}
}

// recorders is how many goroutines record what the firings did, each a
// batch of up to recordBatch at a time.
const (
	recorders   = 4
	recordBatch = 1024
)

// recording records what the firings did until ctx ends: what is there
// to record once the firings due are made (at most recordAfter later), in
// one batch.
func (s *Scheduler) recording(ctx context.Context) {
	batch := make([]*fired, 0, 64)
	for {
		select {
		case r := <-s.fired:
			s.making.wait(ctx, recordAfter)
			batch = append(batch[:0], r)
		more:
			for len(batch) < recordBatch {
				select {
				case r := <-s.fired:
					batch = append(batch, r)
				default:
					break more
				}
			}
			s.settleAll(ctx, batch)
			clear(batch)
		case <-ctx.Done():
			return
		}
	}
}

// errFeedEnded is the end of the watch on the schedules, which the lease's
// holder starts again.
var errFeedEnded = errors.New("the feed of the schedules ended")

// states reads what every schedule's firings did.
func (s *Scheduler) states(ctx context.Context) (map[string]stateEntry, error) {
	w, err := s.kv.Watch(ctx, "state.>", jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("read the schedules' firings: %w", err)
	}
	defer func() { _ = w.Stop() }()
	out := map[string]stateEntry{}
	err = queue.Current(ctx, w, func(e jetstream.KeyValueEntry) {
		var st job.ScheduleState
		if json.Unmarshal(e.Value(), &st) == nil {
			out[strings.TrimPrefix(e.Key(), "state.")] = stateEntry{st, e.Revision()}
		}
	})
	if err != nil {
		return nil, fmt.Errorf("read the schedules' firings: %w", err)
	}
	return out, nil
}

type stateEntry struct {
	st  job.ScheduleState
	rev uint64
}

// apply takes in a schedule as its bucket holds it now.
func (s *Scheduler) apply(e jetstream.KeyValueEntry, states map[string]stateEntry) {
	key := strings.TrimPrefix(e.Key(), "spec.")
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.poke()
	if e.Operation() != jetstream.KeyValuePut {
		delete(s.entries, key)
		return
	}
	var sc job.Schedule
	if err := json.Unmarshal(e.Value(), &sc); err != nil {
		s.log.Warn("a schedule that cannot be read is not fired", "key", e.Key(), "err", err)
		return
	}
	spec, err := schedule.Validate(&sc, s.limits)
	if err != nil {
		s.log.Warn("a schedule no longer valid is not fired", "tenant", sc.Tenant, "schedule", sc.Name, "err", err)
		delete(s.entries, key)
		return
	}
	ent := s.entries[key]
	if ent == nil {
		ent = &entry{}
		if se, ok := states[key]; ok {
			ent.stateRev = se.rev
			if se.st.Created.Equal(sc.CreatedAt) {
				ent.state = se.st
			}
		}
		s.entries[key] = ent
	}
	if !ent.state.Created.Equal(sc.CreatedAt) { // made again under the same name
		ent.state = job.ScheduleState{}
	}
	ent.state.Created = sc.CreatedAt
	ent.s, ent.spec = &sc, spec
	if !ent.busy {
		ent.next = nextFiring(ent)
	}
}

// poke wakes the loop.
func (s *Scheduler) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// nextFiring is when a schedule fires next: its first firing after the
// last one dealt with, or after it became active. It may be past: then it
// is due at once.
func nextFiring(e *entry) time.Time {
	if e.s.Paused {
		return time.Time{}
	}
	from := e.s.ActiveSince
	if e.state.Last != nil && e.state.Last.After(from) {
		from = *e.state.Last
	}
	n, ok := e.spec.Next(from)
	if !ok {
		return time.Time{}
	}
	return n
}

// prepareAhead is how long before its time a firing is made ready (see
// prepare): at its time, only the overlap check, if the previous firing's
// job had not ended yet, its admission and its queue write are left.
const prepareAhead = 500 * time.Millisecond

// maxSleep bounds the loop's sleep, so that it looks again now and then
// whatever happens.
const maxSleep = time.Minute

// dispatch starts the firings that are due, and the making ready of
// those due within prepareAhead, and returns how long to wait until the
// next of either.
func (s *Scheduler) dispatch(ctx context.Context) time.Duration {
	now := s.now()
	soonest := now.Add(maxSleep)
	s.mu.Lock()
	var due, ready []*entry
	for _, e := range s.entries {
		switch {
		case e.busy || e.next.IsZero():
		case !e.next.After(now):
			e.busy = true
			due = append(due, e)
		default:
			wake := e.next
			if !e.preparing && (e.prep == nil || e.prep.sc != e.s || !e.prep.at.Equal(e.next)) {
				if e.next.Sub(now) <= prepareAhead {
					e.preparing = true
					ready = append(ready, e)
				} else {
					wake = e.next.Add(-prepareAhead)
				}
			}
			if wake.Before(soonest) {
				soonest = wake
			}
		}
	}
	s.mu.Unlock()
	for _, e := range ready {
		s.fires.Add(1)
		go func() {
			defer s.fires.Done()
			select {
			case s.prepping <- struct{}{}:
			case <-ctx.Done():
				s.mu.Lock()
				e.preparing = false
				s.mu.Unlock()
				return
			}
			defer func() { <-s.prepping }()
			s.prepare(ctx, e)
		}()
	}
	if len(due) > 0 {
		s.making.add(len(due))
		s.fires.Add(1)
		go func() {
			defer s.fires.Done()
			s.fireDue(ctx, due)
		}()
	}
	return max(soonest.Sub(now), 0)
}

// fireDue makes the firings of the schedules due: those that can, in one
// batch; the others (several firings to make up, none made ready, an
// overlap policy that must look at the previous firing's job) one
// schedule at a time, by the scheduleFiresAtOnce goroutines of firing.
func (s *Scheduler) fireDue(ctx context.Context, due []*entry) {
	var batch, alone []*fired
	for _, e := range due {
		r := s.take(ctx, e)
		switch {
		case len(r.ats) == 0:
			s.making.done(1)
			select {
			case s.fired <- r:
			case <-ctx.Done():
				s.settle(ctx, r)
			}
		case batchable(r):
			batch = append(batch, r)
		default:
			alone = append(alone, r)
		}
	}
	if len(alone) > 0 {
		s.fires.Add(1)
		go func() {
			defer s.fires.Done()
			for i, r := range alone {
				select {
				case s.due <- r:
				case <-ctx.Done():
					for _, r := range alone[i:] {
						s.settle(ctx, r)
					}
					s.making.done(len(alone) - i)
					return
				}
			}
		}()
	}
	if len(batch) > 0 {
		s.fireBatch(ctx, batch)
	}
}

// fired is what the firings of a schedule made at once did, to be
// recorded.
type fired struct {
	e               *entry
	sc              *job.Schedule
	st              job.ScheduleState
	rev             uint64
	now             time.Time
	changed, failed bool
	// ats are the firings due, prep the one made ready if any.
	ats  []time.Time
	prep *prepared
}

// take is what a schedule's firings due now need: the schedule and what
// its firings did as they are, the firings due, and those too late
// counted as missed.
func (s *Scheduler) take(ctx context.Context, e *entry) *fired {
	s.mu.Lock()
	sc, spec, st, rev, prep := e.s, e.spec, e.state, e.stateRev, e.prep
	st.Recent = append([]job.Firing(nil), st.Recent...)
	e.prep = nil // its request is the firing's
	s.mu.Unlock()
	if prep != nil && prep.sc != sc {
		prep = nil
	}

	now := s.now()
	from := sc.ActiveSince
	if st.Last != nil && st.Last.After(from) {
		from = *st.Last
	}
	window := job.DefaultCatchUpWindow
	if sc.CatchUpWindow != nil {
		window = sc.CatchUpWindow.Std()
	}
	due := spec.Due(from, now, window, schedule.MaxCatchUp)
	changed := false
	if due.Missed > 0 {
		last := due.LastMissed
		st.Last, st.Missed, changed = &last, st.Missed+due.Missed, true
		record(&st, job.Firing{At: last, Outcome: job.FiringMissed, Count: int(min(due.Missed, 1<<30))})
		s.m.count(ctx, sc, job.FiringMissed, due.Missed)
		s.log.Warn("schedule firings missed: older than the catch-up window", "tenant", sc.Tenant, "schedule", sc.Name,
			"missed", due.Missed, "last", last, "catch_up_window", window)
	}
	return &fired{e: e, sc: sc, st: st, rev: rev, now: now, changed: changed, ats: due.Fire, prep: prep}
}

// batchable reports whether the firings due of r can be made in a batch:
// one firing, made ready, whose overlap policy needs nothing read.
func batchable(r *fired) bool {
	p := r.prep
	return len(r.ats) == 1 && p != nil && p.req != nil && p.at.Equal(r.ats[0]) &&
		overlapDecided(r.sc, &r.st, job.FiringID(r.sc.Name, r.ats[0]), p)
}

// fire makes the firings of r one after the other; settle records what
// they did.
func (s *Scheduler) fire(ctx context.Context, r *fired) {
	for _, at := range r.ats {
		p := r.prep
		if p != nil && !p.at.Equal(at) {
			p = nil
		}
		f, err := s.fireOne(ctx, r.sc, &r.st, at, p)
		if !s.did(ctx, r, at, f, err) {
			return
		}
	}
}

// did takes in what the firing at at of r did, f, or that it failed
// with err, and reports whether the next one may be made.
func (s *Scheduler) did(ctx context.Context, r *fired, at time.Time, f job.Firing, err error) bool {
	if err != nil {
		if ctx.Err() == nil {
			lvl := slog.LevelWarn
			if r.e.failures > 0 {
				lvl = slog.LevelDebug
			}
			s.log.Log(ctx, lvl, "a schedule's firing could not be made; trying again", "tenant", r.sc.Tenant,
				"schedule", r.sc.Name, "at", at, "err", err)
		}
		r.failed = true
		return false
	}
	r.st.Last, r.changed = &at, true
	record(&r.st, f)
	return true
}

// batchTimeout bounds the making of a batch of firings, as a submission
// alone is bounded.
const batchTimeout = 10 * time.Second

// fireBatch makes the firings of rs (each batchable) at once: their jobs'
// submissions are one batch (Dispatcher.SubmitBatch), whose writes share
// the connection's and the stream's, rather than one write waited for at
// a time by each of scheduleFiresAtOnce goroutines. What each did goes to
// the recordings as its answer comes.
func (s *Scheduler) fireBatch(ctx context.Context, rs []*fired) {
	bctx, cancel := context.WithTimeout(ctx, batchTimeout)
	defer cancel()
	subs := make([]Submission, len(rs))
	ctxs := make([]context.Context, len(rs))
	spans := make([]trace.Span, len(rs))
	for i, r := range rs {
		at := r.ats[0]
		ctxs[i], spans[i] = s.startFiring(bctx, r.sc, at, job.FiringID(r.sc.Name, at))
		subs[i] = Submission{Ctx: ctxs[i], Tenant: r.sc.Tenant, Req: r.prep.req}
	}
	s.d.SubmitBatch(subs, func(i int, reply *job.SubmitReply, err error) {
		r, at := rs[i], rs[i].ats[0]
		f := job.Firing{At: at, JobID: job.FiringID(r.sc.Name, at)}
		if err == nil {
			f = s.made(ctxs[i], r.sc, &r.st, at, f, reply)
		}
		endFiring(spans[i], f, err)
		s.did(ctx, r, at, f, err)
		s.making.done(1)
		select {
		case s.fired <- r:
		case <-ctx.Done():
			s.settle(ctx, r)
		}
	})
}

// settle records what a schedule's firings did, and when it fires next.
func (s *Scheduler) settle(ctx context.Context, r *fired) {
	rev := r.rev
	if r.changed && !s.gone(r) {
		rev = s.writeState(ctx, r.sc, &r.st, rev)
	}
	s.settled(r, rev)
}

// gone reports whether the schedule of r was deleted, or made again,
// since it fired.
func (s *Scheduler) gone(r *fired) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.entries[r.sc.Tenant+"."+r.sc.Name] != r.e
}

// recordWait is how long settleAll waits for the answers of its writes
// before it makes the ones not answered again alone.
const recordWait = 500 * time.Millisecond

// settleAll is settle of many firings at once: their states' writes (each
// a compare-and-set on the revision last read or written, as writeState
// makes it) are sent without waiting for each answer, and the answers
// read after. A write refused or not answered is made again alone by
// writeState, which reads back the state another dispatcher wrote.
func (s *Scheduler) settleAll(ctx context.Context, rs []*fired) {
	futs := make([]jetstream.PubAckFuture, len(rs))
	write := make([]bool, len(rs))
	for i, r := range rs {
		if write[i] = r.changed && !s.gone(r); !write[i] {
			continue
		}
		data, err := json.Marshal(&r.st)
		if err != nil {
			continue
		}
		m := nats.NewMsg("$KV." + s.kv.Bucket() + "." + StateKey(r.sc.Tenant, r.sc.Name))
		m.Data = data
		m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(r.rev, 10))
		futs[i], _ = s.js.PublishMsgAsync(m)
	}
	t := time.NewTimer(recordWait)
	defer t.Stop()
	expired := false
	for i, r := range rs {
		rev := r.rev
		if write[i] {
			ok := false
			if f := futs[i]; f != nil {
				if !expired {
					select {
					case ack := <-f.Ok():
						rev, ok = ack.Sequence, true
					case <-f.Err():
					case <-t.C:
						expired = true
					case <-ctx.Done():
					}
				} else {
					select {
					case ack := <-f.Ok():
						rev, ok = ack.Sequence, true
					default:
					}
				}
			}
			if !ok {
				rev = s.writeState(ctx, r.sc, &r.st, r.rev)
			}
		}
		s.settled(r, rev)
	}
}

// settled takes in what the firings of r did, recorded at revision rev,
// and when its schedule fires next.
func (s *Scheduler) settled(r *fired, rev uint64) {
	e, sc, st, now, failed := r.e, r.sc, r.st, r.now, r.failed
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.poke()
	e.busy = false
	if s.entries[sc.Tenant+"."+sc.Name] != e {
		return // deleted meanwhile
	}
	e.state, e.stateRev = st, rev
	if failed {
		e.failures++
		e.next = now.Add(min(time.Duration(e.failures)*time.Second, 10*time.Second))
		return
	}
	e.failures = 0
	e.next = nextFiring(e)
}

// SpecKey is the key of a schedule in the schedules bucket, StateKey the
// key of what its firings did.
func SpecKey(tenant, name string) string  { return "spec." + tenant + "." + name }
func StateKey(tenant, name string) string { return "state." + tenant + "." + name }

// TemplateKey binds a template's sealed secrets to its schedule. Its pool
// is no pool's name, so the text cannot be moved to a job's record.
func TemplateKey(tenant, name string) queue.JobKey {
	return queue.JobKey{Tenant: tenant, Pool: "~schedule", ID: name}
}

type scheduleMetrics struct {
	firings  metric.Int64Counter
	lateness metric.Float64Histogram
}

func newScheduleMetrics(m metric.Meter) scheduleMetrics {
	var x scheduleMetrics
	x.firings, _ = m.Int64Counter("fleet.schedule.firings",
		metric.WithDescription("Firings of schedules, by tenant, schedule and outcome: made, skipped_overlap, missed (older than the catch-up window), rejected"))
	x.lateness, _ = m.Float64Histogram("fleet.schedule.lateness", metric.WithUnit("s"),
		metric.WithDescription("From a firing's time to its job queued"),
		metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
	return x
}

func (m scheduleMetrics) count(ctx context.Context, sc *job.Schedule, o job.FiringOutcome, n int64) {
	m.firings.Add(ctx, n, metric.WithAttributeSet(attribute.NewSet(attribute.String("tenant", sc.Tenant),
		attribute.String("schedule", sc.Name), attribute.String("outcome", string(o)))))
}

// gauges registers the next firing's time of each schedule, and whether
// this dispatcher fires them; the returned function unregisters them.
func (s *Scheduler) gauges() func() {
	m := telemetry.Meter()
	next, _ := m.Float64ObservableGauge("fleet.schedule.next_firing.timestamp", metric.WithUnit("s"),
		metric.WithDescription("When each schedule fires next, in seconds since the Unix epoch (reported by the dispatcher that fires them)"))
	leader, _ := m.Int64ObservableGauge("fleet.schedule.leader",
		metric.WithDescription("1 when this dispatcher holds the schedules' lease and fires them, else 0"))
	reg, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		var n int64
		if s.leads.Load() {
			n = 1
		}
		o.ObserveInt64(leader, n)
		for _, e := range s.entries {
			if e.next.IsZero() {
				continue
			}
			o.ObserveFloat64(next, float64(e.next.UnixMilli())/1000, metric.WithAttributeSet(attribute.NewSet(
				attribute.String("tenant", e.s.Tenant), attribute.String("schedule", e.s.Name))))
		}
		return nil
	}, next, leader)
	if err != nil {
		return func() {}
	}
	return func() { _ = reg.Unregister() }
}
