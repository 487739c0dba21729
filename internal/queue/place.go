package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Placed: where the consumers that jobs wait on live, on a cluster.
//
// A replicated stream and each of its replicated consumers are Raft groups
// of their own, each electing its leader 4 to 9 s after the server that
// led it dies, apart from the others. A pool whose queue is led by another
// server than its stream stalls twice, once for each server's death; one
// whose queue is led by the same server still waits for the later of two
// elections. So the consumers on a job's path (a pool's queues, the
// dispatchers' consumer of the intake stream) have one replica, on the
// server that leads their stream: they have nothing to elect. When that
// server dies they are back as soon as it is, which comes before the
// stream has elected its next leader (it holds their state on its disk),
// and a dispatcher moves them to wherever the stream's leader goes
// (MoveConsumer). What one server's death costs a pool is then its
// stream's election, once. When the stream elects its next leader away
// from its queues, the leadership of the stream goes back to their server
// (which is quick: the stream's replicas there is current), rather than
// the queues to it; when the stream's leader was moved on purpose (to
// spread the pools' leaders), the queues follow it.
//
// The dispatchers' consumer of the intake stream cannot: the consumer of a
// work queue has as many replicas as its stream (the servers refuse
// fewer). It is led by its stream's leader, so that the death of another
// server costs the intake nothing; the death of that one costs the later
// of the stream's election and its own.
//
// A queue is made with its stream's replicas (a quorum of them can make
// it, where one replica would go to a server at random, maybe one that
// is down), and given one by the placer.
//
// A consumer whose server does not come back is made again on a live one
// by the pool's workers after LostAfter (RemakeQueue), from where it had
// acknowledged everything: what it had delivered and not had acknowledged
// is delivered again, and a job that had ended is acknowledged by the
// worker that reads its record.

// LostAfter is how long a queue's consumer may not answer, its pool's
// stream answering, before its workers make it again elsewhere: longer
// than a server takes to start again, shorter than a pool may wait.
const LostAfter = 15 * time.Second

// placeStep bounds each step of a move: a consumer's info, the replicas'
// catching up, a change of leader.
const placeStep = 5 * time.Second

// MoveConsumer moves a consumer of a replicated stream to server to. With
// one, as one replica: it is given the stream's replicas (its state
// copied to them), its leadership handed to to, then it is given one
// replica again, which keeps its leader. Without, only its leadership is
// handed to to. Pulls and acks go on throughout. A move cut short is taken
// up where it stopped by the next.
func MoveConsumer(ctx context.Context, js jetstream.JetStream, nc *nats.Conn, stream string, ci *jetstream.ConsumerInfo, to string, replicas int, one bool) error {
	name, cfg := ci.Name, ci.Config
	if ci.Cluster == nil {
		return fmt.Errorf("move consumer %s of %s: it is not on a cluster", name, stream)
	}
	leader := ci.Cluster.Leader
	if one && leader != to && !hasReplica(ci, to) {
		cfg.Replicas = replicas
		if _, err := js.UpdateConsumer(ctx, stream, cfg); err != nil {
			return fmt.Errorf("move consumer %s of %s: give it %d replicas: %w", name, stream, replicas, err)
		}
		info, err := awaitConsumer(ctx, js, stream, name, func(i *jetstream.ConsumerInfo) bool {
			return i.Cluster.Leader == to || hasReplica(i, to)
		})
		if err != nil {
			return fmt.Errorf("move consumer %s of %s: a replica on %s: %w", name, stream, to, err)
		}
		leader = info.Cluster.Leader
	}
	if leader != to {
		if err := stepDownConsumer(ctx, nc, stream, name, to); err != nil {
			return err
		}
		if _, err := awaitConsumer(ctx, js, stream, name, func(i *jetstream.ConsumerInfo) bool { return i.Cluster.Leader == to }); err != nil {
			return fmt.Errorf("move consumer %s of %s: its leadership to %s: %w", name, stream, to, err)
		}
	}
	if !one {
		return nil
	}
	cfg.Replicas = 1
	if _, err := js.UpdateConsumer(ctx, stream, cfg); err != nil {
		return fmt.Errorf("move consumer %s of %s: give it one replica: %w", name, stream, err)
	}
	return nil
}

// Placement says whether a consumer is where Placed wants it: led by its
// stream's leader and, with one, as its only replica.
func Placement(ci *jetstream.ConsumerInfo, streamLeader string, one bool) (placed bool) {
	if ci.Cluster == nil || ci.Cluster.Leader == "" {
		return true // not on a cluster, or leaderless: nothing to move now
	}
	// (A consumer just given one replica may still list the others for a
	// moment: its configuration says.)
	return ci.Cluster.Leader == streamLeader && (!one || ci.Config.Replicas == 1)
}

// hasReplica reports whether server is a current replica of a consumer.
func hasReplica(ci *jetstream.ConsumerInfo, server string) bool {
	for _, r := range ci.Cluster.Replicas {
		if r.Name == server && r.Current && !r.Offline {
			return true
		}
	}
	return false
}

// awaitConsumer asks for a consumer's info, each time with a short
// deadline (an info asked while its leader moves is not answered), until
// ok says so or placeStep passes.
func awaitConsumer(ctx context.Context, js jetstream.JetStream, stream, name string, ok func(*jetstream.ConsumerInfo) bool) (*jetstream.ConsumerInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, placeStep)
	defer cancel()
	var last error
	for {
		ictx, icancel := context.WithTimeout(ctx, 250*time.Millisecond)
		cons, err := js.Consumer(ictx, stream, name)
		icancel()
		if err == nil {
			if info := cons.CachedInfo(); info.Cluster != nil && ok(info) {
				return info, nil
			}
		} else {
			last = err
		}
		select {
		case <-ctx.Done():
			return nil, errors.Join(ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stepDownConsumer asks a consumer's leader to hand its leadership to
// server.
func stepDownConsumer(ctx context.Context, nc *nats.Conn, stream, name, server string) error {
	req, _ := json.Marshal(map[string]any{"placement": map[string]string{"preferred": server}})
	ctx, cancel := context.WithTimeout(ctx, placeStep)
	defer cancel()
	m, err := nc.RequestWithContext(ctx, "$JS.API.CONSUMER.LEADER.STEPDOWN."+stream+"."+name, req)
	if err != nil {
		return fmt.Errorf("move the leader of consumer %s of %s: %w", name, stream, err)
	}
	var resp struct {
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return fmt.Errorf("move the leader of consumer %s of %s: %w", name, stream, err)
	}
	if resp.Error != nil {
		return fmt.Errorf("move the leader of consumer %s of %s: %w", name, stream, resp.Error)
	}
	return nil
}

// RemakeQueue makes a pool's queue again, its consumer lost with its
// server: it is deleted (the servers remove what the lost one holds when
// it comes back) and made anew, delivering from the message after floor,
// the last it knew to be acknowledged with all before it (from the
// start when floor is 0).
func RemakeQueue(ctx context.Context, js jetstream.JetStream, c Config, pool string, q QueueKey, floor uint64) (jetstream.Consumer, error) {
	c = c.WithDefaults()
	stream, cfg := c.Names.PoolStreamV2(pool), c.QueueConsumer(pool, q)
	dctx, cancel := context.WithTimeout(ctx, placeStep)
	err := js.DeleteConsumer(dctx, stream, cfg.Durable)
	cancel()
	// The delete may be carried out and not answered (the lost server
	// does not confirm it): the create says whether it was.
	if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) && !errors.Is(err, context.DeadlineExceeded) {
		return nil, fmt.Errorf("remake queue %s of pool %s: delete: %w", cfg.Durable, pool, err)
	}
	if floor > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, floor+1
	}
	cons, err := js.CreateConsumer(ctx, stream, cfg)
	if errors.Is(err, jetstream.ErrConsumerExists) {
		return BindQueue(ctx, js, c, pool, q) // another worker remade it first
	}
	if err != nil {
		return nil, fmt.Errorf("remake queue %s of pool %s: %w", cfg.Durable, pool, err)
	}
	return cons, nil
}
