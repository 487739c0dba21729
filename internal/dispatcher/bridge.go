package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/lifecycle"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// The bridge keeps contract v1's consumers working for one release: from
// every version of a default-tenant job's record in the pools' streams it
// writes what v1 wrote (the job's record in the jobs bucket, its
// lifecycle event on <prefix>.events.<id>, and its one result on
// <prefix>.results.<id>), and it copies heartbeat and log events to
// <prefix>.events.<id>. One dispatcher at a time bridges (the one with the
// smallest id, as for the balancer), each pool in the order of its stream,
// from a durable consumer, so that a dispatcher that stops leaves the
// rest to the next one. It costs what v1 cost: v1 consumers are served
// from v2's writes, not the other way round.

// bridgeConsumer is the durable consumer of the bridge on each pool's
// stream.
const bridgeConsumer = "v1-bridge"

// bridgeEvery is how often the bridge looks for new pools, and whether it
// is this dispatcher's turn.
const bridgeEvery = time.Second

// startBridge starts the bridge: its copy of heartbeat and log events, and
// the loop that follows every pool's stream while this dispatcher is the
// one that bridges.
func (d *Dispatcher) startBridge(ctx context.Context) error {
	// A bridge made now bridges what was written from a minute before: a
	// fleet that turns v1 on is not replayed whole, and what a dispatcher
	// bridging a moment ago was about to write is written (twice at worst:
	// the v1 writes are idempotent).
	b := &bridge{d: d, following: map[string]*lifecycle.Runner{}, since: time.Now().Add(-time.Minute),
		running: map[string]bool{}, held: map[string][]*nats.Msg{}}
	notices, err := d.nc.Subscribe(d.names.AllNotices(), b.notice)
	if err != nil {
		return fmt.Errorf("subscribe to %s: %w", d.names.AllNotices(), err)
	}
	d.subs = append(d.subs, notices)
	loop := lifecycle.NewEvery(bridgeEvery, b.look)
	return d.background.Start(ctx, "the v1 bridge", lifecycle.Func{
		StartFunc: loop.Start,
		StopFunc: func(ctx context.Context) error {
			err := loop.Stop(ctx)
			return errors.Join(err, b.stopAll(ctx))
		},
	})
}

type bridge struct {
	d         *Dispatcher
	since     time.Time // where a new consumer of the bridge starts
	mu        sync.Mutex
	following map[string]*lifecycle.Runner // pool → its follower

	// A v1 consumer sees a job's heartbeat and log events between its
	// started event and its final one: the notices of a job whose start
	// is not bridged yet are held until it is.
	noticesMu sync.Mutex
	running   map[string]bool        // jobs whose start was bridged
	held      map[string][]*nats.Msg // their notices, until then
}

// maxHeld bounds the notices held for one job.
const maxHeld = 256

// notice copies a default-tenant job's heartbeat or log event to its v1
// events subject, or holds it until the job's start is bridged.
func (b *bridge) notice(m *nats.Msg) {
	if !b.d.peers.first() {
		return
	}
	var e job.Event
	if json.Unmarshal(m.Data, &e) != nil || (e.Tenant != "" && e.Tenant != job.DefaultTenant) {
		return
	}
	v1 := nats.NewMsg(b.d.names.Events(e.JobID))
	v1.Data = m.Data
	b.noticesMu.Lock()
	if !b.running[e.JobID] {
		if len(b.held[e.JobID]) < maxHeld {
			b.held[e.JobID] = append(b.held[e.JobID], v1)
		}
		b.noticesMu.Unlock()
		return
	}
	b.noticesMu.Unlock()
	_ = b.d.nc.PublishMsg(v1)
}

// release publishes the notices held for job id; with done, the job ended
// and nothing more is held for it.
func (b *bridge) release(id string, running, done bool) {
	b.noticesMu.Lock()
	held := b.held[id]
	delete(b.held, id)
	if done {
		delete(b.running, id)
	} else if running {
		b.running[id] = true
	}
	b.noticesMu.Unlock()
	for _, m := range held {
		_ = b.d.nc.PublishMsg(m)
	}
}

// look starts a follower for each pool that has none, while this
// dispatcher bridges, and stops them all when it no longer does.
func (b *bridge) look(ctx context.Context) {
	if !b.d.peers.first() {
		_ = b.stopAll(ctx)
		return
	}
	pools, err := b.d.poolList(ctx, false)
	if err != nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, p := range pools {
		if b.following[p] != nil {
			continue
		}
		r := &lifecycle.Runner{}
		if err := r.Go(ctx, func(ctx context.Context) error { return b.follow(ctx, p) }); err == nil {
			b.following[p] = r
		}
	}
}

func (b *bridge) stopAll(ctx context.Context) error {
	b.mu.Lock()
	following := b.following
	b.following = map[string]*lifecycle.Runner{}
	b.mu.Unlock()
	var errs []error
	for _, r := range following {
		errs = append(errs, r.Stop(ctx))
	}
	return errors.Join(errs...)
}

// follow bridges one pool's stream until ctx ends.
func (b *bridge) follow(ctx context.Context, pool string) error {
	d := b.d
	var cons jetstream.Consumer
	err := lifecycle.Retry(d.log, "the v1 bridge's consumer of pool "+pool, lifecycle.Backoff(ctx, 100*time.Millisecond, 5*time.Second), func() (err error) {
		cons, err = d.js.CreateOrUpdateConsumer(ctx, d.names.PoolStreamV2(pool), jetstream.ConsumerConfig{
			Durable: bridgeConsumer, Description: "The v1 bridge of pool " + pool,
			FilterSubject: d.names.PoolSubjects(pool), AckPolicy: jetstream.AckExplicitPolicy,
			AckWait: 30 * time.Second, MaxAckPending: 1024, DeliverPolicy: jetstream.DeliverByStartTimePolicy,
			OptStartTime: &b.since,
		})
		return err
	})
	if err != nil {
		return nil // stopped
	}
	lifecycle.Again(ctx, d.log, "the v1 bridge of pool "+pool, 100*time.Millisecond, 5*time.Second, func(ctx context.Context) error {
		for ctx.Err() == nil {
			batch, err := cons.Fetch(256, jetstream.FetchMaxWait(time.Second))
			if err != nil {
				return err
			}
			for m := range batch.Messages() {
				if err := b.apply(ctx, m); err != nil {
					_ = m.NakWithDelay(time.Second)
					return err
				}
				_ = m.Ack()
			}
			if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
				return err
			}
		}
		return nil
	})
	return nil
}

// apply writes what v1 consumers see of one record version.
func (b *bridge) apply(ctx context.Context, m jetstream.Msg) error {
	d := b.d
	_, k, ok := d.names.ParsePoolJob(m.Subject())
	if !ok || k.Tenant != job.DefaultTenant {
		return nil
	}
	var rec job.Record
	if err := json.Unmarshal(m.Data(), &rec); err != nil {
		d.log.Warn("v1 bridge: a record it cannot read", "subject", m.Subject(), "err", err)
		return nil
	}
	meta, err := m.Metadata()
	if err != nil {
		return err
	}
	seq := meta.Sequence.Stream
	if err := b.record(ctx, &rec, seq); err != nil {
		return err
	}
	if rec.Result != nil {
		if _, err := queue.PublishResult(ctx, d.js, d.names, rec.Result); err != nil {
			return err
		}
	}
	if rec.Event == "" {
		return nil
	}
	if rec.State.Final() {
		// What the job said while it ran comes before its end.
		b.release(rec.ID, false, true)
	}
	for i, e := range job.EventsOf(&rec) {
		e.Tenant, e.Priority = "", 0 // v1 events name neither
		ev, err := d.names.EventMsg(e, 0)
		if err != nil {
			return err
		}
		// The version's sequence makes the event's id: the same version
		// bridged twice is one event.
		ev.Header.Set(queue.HeaderMsgID, rec.ID+"/v2/"+strconv.FormatUint(seq, 10)+"/"+strconv.Itoa(i))
		if _, err := queue.Publish(ctx, d.js, ev); err != nil {
			return err
		}
	}
	if rec.State == job.StateRunning {
		b.release(rec.ID, true, false)
	}
	return nil
}

// record writes the v1 record of a version, unless a later version was
// written there already (two dispatchers bridging for a moment).
func (b *bridge) record(ctx context.Context, rec *job.Record, seq uint64) error {
	st := b.d.store
	v1 := rec.Version()
	v1.Tenant, v1.Priority, v1.Event, v1.Phase, v1.Message = "", 0, "", "", ""
	v1.SubmitSeq = seq
	for {
		cur, rev, err := st.Get(ctx, rec.ID)
		switch {
		case errors.Is(err, queue.ErrNotFound):
			if _, err := st.Create(ctx, v1); errors.Is(err, queue.ErrExists) {
				continue
			} else {
				return err
			}
		case err != nil:
			return err
		case cur.SubmitSeq >= seq && cur.SubmittedAt.Equal(v1.SubmittedAt):
			return nil // bridged already
		}
		if _, err := st.Update(ctx, v1, rev); errors.Is(err, queue.ErrConflict) {
			continue
		} else {
			return err
		}
	}
}
