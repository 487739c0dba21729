package dispatcher

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/internal/telemetry"
)

// The placer keeps the consumers a job waits on (each pool's queues, the
// dispatchers' consumer of the intake stream) on the server that leads
// their stream, with one replica (see queue.Placed): when a stream elects
// a leader, it moves them there. One dispatcher places at a time, the one
// that balances (see balance.go); it looks when a stream elects a leader,
// as the servers announce it, and every placeEvery besides.

// placeEvery is how often the placer looks without being told.
const placeEvery = 5 * time.Second

// placer remembers the consumers of each stream it last listed: listing
// them is not answered while one of them is on a server that is down.
type placer struct {
	mu    sync.Mutex
	known map[string][]string  // stream: its consumers, as last listed
	moved map[string]time.Time // stream: when the balancer moved its leader
	since map[string]time.Time // stream: since when its replica by its queues catches up
	now   chan struct{}        // a stream elected a leader
}

func newPlacer() *placer {
	return &placer{known: map[string][]string{}, moved: map[string]time.Time{}, since: map[string]time.Time{},
		now: make(chan struct{}, 1)}
}

// elected hears the servers' advisory that a stream elected a leader.
func (p *placer) elected(*nats.Msg) {
	select {
	case p.now <- struct{}{}:
	default:
	}
}

// runPlacer places the consumers at once, then whenever a stream elects a
// leader and every placeEvery, until ctx ends.
func (d *Dispatcher) runPlacer(ctx context.Context) error {
	t := time.NewTicker(placeEvery)
	defer t.Stop()
	for {
		if err := d.place(ctx); err != nil && ctx.Err() == nil {
			d.log.Debug("placing the queues", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-d.placer.now:
			// Let an election settle (its advisory comes as it ends).
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

// place moves what is not where it should be: the consumers of the intake
// stream and of every pool's stream.
func (d *Dispatcher) place(ctx context.Context) error {
	if d.cfg.Queue.Replicas < 2 || (d.peers != nil && !d.peers.first()) {
		return nil
	}
	ctx, span := telemetry.Tracer().Start(ctx, "fleet.place")
	defer span.End()
	pools, err := d.poolList(ctx, false)
	if err != nil {
		return err
	}
	streams := []string{d.names.IntakeStream()}
	for _, p := range pools {
		streams = append(streams, d.names.PoolStreamV2(p))
	}
	var errs []error
	for _, s := range streams {
		errs = append(errs, d.placeStream(ctx, s))
	}
	return errors.Join(errs...)
}

// placeStream moves the fleet's consumers of one stream to its leader.
func (d *Dispatcher) placeStream(ctx context.Context, stream string) error {
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	st, err := d.js.Stream(sctx, stream)
	cancel()
	if err != nil {
		return err
	}
	info := st.CachedInfo()
	if info.Cluster == nil || info.Cluster.Leader == "" || info.Config.Replicas < 2 {
		return nil
	}
	leader := info.Cluster.Leader
	// A work queue's consumer keeps its stream's replicas.
	one := info.Config.Retention != jetstream.WorkQueuePolicy
	var cis []*jetstream.ConsumerInfo
	for _, name := range d.placer.consumers(ctx, st, stream) {
		if !d.placeable(stream, name) {
			continue
		}
		ictx, cancel := context.WithTimeout(ctx, time.Second)
		c, err := st.Consumer(ictx, name)
		cancel()
		if err != nil {
			continue // on a server that is down: the workers remake it if it stays down (queue.LostAfter)
		}
		cis = append(cis, c.CachedInfo())
	}
	switch how, to := planPlacement(info, cis, one, d.placer.balanced(stream)); how {
	case placeWait:
		if d.placer.wait(stream) {
			time.AfterFunc(250*time.Millisecond, func() { d.placer.elected(nil) })
			return nil
		}
	case placeStream:
		d.placer.waited(stream)
		if err := d.stepDown(ctx, stream, to); err != nil {
			return err
		}
		d.m.queueMoves.Add(ctx, 1, metric.WithAttributes(attribute.String("stream", stream)))
		d.log.Info("moved the leadership of a stream back to the server of its queues", "stream", stream, "from", leader, "to", to)
		return nil
	case placeNothing:
		d.placer.waited(stream)
		return nil
	}
	d.placer.waited(stream)
	var errs []error
	for _, ci := range cis {
		name := ci.Name
		if queue.Placement(ci, leader, one) {
			continue
		}
		from := ci.Cluster.Leader
		began := time.Now()
		if err := queue.MoveConsumer(ctx, d.js, d.nc, stream, ci, leader, info.Config.Replicas, one); err != nil {
			errs = append(errs, err)
			continue
		}
		d.m.queueMoves.Add(ctx, 1, metric.WithAttributes(attribute.String("stream", stream)))
		d.log.Info("moved a consumer to the server that leads its stream", "stream", stream, "consumer", name,
			"from", from, "to", leader, "took", time.Since(began).Round(time.Millisecond))
	}
	return errors.Join(errs...)
}

// How a stream and its consumers are placed (planPlacement).
const (
	placeNothing = iota // they are where they should be
	placeStream         // the stream's leadership goes to the server of its queues
	placeWait           // as placeStream, once that server's replica has caught up
	placeQueues         // each consumer out of place goes to the stream's leader
)

// planPlacement says how to place a stream (info) and its consumers (cis):
// when the stream's leader is away from its queues, all on one server
// holding a current replica of the stream, and the balancer did not move
// it there on purpose (balanced), the stream's leadership goes back to
// them, which is quick; to wait, when that replica is catching up; else
// each consumer out of place goes to the stream's leader. With one, the
// consumers have one replica; without (a work queue's), its replicas.
func planPlacement(info *jetstream.StreamInfo, cis []*jetstream.ConsumerInfo, one, balanced bool) (how int, to string) {
	leader := info.Cluster.Leader
	if at := queuesTogether(cis, one); at != "" && at != leader && !balanced {
		switch {
		case current(info, at):
			return placeStream, at
		case replica(info, at):
			return placeWait, at
		}
	}
	for _, ci := range cis {
		if !queue.Placement(ci, leader, one) {
			return placeQueues, leader
		}
	}
	return placeNothing, ""
}

// queuesTogether returns the server that leads every consumer of cis, each
// with one replica (one), or "" when they are not all on one server.
func queuesTogether(cis []*jetstream.ConsumerInfo, one bool) string {
	at := ""
	for _, ci := range cis {
		if ci.Cluster == nil || ci.Cluster.Leader == "" || (one && ci.Config.Replicas != 1) || !one {
			return ""
		}
		if at != "" && ci.Cluster.Leader != at {
			return ""
		}
		at = ci.Cluster.Leader
	}
	return at
}

// current reports whether server holds a current replica of a stream.
func current(info *jetstream.StreamInfo, server string) bool {
	for _, r := range info.Cluster.Replicas {
		if r.Name == server && r.Current && !r.Offline {
			return true
		}
	}
	return false
}

// catchUp is how long the placer waits for a stream's replica on the
// server of its queues to catch up, before it moves the queues instead.
const catchUp = 3 * time.Second

// wait reports whether the placer still waits for a stream's replica to
// catch up, noting since when it does.
func (p *placer) wait(stream string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	since, ok := p.since[stream]
	if !ok {
		p.since[stream] = time.Now()
		return true
	}
	return time.Since(since) < catchUp
}

// waited ends a wait for a stream's replica.
func (p *placer) waited(stream string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.since, stream)
}

// replica reports whether server holds a replica of a stream, current or
// not.
func replica(info *jetstream.StreamInfo, server string) bool {
	for _, r := range info.Cluster.Replicas {
		if r.Name == server && !r.Offline {
			return true
		}
	}
	return false
}

// balanced reports whether the balancer moved the stream's leader lately:
// then its queues follow it, rather than it its queues.
func (p *placer) balanced(stream string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return time.Since(p.moved[stream]) < balancedFor
}

// movedOnPurpose notes that the balancer moved a stream's leader.
func (p *placer) movedOnPurpose(stream string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.moved[stream] = time.Now()
}

// balancedFor is how long after the balancer moved a stream's leader its
// queues follow it.
const balancedFor = 2 * balanceEvery

// placeable reports the consumers the placer moves: the pools' queues and
// the dispatchers' intake.
func (d *Dispatcher) placeable(stream, name string) bool {
	if stream == d.names.IntakeStream() {
		return name == d.names.IntakeConsumer()
	}
	_, _, ok := d.names.ParseQueueConsumer(name)
	return ok
}

// consumers lists a stream's consumers, or returns those of the last
// listing that was answered.
func (p *placer) consumers(ctx context.Context, st jetstream.Stream, stream string) []string {
	lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var names []string
	l := st.ConsumerNames(lctx)
	for n := range l.Name() {
		names = append(names, n)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if l.Err() != nil {
		return p.known[stream]
	}
	p.known[stream] = names
	return names
}
