package capacity

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/fleet-dev/fleet/internal/redistest"
)

func openProbing(t *testing.T, url string) *Store {
	t.Helper()
	s, err := Open(url, Config{Prefix: "fleettest", ProbeFirst: 20 * time.Millisecond, ProbeMax: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func beat(ctx context.Context, s *Store, id string) error {
	_, err := s.Beat(ctx, Beat{Heartbeat: heartbeat(id, "p"), TTL: time.Minute, LeaseTTL: time.Minute, Totals: Totals{Slots: 2}})
	return err
}

func waitUp(t *testing.T, s *Store, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for !s.Up() {
		if time.Since(start) > within {
			t.Fatalf("the breaker did not close within %s of Redis answering", within)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start)
}

// gauge reads fleet.capacity.redis.up from reader.
func gauge(t *testing.T, reader *sdkmetric.ManualReader) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == "fleet.capacity.redis.up" {
				g := m.Data.(metricdata.Gauge[int64])
				if len(g.DataPoints) != 1 {
					t.Fatalf("fleet.capacity.redis.up has %d points, want 1", len(g.DataPoints))
				}
				return g.DataPoints[0].Value
			}
		}
	}
	t.Fatal("no fleet.capacity.redis.up")
	return 0
}

// The first call after Redis died finds it away and opens the breaker;
// the next ones fail at once with ErrUnavailable, without a network wait:
// a thousand of them cost less than the one that found Redis away. A
// probe closes it again as soon as Redis answers, calls the OnUp
// functions, and the gauge follows.
func TestBreakerFailsAtOnceWhileRedisIsAway(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	prev := otel.GetMeterProvider()
	otel.SetMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	t.Cleanup(func() { otel.SetMeterProvider(prev) })

	srv := redistest.Start(t)
	s := openProbing(t, srv.URL())
	ctx := context.Background()
	if err := beat(ctx, s, "w1"); err != nil {
		t.Fatal(err)
	}
	if !s.Up() || gauge(t, reader) != 1 {
		t.Fatal("the breaker is open, or the gauge is 0, while Redis answers")
	}
	var ups atomic.Int32
	remove := s.Breaker().OnUp(func() { ups.Add(1) })
	defer remove()

	srv.Stop()
	start := time.Now()
	_, err := s.Holds(ctx, "p", "w1", "", "j", 1)
	first := time.Since(start)
	if err == nil || errors.Is(err, ErrUnavailable) {
		t.Fatalf("the first call after Redis died: %v; want the error that found it away", err)
	}
	if s.Up() || gauge(t, reader) != 0 {
		t.Fatal("the breaker stayed closed, or the gauge 1, after a call found Redis away")
	}
	since, cause := s.Breaker().Down()
	if since.IsZero() || cause == nil {
		t.Fatalf("Down: %v %v", since, cause)
	}

	const n = 1000
	start = time.Now()
	for i := 0; i < n; i++ {
		if err := beat(ctx, s, "w1"); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("call %d while the breaker is open: %v, want ErrUnavailable", i, err)
		}
		if _, err := s.ApplyLeases(ctx, "p", "w1", time.Minute, []LeaseOp{{Lease: Lease{JobID: "j", Attempt: 1}}}); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("lease batch %d while the breaker is open: %v, want ErrUnavailable", i, err)
		}
	}
	open := time.Since(start)
	t.Logf("the call that found Redis away took %s; %d calls while the breaker was open took %s", first, 2*n, open)
	if per := open / (2 * n); per > first/10 {
		t.Errorf("a call with the breaker open took %s, more than a tenth of the one that found Redis away (%s)", per, first)
	}
	if ups.Load() != 0 {
		t.Fatal("OnUp ran while Redis is away")
	}

	srv.Start()
	back := waitUp(t, s, 2*time.Second)
	t.Logf("the breaker closed %s after Redis was back", back)
	if err := beat(ctx, s, "w1"); err != nil {
		t.Fatalf("a call after the breaker closed: %v", err)
	}
	deadline := time.Now().Add(time.Second)
	for ups.Load() != 1 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if ups.Load() != 1 || gauge(t, reader) != 1 {
		t.Fatalf("after Redis returned: OnUp ran %d times, gauge %d; want 1 and 1", ups.Load(), gauge(t, reader))
	}
}

// What Redis answers is not an outage: a missing key, a script's error, a
// caller's cancellation leave the breaker closed.
func TestBreakerStaysClosedOnRedisAnswers(t *testing.T) {
	srv := redistest.Start(t)
	s := openProbing(t, srv.URL())
	ctx := context.Background()
	if hb, err := s.LastHeartbeat(ctx, "p", "nobody"); err != nil || hb != nil {
		t.Fatalf("a missing key: %v %v", hb, err)
	}
	if err := s.rdb.Eval(ctx, "return redis.error_reply('ERR nope')", nil).Err(); err == nil {
		t.Fatal("a script's error was not returned")
	}
	if err := s.rdb.Set(ctx, s.slotsKey("p", "x"), "not a hash", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Leases(ctx, "p", "x"); err == nil {
		t.Fatal("WRONGTYPE was not returned")
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.Pools(cctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled call: %v", err)
	}
	if !s.Up() {
		t.Fatal("the breaker opened on an answer of Redis or on the caller's cancellation")
	}
	for _, err := range []error{nil, fmt.Errorf("x: %w", ErrUnavailable)} {
		if Outage(ctx, err) {
			t.Errorf("Outage(%v) = true", err)
		}
	}
}

// A Redis that stops answering without closing its connections (a host
// or a path that vanished: here, SIGSTOP) costs one call's timeout; then
// the breaker is open and the calls after it fail at once.
func TestBreakerOpensWhenRedisHangs(t *testing.T) {
	srv := redistest.Start(t)
	s := openProbing(t, srv.URL())
	ctx := context.Background()
	if err := beat(ctx, s, "w1"); err != nil {
		t.Fatal(err)
	}
	srv.Freeze()
	defer srv.Thaw()
	const timeout = 300 * time.Millisecond
	cctx, cancel := context.WithTimeout(ctx, timeout)
	start := time.Now()
	err := beat(cctx, s, "w1")
	cancel()
	first := time.Since(start)
	if err == nil || s.Up() {
		t.Fatalf("a call to a frozen Redis: %v, breaker up %v; want an error and the breaker open", err, s.Up())
	}
	start = time.Now()
	for i := 0; i < 100; i++ {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		err := beat(cctx, s, "w1")
		cancel()
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("call %d to a frozen Redis: %v, want ErrUnavailable", i, err)
		}
	}
	rest := time.Since(start)
	t.Logf("the call that found Redis hung took %s, the 100 after it %s", first, rest)
	if first > 2*timeout {
		t.Errorf("the call that found Redis hung took %s, past its context's deadline (%s)", first, timeout)
	}
	if rest > first/2 {
		t.Errorf("100 calls with the breaker open took %s; the one that timed out %s", rest, first)
	}
	srv.Thaw()
	waitUp(t, s, 2*time.Second)
	if err := beat(ctx, s, "w1"); err != nil {
		t.Fatalf("after the thaw: %v", err)
	}
}

// A Cluster master without a replica dies: the first call to its slots
// opens the breaker, which stays open while the other masters answer (the
// probe asks every master, and the cluster is not ok), and closes once the
// node is back and the cluster ok again.
func TestBreakerOnAClusterShardWithoutReplica(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	s := openProbing(t, cl.URL())
	ctx := context.Background()
	cc := s.rdb.(*redis.ClusterClient)
	if err := beat(ctx, s, "w1"); err != nil {
		t.Fatal(err)
	}
	m, err := cc.MasterForKey(ctx, s.slotsKey("p", "w1"))
	if err != nil {
		t.Fatal(err)
	}
	var dead *redistest.Server
	for _, n := range cl.Nodes {
		if n.Addr() == m.Options().Addr {
			dead = n
		}
	}
	if dead == nil {
		t.Fatalf("no node at %s", m.Options().Addr)
	}
	dead.Stop()
	if err := beat(ctx, s, "w1"); err == nil || errors.Is(err, ErrUnavailable) || s.Up() {
		t.Fatalf("a heartbeat on the dead shard: %v, breaker up %v; want the error that found it away and the breaker open", err, s.Up())
	}
	if _, err := s.Pools(ctx); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a call while the breaker is open: %v, want ErrUnavailable", err)
	}
	time.Sleep(500 * time.Millisecond) // several probes: the other masters answer them
	if s.Up() {
		t.Fatal("the breaker closed while a master of the cluster is dead")
	}
	dead.Start() // keeps its nodes.conf, so its slots; its data is gone
	back := waitUp(t, s, 20*time.Second)
	t.Logf("the breaker closed %s after the shard's node was back", back)
	if err := beat(ctx, s, "w1"); err != nil {
		t.Fatalf("a heartbeat after the shard came back: %v", err)
	}
}

// The master of a Sentinel setup dies after its replica: no Sentinel can
// promote one. The breaker opens, stays open, and closes when the master
// is back.
func TestBreakerOnASentinelMasterWithoutReplica(t *testing.T) {
	st := redistest.StartSentinel(t)
	s := openProbing(t, st.URL())
	ctx := context.Background()
	if err := beat(ctx, s, "w1"); err != nil {
		t.Fatal(err)
	}
	master, err := st.Master(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, srv := range st.Servers {
		if srv != master {
			srv.Stop()
		}
	}
	master.Stop()
	if err := beat(ctx, s, "w1"); err == nil || s.Up() {
		t.Fatalf("a heartbeat without a master: %v, breaker up %v", err, s.Up())
	}
	start := time.Now()
	for i := 0; i < 100; i++ {
		if err := beat(ctx, s, "w1"); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("call %d without a master: %v, want ErrUnavailable", i, err)
		}
	}
	t.Logf("100 heartbeats without a master failed in %s", time.Since(start))
	time.Sleep(500 * time.Millisecond)
	if s.Up() {
		t.Fatal("the breaker closed without a master")
	}
	master.Start()
	back := waitUp(t, s, 20*time.Second)
	t.Logf("the breaker closed %s after the master was back", back)
	if err := beat(ctx, s, "w1"); err != nil {
		t.Fatalf("a heartbeat after the master came back: %v", err)
	}
}
