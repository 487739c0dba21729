package dispatcher

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// TestPlanPlacement holds the placer to queue.Placed: a pool's queues have
// one replica on the server that leads its stream; after an election the
// stream goes back to its queues, when it can, rather than the queues to
// it; after the balancer's move, the queues follow; a work queue's
// consumer keeps its replicas and follows its stream's leader.
func TestPlanPlacement(t *testing.T) {
	stream := func(leader string, replicas ...*jetstream.PeerInfo) *jetstream.StreamInfo {
		return &jetstream.StreamInfo{Cluster: &jetstream.ClusterInfo{Leader: leader, Replicas: replicas}}
	}
	peer := func(name string, current bool) *jetstream.PeerInfo {
		return &jetstream.PeerInfo{Name: name, Current: current}
	}
	queue := func(name, leader string, replicas int) *jetstream.ConsumerInfo {
		return &jetstream.ConsumerInfo{Name: name, Config: jetstream.ConsumerConfig{Replicas: replicas},
			Cluster: &jetstream.ClusterInfo{Leader: leader}}
	}
	cases := []struct {
		name     string
		info     *jetstream.StreamInfo
		cis      []*jetstream.ConsumerInfo
		one      bool
		balanced bool
		how      int
		to       string
	}{
		{"in place", stream("n1", peer("n2", true), peer("n3", true)),
			[]*jetstream.ConsumerInfo{queue("q3-a", "n1", 1), queue("q1-b", "n1", 1)}, true, false, placeNothing, ""},
		{"no queue yet", stream("n1", peer("n2", true)), nil, true, false, placeNothing, ""},
		{"elected away from its queues: the stream goes back", stream("n2", peer("n1", true), peer("n3", true)),
			[]*jetstream.ConsumerInfo{queue("q3-a", "n1", 1), queue("q1-b", "n1", 1)}, true, false, placeStream, "n1"},
		{"its queues' server catching up: wait", stream("n2", peer("n1", false), peer("n3", true)),
			[]*jetstream.ConsumerInfo{queue("q3-a", "n1", 1)}, true, false, placeWait, "n1"},
		{"its queues' server holds no replica: the queues move", stream("n2", peer("n3", true)),
			[]*jetstream.ConsumerInfo{queue("q3-a", "n1", 1)}, true, false, placeQueues, "n2"},
		{"moved by the balancer: the queues follow", stream("n2", peer("n1", true), peer("n3", true)),
			[]*jetstream.ConsumerInfo{queue("q3-a", "n1", 1)}, true, true, placeQueues, "n2"},
		{"queues on two servers: they move to the stream", stream("n2", peer("n1", true), peer("n3", true)),
			[]*jetstream.ConsumerInfo{queue("q3-a", "n1", 1), queue("q1-b", "n3", 1)}, true, false, placeQueues, "n2"},
		{"a queue of three replicas, led by the stream's leader: one replica", stream("n1", peer("n2", true)),
			[]*jetstream.ConsumerInfo{queue("q3-a", "n1", 0)}, true, false, placeQueues, "n1"},
		{"a work queue's consumer led elsewhere follows its stream", stream("n1", peer("n2", true), peer("n3", true)),
			[]*jetstream.ConsumerInfo{queue("dispatcher", "n2", 0)}, false, false, placeQueues, "n1"},
		{"a work queue's consumer led by its stream's leader stays", stream("n1", peer("n2", true)),
			[]*jetstream.ConsumerInfo{queue("dispatcher", "n1", 0)}, false, false, placeNothing, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			how, to := planPlacement(c.info, c.cis, c.one, c.balanced)
			if how != c.how || to != c.to {
				t.Errorf("planPlacement = %d %q, want %d %q", how, to, c.how, c.to)
			}
		})
	}
}
