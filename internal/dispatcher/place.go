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
// dispatchers' consumer of the intake stream) led by the server that leads
// their stream (see queue.Placed): when a stream or a consumer elects a
// leader apart, it hands the consumer's leadership to the stream's. One
// dispatcher places at a time, the one that balances (see balance.go); it
// looks when a stream elects a leader, as the servers announce it, and
// every placeEvery besides.

// placeEvery is how often the placer looks without being told.
const placeEvery = 5 * time.Second

// placer remembers the consumers of each stream it last listed: a listing
// may not be answered while a server of the cluster is down.
type placer struct {
	mu    sync.Mutex
	known map[string][]string // stream: its consumers, as last listed
	now   chan struct{}       // a stream elected a leader
}

func newPlacer() *placer {
	return &placer{known: map[string][]string{}, now: make(chan struct{}, 1)}
}

// elected hears the servers' advisory that a stream or a consumer elected
// a leader.
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
	var errs []error
	for _, name := range d.placer.consumers(ctx, st, stream) {
		if !d.placeable(stream, name) {
			continue
		}
		ictx, cancel := context.WithTimeout(ctx, time.Second)
		c, err := st.Consumer(ictx, name)
		cancel()
		if err != nil {
			continue // electing its leader: the next look moves it
		}
		ci := c.CachedInfo()
		if !misplaced(ci, leader) {
			continue
		}
		from := ci.Cluster.Leader
		began := time.Now()
		if err := queue.MoveConsumer(ctx, d.js, d.nc, stream, ci, leader); err != nil {
			errs = append(errs, err)
			continue
		}
		d.m.queueMoves.Add(ctx, 1, metric.WithAttributes(attribute.String("stream", stream)))
		d.log.Info("moved a consumer's leadership to the server that leads its stream", "stream", stream, "consumer", name,
			"from", from, "to", leader, "took", time.Since(began).Round(time.Millisecond))
	}
	return errors.Join(errs...)
}

// misplaced reports whether a consumer is led away from its stream's
// leader, which holds a current replica of it to hand the leadership to.
func misplaced(ci *jetstream.ConsumerInfo, streamLeader string) bool {
	return !queue.Placement(ci, streamLeader) && queue.Movable(ci, streamLeader)
}

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
