package embedded

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/fleet-dev/fleet/internal/lifecycle"
)

// Redis is an in-process Redis-protocol store (miniredis) for a
// single-machine fleet. It runs the fleet's Lua scripts like Redis does. Its
// data lives in memory: heartbeats and leases are rebuilt by the workers
// within one heartbeat after a restart.
type Redis struct {
	m     *miniredis.Miniredis
	clock lifecycle.Runner // moves miniredis' clock on
}

// StartRedis serves the Redis protocol at the address of url
// (redis://[user:password@]host:port/db), with the password required if the
// URL has one.
func StartRedis(rawURL string) (*Redis, error) {
	host, port, err := hostPort(rawURL, 6379)
	if err != nil {
		return nil, err
	}
	m := miniredis.NewMiniRedis()
	if u, err := url.Parse(strings.TrimSpace(rawURL)); err == nil && u.User != nil {
		if pw, ok := u.User.Password(); ok {
			if name := u.User.Username(); name != "" && name != "default" {
				m.RequireUserAuth(name, pw)
			} else {
				m.RequireAuth(pw)
			}
		}
	}
	if err := m.StartAddr(fmt.Sprintf("%s:%d", host, port)); err != nil {
		return nil, fmt.Errorf("redis-protocol store on %s:%d: %w", host, port, err)
	}
	r := &Redis{m: m}
	// miniredis expires keys only when told that time passed.
	last := time.Now()
	_ = r.clock.Go(context.Background(), func(ctx context.Context) error {
		lifecycle.Tick(ctx, 100*time.Millisecond, func(context.Context) {
			now := time.Now()
			m.FastForward(now.Sub(last))
			m.SetTime(now)
			last = now
		})
		return nil
	})
	return r, nil
}

// Addr is the address it listens on.
func (r *Redis) Addr() string { return r.m.Addr() }

// Close stops it.
func (r *Redis) Close() {
	_ = r.clock.Stop(context.Background())
	r.m.Close()
}
