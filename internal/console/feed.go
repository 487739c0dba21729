package console

// The index's feed: every version of every job's record, from the pools'
// streams FLEET_POOL_<pool>.
//
// Each pool's stream republishes every version it stores, once stored, on
// the job's tenant's subject <prefix>.t.<tenant>.job.<pool>.<kind>.<id>
// (see queue.Config.PoolStreamV2), with its stream sequence in the
// Nats-Sequence header. The feed subscribes to those subjects for every
// tenant and pool: the server makes that copy whether or not anyone
// listens, so following it costs one delivery per version and no consumer
// (a consumer on a stream costs the server work on every message stored,
// even between pulls: see the figures of docs/performance.md). The index applies what
// arrives in batches, under one lock.
//
// A core subscription may miss messages (a reconnection, a slow consumer,
// a stream leader elected meanwhile), and it brings nothing from before it
// started: so each pool's versions are also counted by sequence. A pool's
// stream numbers its messages 1, 2, 3... and all of them are republished;
// the feed keeps, per pool, the sequence up to which it has applied every
// version, and when a version comes after a hole, or the stream's last
// sequence (listed every few seconds) is past what arrived, it reads the
// missing ones from the stream with a short-lived consumer, deleted once it
// has caught up. When the feed starts, each pool is read that way from its
// start, one version per subject (the last of each of a job's q, s and r
// subjects): the replay. Pools appear by their messages, or in the
// listing of the streams by subject <prefix>.p.>.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/lifecycle"
	"github.com/fleet-dev/fleet/internal/queue"
)

// feed follows the pools' streams into an index.
type feed struct {
	js    jetstream.JetStream
	names queue.Names
	index *Index
	log   *slog.Logger
	// check is how often the streams are listed, to find new pools and
	// versions the subscription missed.
	check time.Duration

	mu      sync.Mutex
	pending []Update
	pools   map[string]*poolFeed
	bad     int // records logged as unreadable
	wake    chan struct{}
	catches sync.WaitGroup
}

// poolFeed is where the feed stands in one pool's stream.
type poolFeed struct {
	// last: every version up to this sequence is applied.
	last uint64
	// lo and hi bound the latest run of consecutive sequences that came
	// live; when it starts right after last, last moves to its end.
	lo, hi uint64
	// listed is the stream's last sequence at the previous listing.
	listed uint64
	// reading: a catch-up reads the stream; replayed: the first one ended.
	reading, replayed bool
}

func (p *poolFeed) settle() {
	if p.hi > p.last && p.lo <= p.last+1 {
		p.last = p.hi
	}
}

// behind reports versions missing between last and what came live.
func (p *poolFeed) behind() bool { return p.hi > p.last }

func newFeed(js jetstream.JetStream, names queue.Names, index *Index, log *slog.Logger) *feed {
	return &feed{js: js, names: names, index: index, log: log, check: 5 * time.Second}
}

// run follows the streams until ctx ends or the subscription fails; then
// Again starts it over, with a new replay.
func (f *feed) run(ctx context.Context) error {
	f.mu.Lock()
	f.pools, f.pending, f.wake = map[string]*poolFeed{}, nil, make(chan struct{}, 1)
	f.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	defer f.catches.Wait()
	defer cancel()

	// Subscribe before the replay: what is stored meanwhile comes live.
	nc := f.js.Conn()
	sub, err := nc.Subscribe(f.names.AllJobLive(), f.receive)
	if err != nil {
		return fmt.Errorf("subscribe to the jobs' records: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	// The handler only queues, and the subscription keeps what comes
	// while the index applies the last batch.
	_ = sub.SetPendingLimits(-1, -1)
	if err := nc.FlushTimeout(10 * time.Second); err != nil {
		return fmt.Errorf("subscribe to the jobs' records: %w", err)
	}

	f.index.BeginReplay()
	started := time.Now()
	first, err := f.list(ctx)
	if err != nil {
		return err
	}
	ready := false
	check := func() {
		if !ready && f.replayed(first) {
			ready = true
			f.index.EndReplay()
			f.log.Info("console index ready", "jobs", f.index.Len(), "took", time.Since(started).Round(time.Millisecond))
		}
	}
	check()
	lifecycle.TickOrWake(ctx, f.check, f.wake, func(ctx context.Context) {
		f.apply(ctx)
		check()
	}, func(ctx context.Context) {
		if _, err := f.list(ctx); err != nil && ctx.Err() == nil {
			f.log.Debug("console: listing the pools' streams", "err", err)
		}
	})
	return nil
}

// receive queues a version that came live.
func (f *feed) receive(m *nats.Msg) {
	_, k, ok := f.names.ParseJobLive(m.Subject)
	if !ok {
		return
	}
	seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
	if err != nil {
		return
	}
	f.mu.Lock()
	f.pending = append(f.pending, Update{Key: k, Data: m.Data, Seq: seq})
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// apply applies what came live, and starts catch-ups where versions are
// missing.
func (f *feed) apply(ctx context.Context) {
	f.mu.Lock()
	batch := f.pending
	f.pending = nil
	for _, u := range batch {
		p := f.pool(u.Key.Pool)
		if u.Seq == p.hi+1 {
			p.hi = u.Seq
		} else {
			p.lo, p.hi = u.Seq, u.Seq
		}
		p.settle()
	}
	f.catchUpLocked(ctx)
	f.mu.Unlock()
	f.applyAll(batch)
}

func (f *feed) applyAll(batch []Update) {
	errs := f.index.ApplyAll(batch)
	if len(errs) == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, err := range errs {
		if f.bad < 10 {
			f.bad++
			f.log.Warn("a job record the console cannot read", "err", err)
		}
	}
}

func (f *feed) pool(name string) *poolFeed {
	p := f.pools[name]
	if p == nil {
		p = &poolFeed{}
		f.pools[name] = p
	}
	return p
}

// replayed reports whether every pool of the first listing was replayed.
func (f *feed) replayed(pools []string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, name := range pools {
		if p := f.pools[name]; p != nil && !p.replayed {
			return false
		}
	}
	return true
}

// list lists the pools' streams: a new pool is replayed, a pool whose
// stream is gone forgotten, and a pool whose stream held, one listing
// ago, versions that have not come since caught up with.
func (f *feed) list(ctx context.Context) ([]string, error) {
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	lister := f.js.ListStreams(lctx, jetstream.WithStreamListSubject(f.names.AllPoolSubjects()))
	prefix := f.names.PoolStreamV2("")
	last := map[string]uint64{}
	var names []string
	for info := range lister.Info() {
		if pool, ok := strings.CutPrefix(info.Config.Name, prefix); ok && pool != "" {
			last[pool] = info.State.LastSeq
			names = append(names, pool)
		}
	}
	if err := lister.Err(); err != nil {
		return nil, fmt.Errorf("list the pools' streams: %w", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for name, p := range f.pools {
		if _, ok := last[name]; !ok && !p.reading && p.replayed {
			delete(f.pools, name)
			f.index.ForgetPool(name)
		}
	}
	for name, seq := range last {
		p := f.pool(name)
		if p.listed > p.last && p.listed > p.hi {
			// Stored a listing ago and never came: missed.
			p.lo, p.hi = p.listed, p.listed
		}
		p.listed = seq
	}
	f.catchUpLocked(ctx)
	return names, nil
}

// catchUpLocked starts a catch-up for each pool that needs one and has
// none running.
func (f *feed) catchUpLocked(ctx context.Context) {
	for name, p := range f.pools {
		if (p.behind() || !p.replayed) && !p.reading {
			p.reading = true
			f.catches.Add(1)
			go f.catchUp(ctx, name, p)
		}
	}
}

// catchUp reads a pool's versions after last (from its start, one per
// subject, for the replay) with a consumer of its own, deleted when done.
func (f *feed) catchUp(ctx context.Context, pool string, p *poolFeed) {
	defer f.catches.Done()
	f.mu.Lock()
	from := p.last + 1
	f.mu.Unlock()
	end, err := f.read(ctx, pool, from)
	f.mu.Lock()
	defer f.mu.Unlock()
	p.reading = false
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		p.replayed = true // gone: the next listing forgets it
		return
	case err != nil:
		if ctx.Err() == nil {
			f.log.Debug("console: reading a pool's stream", "pool", pool, "err", err)
		}
		return // the next listing tries again
	}
	p.replayed = true
	p.last = max(p.last, end)
	p.settle()
	select {
	case f.wake <- struct{}{}: // the index may be ready
	default:
	}
}

// read applies a pool's versions from sequence from to the stream's end,
// and returns the last sequence read (from-1 if none).
func (f *feed) read(ctx context.Context, pool string, from uint64) (uint64, error) {
	stream := f.names.PoolStreamV2(pool)
	cfg := jetstream.ConsumerConfig{AckPolicy: jetstream.AckNonePolicy, MemoryStorage: true, InactiveThreshold: time.Minute,
		FilterSubject: f.names.PoolSubjects(pool), DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: from}
	if from == 1 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverLastPerSubjectPolicy, 0
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	cons, err := f.js.CreateConsumer(cctx, stream, cfg)
	cancel()
	if err != nil {
		return 0, err
	}
	// Deleted once caught up: a consumer costs the server work on every
	// message the stream stores.
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = f.js.DeleteConsumer(ctx, stream, cons.CachedInfo().Name)
	}()
	// The consumer says at its creation how many versions it has: the
	// read is caught up once it has them all. A fetch that brings none
	// before them (a server that does not answer) ends the read short,
	// and the next listing reads again from where it was.
	want := cons.CachedInfo().NumPending
	end, delivered := from-1, uint64(0)
	for delivered < want {
		fctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		batch, err := cons.Fetch(int(min(1000, want-delivered)), jetstream.FetchContext(fctx))
		if err != nil {
			cancel()
			return end, err
		}
		var us []Update
		got := 0
		for m := range batch.Messages() {
			got++
			meta, err := m.Metadata()
			if err != nil {
				cancel()
				return end, err
			}
			if meta.Sequence.Consumer != delivered+1 {
				cancel()
				return end, fmt.Errorf("pool %s: a gap in the consumer's deliveries", pool)
			}
			delivered, end = meta.Sequence.Consumer, max(end, meta.Sequence.Stream)
			if _, k, ok := f.names.ParsePoolJob(m.Subject()); ok {
				us = append(us, Update{Key: k, Data: m.Data(), Seq: meta.Sequence.Stream})
			}
		}
		err = batch.Error()
		cancel()
		f.applyAll(us)
		if err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return end, err
		}
		if ctx.Err() != nil {
			return end, ctx.Err()
		}
		if got == 0 {
			return end, fmt.Errorf("pool %s: read %d of the %d versions its consumer announced", pool, delivered, want)
		}
	}
	return end, nil
}
