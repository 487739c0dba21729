package redistest

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestSentinelFailsOver(t *testing.T) {
	start := time.Now()
	st := StartSentinel(t)
	t.Logf("setup in %s", time.Since(start).Round(time.Millisecond))
	old := st.KillMaster()
	killed := time.Now()
	m := st.WaitFailover(old, 30*time.Second)
	t.Logf("failover in %s", time.Since(killed).Round(time.Millisecond))
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer c.Close()
	if err := c.Set(context.Background(), "k", "v", 0).Err(); err != nil {
		t.Fatalf("the new master takes writes: %v", err)
	}
}

func TestClusterServesEverySlot(t *testing.T) {
	start := time.Now()
	cl := StartCluster(t, 3)
	t.Logf("setup in %s", time.Since(start).Round(time.Millisecond))
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{cl.Nodes[0].Addr()}})
	defer c.Close()
	ctx := context.Background()
	seen := map[string]bool{}
	for _, k := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		if err := c.Set(ctx, k, "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
		n, _ := c.ClusterKeySlot(ctx, k).Result()
		seen[nodeOf(t, c, n)] = true
	}
	if len(seen) < 2 {
		t.Errorf("8 keys landed on %d node(s)", len(seen))
	}
}

func nodeOf(t *testing.T, c *redis.ClusterClient, slot int64) string {
	slots, err := c.ClusterSlots(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slots {
		if int64(s.Start) <= slot && slot <= int64(s.End) {
			return s.Nodes[0].Addr
		}
	}
	return ""
}
