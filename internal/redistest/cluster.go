package redistest

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster is a Redis Cluster of masters without replicas, on loopback.
type Cluster struct {
	Nodes []*Server
}

// StartCluster starts n cluster-enabled servers, joins them with
// redis-cli --cluster create (the slots split evenly), and returns once
// every node reports the cluster ok. It skips the test when redis-server
// or redis-cli is missing (fails it under CI=true). WithPassword and
// WithTLS protect every node and the cluster bus; nodes authenticate each
// other there, so the certificate must allow client authentication too. Everything stops when
// the test ends.
func StartCluster(t testing.TB, n int, opts ...Option) *Cluster {
	t.Helper()
	require(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := &Cluster{}
	args := []string{"--cluster", "create"}
	for i := 0; i < n; i++ {
		s := newServer(t, opts...)
		// The cluster bus gets a port of its own: port+10000 may be taken.
		s.extra = []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "2000", "--cluster-port", fmt.Sprint(freePort(t))}
		s.Start()
		c.Nodes = append(c.Nodes, s)
		args = append(args, s.Addr())
	}
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if o := c.Nodes[0].opts; o.cert != "" {
		args = append(args, "--tls", "--cacert", o.caCerts)
	}
	if pw := c.Nodes[0].opts.password; pw != "" {
		args = append(args, "-a", pw, "--no-auth-warning")
	}
	out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	for _, s := range c.Nodes {
		waitFor(t, ctx, "the cluster to be ok", func(ctx context.Context) bool {
			info, err := clusterInfo(ctx, s)
			return err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_slots_assigned:16384")
		})
	}
	return c
}

// URL is the redis+cluster:// URL of the cluster (rediss+cluster:// with
// TLS), naming every node, with the password if there is one.
func (c *Cluster) URL() string {
	addrs := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		addrs[i] = s.Addr()
	}
	o := c.Nodes[0].opts
	scheme, auth := "redis", ""
	if o.cert != "" {
		scheme = "rediss"
	}
	if o.password != "" {
		auth = ":" + o.password + "@"
	}
	return scheme + "+cluster://" + auth + strings.Join(addrs, ",")
}

func clusterInfo(ctx context.Context, s *Server) (string, error) {
	c := redis.NewClient(s.clientOptions())
	defer c.Close()
	return c.ClusterInfo(ctx).Result()
}
