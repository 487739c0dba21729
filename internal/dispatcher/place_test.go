package dispatcher

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// TestMisplaced holds the placer to queue.Placed: a consumer led away from
// its stream's leader is moved there when the stream's leader holds a
// current replica of it, and left alone when it is led there, when it has
// no leader now, or when the stream's leader cannot take it yet.
func TestMisplaced(t *testing.T) {
	consumer := func(leader string, replicas ...*jetstream.PeerInfo) *jetstream.ConsumerInfo {
		return &jetstream.ConsumerInfo{Name: "q3-default", Cluster: &jetstream.ClusterInfo{Leader: leader, Replicas: replicas}}
	}
	peer := func(name string, current bool) *jetstream.PeerInfo {
		return &jetstream.PeerInfo{Name: name, Current: current}
	}
	offline := &jetstream.PeerInfo{Name: "n1", Current: true, Offline: true}
	cases := []struct {
		name   string
		ci     *jetstream.ConsumerInfo
		leader string
		want   bool
	}{
		{"led by its stream's leader", consumer("n1", peer("n2", true), peer("n3", true)), "n1", false},
		{"led elsewhere, the stream's leader current", consumer("n2", peer("n1", true), peer("n3", true)), "n1", true},
		{"led elsewhere, the stream's leader catching up", consumer("n2", peer("n1", false), peer("n3", true)), "n1", false},
		{"led elsewhere, the stream's leader offline for it", consumer("n2", offline, peer("n3", true)), "n1", false},
		{"electing its leader", consumer("", peer("n1", true), peer("n3", true)), "n1", false},
		{"not on a cluster", &jetstream.ConsumerInfo{Name: "q3-default"}, "n1", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := misplaced(c.ci, c.leader); got != c.want {
				t.Errorf("misplaced = %v, want %v", got, c.want)
			}
		})
	}
}
