package redistest

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// Cluster is a Redis Cluster of masters without replicas, on loopback.
type Cluster struct {
	Nodes []*Server
}

// StartCluster starts n cluster-enabled servers, joins them with
// redis-cli --cluster create (the slots split evenly), and returns once
// every node reports the cluster ok. It skips the test when redis-server
// or redis-cli is missing (fails it under CI=true). Everything stops when
// the test ends.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	require(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := &Cluster{}
	args := []string{"--cluster", "create"}
	for i := 0; i < n; i++ {
		s := newServer(t)
		// The cluster bus gets a port of its own: port+10000 may be taken.
		s.extra = []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "2000", "--cluster-port", fmt.Sprint(freePort(t))}
		s.Start()
		c.Nodes = append(c.Nodes, s)
		args = append(args, s.Addr())
	}
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	for _, s := range c.Nodes {
		waitFor(t, ctx, "the cluster to be ok", func(ctx context.Context) bool {
			info, err := infoOfCluster(ctx, s.Addr())
			return err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_slots_assigned:16384")
		})
	}
	return c
}

// URL is the redis+cluster:// URL of the cluster, naming every node.
func (c *Cluster) URL() string {
	addrs := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		addrs[i] = s.Addr()
	}
	return "redis+cluster://" + strings.Join(addrs, ",")
}

func infoOfCluster(ctx context.Context, addr string) (string, error) {
	out, err := exec.CommandContext(ctx, "redis-cli", "-h", "127.0.0.1", "-p", strings.TrimPrefix(addr, "127.0.0.1:"),
		"cluster", "info").Output()
	return string(out), err
}
