package dispatcher

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// On a NATS cluster, each stream has a leader, on one server, which does
// the stream's work: every write goes through it. JetStream places leaders
// where it happens to, and a cluster may end with one server leading most
// of the fleet's streams. The balancer spreads them: the pools' jobs
// streams over the servers, one group; the tenants' feeds, which store a
// copy of each job's end, another; and the fleet's other streams (submit,
// events, results, dead letters, buckets), a third, so that the jobs of
// three pools are led by three servers, and the feeds of three tenants
// too.
//
// One dispatcher balances at a time: the one with the smallest id among
// those it hears from (see peers). It moves one leader per round, to the
// server leading the fewest of its group, by asking the stream's leader to
// step down in favour of that server.

// balanceEvery is how often the balancer looks.
const balanceEvery = 10 * time.Second

// leadership is a stream and where its leader and replicas are.
type leadership struct {
	stream  string
	leader  string
	servers []string // the leader and the replicas that are current
}

// balance moves one leader, if a group is unbalanced, and says which.
func (d *Dispatcher) balance(ctx context.Context) (moved string, err error) {
	if d.cfg.Queue.Replicas < 2 || (d.peers != nil && !d.peers.first()) {
		return "", nil
	}
	var jobs, feeds, others []leadership
	list := d.js.ListStreams(ctx)
	for info := range list.Info() {
		l, ok := d.leadershipOf(info)
		if !ok {
			continue
		}
		switch {
		case strings.HasPrefix(l.stream, d.names.PoolStreamV2("")) || strings.HasPrefix(l.stream, d.names.JobsStream("")):
			jobs = append(jobs, l)
		case strings.HasPrefix(l.stream, d.names.FeedStream("")):
			feeds = append(feeds, l)
		default:
			others = append(others, l)
		}
	}
	if err := list.Err(); err != nil {
		return "", fmt.Errorf("list streams: %w", err)
	}
	for _, group := range [][]leadership{jobs, feeds, others} {
		stream, to, ok := unbalanced(group)
		if !ok {
			continue
		}
		if err := d.stepDown(ctx, stream, to); err != nil {
			return "", err
		}
		d.m.leaderMoves.Add(ctx, 1)
		d.log.Info("moved the leadership of a stream to spread them over the cluster", "stream", stream, "to", to)
		return stream, nil
	}
	return "", nil
}

// leadershipOf says where a stream of this fleet is led, if it is one and
// is replicated.
func (d *Dispatcher) leadershipOf(info *jetstream.StreamInfo) (leadership, bool) {
	name := info.Config.Name
	ours := strings.HasPrefix(name, d.names.PoolStreamV2("")) || strings.HasPrefix(name, d.names.JobsStream("")) ||
		name == d.names.SharedJobsStream() ||
		slices.Contains([]string{d.names.IntakeStream(), d.names.SubmitStream(), d.names.EventsStream(), d.names.ResultsStream(),
			d.names.DLQStream(), "KV_" + d.names.Bucket(), "KV_" + d.names.IntakeBucket(), "KV_" + d.names.PoolsBucket(),
			"KV_" + d.names.KeysBucket()}, name)
	c := info.Cluster
	if !ours || c == nil || c.Leader == "" || len(c.Replicas) == 0 {
		return leadership{}, false
	}
	l := leadership{stream: name, leader: c.Leader, servers: []string{c.Leader}}
	for _, r := range c.Replicas {
		if r.Current && !r.Offline {
			l.servers = append(l.servers, r.Name)
		}
	}
	return l, true
}

// unbalanced finds a move that evens a group out: a stream of the server
// leading the most to the server leading the fewest, when they differ by
// more than one and that server is a current replica of the stream.
func unbalanced(group []leadership) (stream, to string, ok bool) {
	led := map[string]int{}
	for _, l := range group {
		for _, s := range l.servers {
			if _, seen := led[s]; !seen {
				led[s] = 0
			}
		}
		led[l.leader]++
	}
	var most, fewest string
	for s, n := range led {
		if most == "" || n > led[most] || n == led[most] && s < most {
			most = s
		}
		if fewest == "" || n < led[fewest] || n == led[fewest] && s < fewest {
			fewest = s
		}
	}
	if led[most]-led[fewest] < 2 {
		return "", "", false
	}
	for _, l := range group {
		if l.leader == most && slices.Contains(l.servers, fewest) {
			return l.stream, fewest, true
		}
	}
	return "", "", false
}

// stepDown asks a stream's leader to hand the leadership to server.
func (d *Dispatcher) stepDown(ctx context.Context, stream, server string) error {
	req, _ := json.Marshal(map[string]any{"placement": map[string]string{"preferred": server}})
	m, err := d.nc.RequestWithContext(ctx, "$JS.API.STREAM.LEADER.STEPDOWN."+stream, req)
	if err != nil {
		return fmt.Errorf("move the leader of %s: %w", stream, err)
	}
	var resp struct {
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return fmt.Errorf("move the leader of %s: %w", stream, err)
	}
	if resp.Error != nil {
		return fmt.Errorf("move the leader of %s: %w", stream, resp.Error)
	}
	return nil
}
