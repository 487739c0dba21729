package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// MasterName is the name the Sentinels of StartSentinel give the master.
const MasterName = "fleetmaster"

// Sentinel is a master, its replica, and three Sentinels watching them
// (quorum 2), on loopback. A Sentinel calls the master down after one
// second without an answer.
type Sentinel struct {
	t         testing.TB
	Servers   []*Server // the master and the replica, as started
	Sentinels []*Server
}

// StartSentinel starts the master, the replica and the Sentinels, and
// returns once the replica is in sync and every Sentinel knows the
// replica and the other two, so that a failover can happen. WithPassword
// protects the servers, WithSentinelPassword the Sentinels, WithTLS both.
// Everything stops when the test ends.
func StartSentinel(t testing.TB, opts ...Option) *Sentinel {
	t.Helper()
	require(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st := &Sentinel{t: t}
	master := newServer(t, opts...)
	master.Start()
	replica := newServer(t, opts...)
	replica.extra = []string{"--replicaof", "127.0.0.1", fmt.Sprint(master.port)}
	replica.Start()
	st.Servers = []*Server{master, replica}
	waitFor(t, ctx, "the replica to sync", func(ctx context.Context) bool {
		info, err := infoOf(ctx, replica, "replication")
		return err == nil && info["master_link_status"] == "up"
	})
	for i := 0; i < 3; i++ {
		s := newServer(t, opts...)
		s.sentinel = true
		s.conf = filepath.Join(s.dir, "sentinel.conf")
		conf := fmt.Sprintf("sentinel monitor %[1]s 127.0.0.1 %[2]d 2\n"+
			"sentinel down-after-milliseconds %[1]s 1000\n"+
			"sentinel failover-timeout %[1]s 10000\n"+
			"sentinel parallel-syncs %[1]s 1\n", MasterName, master.port)
		if pw := s.opts.password; pw != "" {
			conf += fmt.Sprintf("sentinel auth-pass %s %s\n", MasterName, pw)
		}
		if pw := s.opts.sentinelPassword; pw != "" {
			conf += fmt.Sprintf("sentinel sentinel-pass %s\n", pw)
		}
		if err := os.WriteFile(s.conf, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		s.extra = []string{"--sentinel"}
		s.Start()
		st.Sentinels = append(st.Sentinels, s)
	}
	for _, s := range st.Sentinels {
		waitFor(t, ctx, "the Sentinels to know each other and the replica", func(ctx context.Context) bool {
			m, err := sentinelMaster(ctx, s)
			return err == nil && m["num-other-sentinels"] == "2" && m["num-slaves"] == "1"
		})
	}
	return st
}

// URL is the redis+sentinel:// URL of the setup (rediss+sentinel:// with
// TLS), without passwords.
func (st *Sentinel) URL() string {
	addrs := make([]string, len(st.Sentinels))
	for i, s := range st.Sentinels {
		addrs[i] = s.Addr()
	}
	scheme := "redis"
	if st.Servers[0].opts.cert != "" {
		scheme = "rediss"
	}
	return scheme + "+sentinel://" + strings.Join(addrs, ",") + "/" + MasterName + "/0"
}

// Master returns the server the Sentinels name the master.
func (st *Sentinel) Master(ctx context.Context) (*Server, error) {
	c := redis.NewSentinelClient(st.Sentinels[0].clientOptions())
	defer c.Close()
	addr, err := c.GetMasterAddrByName(ctx, MasterName).Result()
	if err != nil {
		return nil, fmt.Errorf("ask a Sentinel for the master: %w", err)
	}
	for _, s := range st.Servers {
		if net.JoinHostPort(addr[0], addr[1]) == s.Addr() {
			return s, nil
		}
	}
	return nil, fmt.Errorf("the Sentinels name %v, not one of ours", addr)
}

// KillMaster SIGKILLs the master, which stays down, and returns it.
func (st *Sentinel) KillMaster() *Server {
	st.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m, err := st.Master(ctx)
	if err != nil {
		st.t.Fatal(err)
	}
	m.Stop()
	return m
}

// WaitFailover waits until the Sentinels name a master other than old and
// it answers as a master, and returns it.
func (st *Sentinel) WaitFailover(old *Server, within time.Duration) *Server {
	st.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	var m *Server
	waitFor(st.t, ctx, "the Sentinels to promote the replica", func(ctx context.Context) bool {
		var err error
		if m, err = st.Master(ctx); err != nil || m == old {
			return false
		}
		info, err := infoOf(ctx, m, "replication")
		return err == nil && info["role"] == "master"
	})
	return m
}

func sentinelMaster(ctx context.Context, s *Server) (map[string]string, error) {
	c := redis.NewSentinelClient(s.clientOptions())
	defer c.Close()
	return c.Master(ctx, MasterName).Result()
}

// infoOf reads one section of a server's INFO as a map.
func infoOf(ctx context.Context, s *Server, section string) (map[string]string, error) {
	c := redis.NewClient(s.clientOptions())
	defer c.Close()
	text, err := c.Info(ctx, section).Result()
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, line := range strings.Split(text, "\r\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			out[k] = v
		}
	}
	return out, nil
}

func waitFor(t testing.TB, ctx context.Context, what string, ok func(context.Context) bool) {
	t.Helper()
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		done := ok(cctx)
		cancel()
		if done {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
