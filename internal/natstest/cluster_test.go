package natstest_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/natstest"
)

// The harness runs a real cluster: a replicated stream gets a leader, a
// killed leader is replaced, and a restarted node rejoins with its store.
// (Its requests go through Retry: one sent as the cluster finished
// forming was dropped, and waited its whole minute; CI, dd366cb.)
func TestClusterElectsAndSurvivesAKilledLeader(t *testing.T) {
	c := natstest.RunCluster(t, 3)
	c.WaitReady(t, 30*time.Second)
	if l := c.MetaLeader(); l < 0 || l >= 3 {
		t.Fatalf("meta leader: %d", l)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, err := jetstream.New(c.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	var s jetstream.Stream
	err = natstest.Retry(ctx, func(ctx context.Context) (err error) {
		s, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "H", Subjects: []string{"h.>"}, Replicas: 3})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := len(s.CachedInfo().Cluster.Replicas); got != 2 {
		t.Fatalf("stream has %d other replicas, want 2", got)
	}
	if err := natstest.Retry(ctx, func(ctx context.Context) error {
		_, err := js.Publish(ctx, "h.1", []byte("one"), jetstream.WithMsgID("h.1"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	leader := c.WaitStreamLeader(t, "H", 10*time.Second)
	c.Kill(leader)
	if c.Running(leader) {
		t.Fatal("killed server still runs")
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		l := c.StreamLeader("H")
		if l >= 0 && l != leader {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new leader for H after killing %s (leader now %d)", c.Name(leader), l)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The published message survived the leader, and a write works again.
	if err := natstest.Retry(ctx, func(ctx context.Context) error {
		_, err := js.Publish(ctx, "h.2", []byte("two"), jetstream.WithMsgID("h.2"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	c.Restart(leader)
	c.WaitReady(t, 30*time.Second)
	var info *jetstream.StreamInfo
	if err := natstest.Retry(ctx, func(ctx context.Context) (err error) {
		info, err = s.Info(ctx)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 2 {
		t.Fatalf("messages after a kill and a restart: %d, want 2", info.State.Msgs)
	}
	for _, p := range info.Cluster.Replicas {
		if p.Offline {
			t.Errorf("replica %s still offline after the restart", p.Name)
		}
	}
}
