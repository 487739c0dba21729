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

// Placed: where the consumers that jobs wait on are led, on a cluster.
//
// A replicated stream and each of its replicated consumers are Raft groups
// of their own, each electing its leader 4 to 9 s after the server that
// led it dies, apart from the others. A pool whose queue (a consumer) is
// led by another server than its stream stalls twice: once when the
// stream's leader dies, once when the queue's does. So a dispatcher keeps
// every consumer on a job's path (a pool's queues, the dispatchers'
// consumer of the intake stream) led by the server that leads its stream
// (MoveConsumer): one server's death then stalls a pool once, for the
// later of the two elections it starts. Each keeps its stream's replicas,
// so that losing a server for good costs an election, nothing more.
//
// One replica on the stream's leader was tried, to have nothing to elect:
// the queue is then back only once its server is, and delivers only what
// its replica of the stream has, which after a restart waits for the
// stream's next leader and the replica's catching up (2 to 8 s measured),
// a queue left on a follower delivers a pull's wait late, and a server lost
// for good costs a pool its queue. See docs/running.md.

// placeStep bounds a move: the consumer's infos and its change of leader.
const placeStep = 5 * time.Second

// MoveConsumer hands the leadership of a consumer of a replicated stream
// to server to, which must hold a current replica of it. Pulls and acks go
// on: a pull that waited on the old leader ends (its heartbeat stops) and
// is sent again.
func MoveConsumer(ctx context.Context, js jetstream.JetStream, nc *nats.Conn, stream string, ci *jetstream.ConsumerInfo, to string) error {
	name := ci.Name
	if ci.Cluster == nil {
		return fmt.Errorf("move consumer %s of %s: it is not on a cluster", name, stream)
	}
	if err := stepDownConsumer(ctx, nc, stream, name, to); err != nil {
		return err
	}
	if _, err := awaitConsumer(ctx, js, stream, name, func(i *jetstream.ConsumerInfo) bool { return i.Cluster.Leader == to }); err != nil {
		return fmt.Errorf("move consumer %s of %s: its leadership to %s: %w", name, stream, to, err)
	}
	return nil
}

// Placement says whether a consumer is where Placed wants it: led by its
// stream's leader (or leaderless now: nothing to move).
func Placement(ci *jetstream.ConsumerInfo, streamLeader string) (placed bool) {
	if ci.Cluster == nil || ci.Cluster.Leader == "" {
		return true
	}
	return ci.Cluster.Leader == streamLeader
}

// Movable reports whether a consumer's leadership can go to server: it
// holds a current replica of it.
func Movable(ci *jetstream.ConsumerInfo, server string) bool {
	if ci.Cluster == nil {
		return false
	}
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
