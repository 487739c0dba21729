package queue_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/natstest"
	"github.com/fleet-dev/fleet/internal/queue"
)

// logBuffer is a logger whose lines a test can read.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func newJS(t *testing.T, nc *nats.Conn) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// Two dispatchers set up a fresh three-node cluster at the same instant,
// while it still elects its meta leader: both finish, quickly, and the
// streams have their three replicas. A request sent before the cluster has
// a leader is dropped, not answered; before each call had a deadline of its
// own, both waited for their whole context.
func TestSetupOnAFreshClusterFromTwoProcessesAtOnce(t *testing.T) {
	c := natstest.RunCluster(t, 3)
	cfg := queue.Config{Replicas: 3}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := make(chan struct{})
	var wg sync.WaitGroup
	took := make([]time.Duration, 2)
	errs := make([]error, 2)
	logs := make([]*logBuffer, 2)
	for i := range 2 {
		js := newJS(t, c.Connect(t))
		logs[i] = &logBuffer{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			t0 := time.Now()
			if errs[i] = queue.Setup(ctx, js, cfg, logs[i].logger()); errs[i] == nil {
				_, errs[i] = queue.IntakeConsumerV2(ctx, js, cfg, logs[i].logger())
			}
			took[i] = time.Since(t0)
		}()
	}
	close(start)
	wg.Wait()
	for i := range 2 {
		if errs[i] != nil {
			t.Fatalf("setup %d: %v\n%s", i, errs[i], logs[i])
		}
		t.Logf("setup %d took %s", i, took[i].Round(time.Millisecond))
		// A lost answer costs one call's deadline (1s) and a retry, not
		// the caller's whole context.
		if took[i] > 10*time.Second {
			t.Errorf("setup %d took %s:\n%s", i, took[i], logs[i])
		}
	}

	js := newJS(t, c.Connect(t))
	for _, sc := range cfg.Streams() {
		info, err := js.Stream(ctx, sc.Name)
		if err != nil {
			t.Fatal(err)
		}
		ci := info.CachedInfo()
		if ci.Config.Replicas != 3 || ci.Cluster == nil || len(ci.Cluster.Replicas) != 2 {
			t.Errorf("stream %s: replicas %d, cluster %+v", sc.Name, ci.Config.Replicas, ci.Cluster)
		}
	}
	// Setting up again changes nothing and does not wait: what the server
	// stores equals what the fleet asks for, so an update is no conflict.
	t0 := time.Now()
	log := &logBuffer{}
	if err := queue.Setup(ctx, js, cfg, log.logger()); err != nil {
		t.Fatal(err)
	}
	if _, err := queue.IntakeConsumerV2(ctx, js, cfg, log.logger()); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d > 2*time.Second || strings.Contains(log.String(), "waiting") {
		t.Errorf("setting up an existing fleet took %s:\n%s", d, log)
	}
}

// A worker that starts before any dispatcher, on a cluster that has not
// elected its leaders yet, waits for the bucket and the jobs stream,
// saying so, and binds once a dispatcher has created them.
func TestWorkerSetupWaitsForTheClusterAndTheDispatcher(t *testing.T) {
	c := natstest.RunCluster(t, 3)
	cfg := queue.Config{Replicas: 3}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	wjs := newJS(t, c.Connect(t))
	log := &logBuffer{}
	type bound struct {
		cons jetstream.Consumer
		err  error
	}
	done := make(chan bound, 1)
	go func() {
		_, err := queue.OpenSealer(ctx, wjs, cfg.Names, false, log.logger())
		if err != nil {
			done <- bound{err: err}
			return
		}
		if err := queue.WorkerPoolStream(ctx, wjs, cfg, "default", log.logger()); err != nil {
			done <- bound{err: err}
			return
		}
		cons, err := queue.BindQueue(ctx, wjs, cfg, "default", queue.QueueKey{Priority: 3, Tenant: "default"})
		done <- bound{cons, err}
	}()
	// It waits, and says why.
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(log.String(), "waiting for JetStream") {
		if time.Now().After(deadline) {
			t.Fatalf("no log line while waiting:\n%s", log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case b := <-done:
		t.Fatalf("bound before a dispatcher created anything: %v", b.err)
	case <-time.After(3 * time.Second):
	}
	djs := newJS(t, c.Connect(t))
	if err := queue.Setup(ctx, djs, cfg, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := queue.OpenSealer(ctx, djs, cfg.Names, true, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case b := <-done:
		if b.err != nil {
			t.Fatalf("worker setup: %v\n%s", b.err, log)
		}
		if name := b.cons.CachedInfo().Name; name != "q3-default" {
			t.Errorf("consumer %s", name)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("worker setup still waits after the streams exist:\n%s", log)
	}
	if !strings.Contains(log.String(), "bucket fleet-keys") {
		t.Errorf("the log does not say what it waits for:\n%s", log)
	}
}

// What waiting cannot fix fails at once, with the server's reason: three
// replicas on a single server, and a user not allowed to use JetStream.
func TestSetupFailsAtOnceOnMisconfiguration(t *testing.T) {
	t.Run("replicas on a single server", func(t *testing.T) {
		s := natstest.Run(t)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		t0 := time.Now()
		err := queue.Setup(ctx, newJS(t, s.Connect(t)), queue.Config{Replicas: 3}, nil)
		if err == nil || !strings.Contains(err.Error(), "replicas > 1 not supported") {
			t.Fatalf("setup with 3 replicas on one server: %v", err)
		}
		if d := time.Since(t0); d > 5*time.Second {
			t.Errorf("took %s to fail", d)
		}
	})
	t.Run("no permission", func(t *testing.T) {
		s := natstest.Run(t, func(o *server.Options) {
			o.Users = []*server.User{{Username: "app", Password: "secret", Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Allow: []string{"fleet.>"}},
			}}}
		})
		nc, err := nats.Connect(s.URL(), nats.UserInfo("app", "secret"))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		t0 := time.Now()
		err = queue.Setup(ctx, newJS(t, nc), queue.Config{}, nil)
		if err == nil || !strings.Contains(err.Error(), "permissions violation") || !strings.Contains(err.Error(), "$JS.API") {
			t.Fatalf("setup without permission: %v", err)
		}
		if d := time.Since(t0); d > 10*time.Second {
			t.Errorf("took %s to fail", d)
		}
	})
}

// A connection given the whole seed list rides through the loss of its
// server: killed (the socket closes), then frozen (the socket stays open
// and nothing answers; only unanswered pings reveal it). Each time it
// moves to another node, and a replicated stream takes writes again.
func TestConnectToTheSeedListSurvivesAKilledAndAFrozenNode(t *testing.T) {
	c := natstest.RunCluster(t, 3)
	c.WaitReady(t, 30*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	log := &logBuffer{}
	nc, err := queue.Connect(ctx, queue.ConnConfig{URL: c.URLs(), Name: "seed-test", PingInterval: 500 * time.Millisecond, Logger: log.logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js := newJS(t, nc)
	if err := natstest.Retry(ctx, func(ctx context.Context) error {
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SEEDS", Subjects: []string{"seeds.>"}, Replicas: 3})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	publish := func(id string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			pctx, pcancel := context.WithTimeout(ctx, time.Second)
			_, err := js.Publish(pctx, "seeds."+id, []byte(id), jetstream.WithMsgID(id))
			pcancel()
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("publish %s: %v\n%s", id, err, log)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	publish("first")

	killed := c.Index(nc.ConnectedServerName())
	c.Kill(killed)
	publish("after-kill")
	if now := c.Index(nc.ConnectedServerName()); now == killed || now < 0 {
		t.Fatalf("still on %s after it was killed", c.Name(killed))
	}

	// The stream needs two of its three servers: bring the killed one back.
	c.Restart(killed)
	c.WaitReady(t, 30*time.Second)
	frozen := c.Index(nc.ConnectedServerName())
	c.Freeze(frozen)
	t0 := time.Now()
	publish("after-freeze")
	if now := c.Index(nc.ConnectedServerName()); now == frozen || now < 0 {
		t.Fatalf("still on %s after it froze (the publish was answered %s after the freeze)\n%s", c.Name(frozen), time.Since(t0).Round(time.Millisecond), log)
	}
	t.Logf("moved off a frozen server in %s", time.Since(t0).Round(time.Millisecond))
	c.Thaw(frozen)

	// Every write was acknowledged, so the stream holds all three. The
	// server just thawed may still take itself for the stream's leader
	// and answer with what it held when it froze (CI read 2): ask until
	// the cluster is current again, and hold the answer to 3 then.
	c.WaitReady(t, 30*time.Second)
	var n uint64
	for {
		ictx, icancel := context.WithTimeout(ctx, 2*time.Second)
		info, err := js.Stream(ictx, "SEEDS")
		icancel()
		if err == nil {
			if n = info.CachedInfo().State.Msgs; n == 3 {
				break
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("stream holds %d messages, want 3 (%v)", n, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if nc.Reconnects < 2 || !strings.Contains(log.String(), "reconnected to NATS") {
		t.Errorf("reconnects: %d\n%s", nc.Reconnects, log)
	}
}

// Connect keeps trying while no server answers, saying so, and connects
// once one does; without a bound of its own it waits until ctx ends.
func TestConnectWaitsForNATS(t *testing.T) {
	s := natstest.Run(t)
	url := s.URL()
	s.Shutdown()
	s.WaitForShutdown()
	log := &logBuffer{}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		nc, err := queue.Connect(ctx, queue.ConnConfig{URL: url, Logger: log.logger()})
		if err == nil {
			nc.Close()
		}
		done <- err
	}()
	time.Sleep(1500 * time.Millisecond)
	if !strings.Contains(log.String(), "waiting for NATS") {
		t.Fatalf("no log line while waiting:\n%s", log)
	}
	s.Restart()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("still not connected after NATS came back")
	}

	short, scancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer scancel()
	s.Shutdown()
	s.WaitForShutdown()
	if _, err := queue.Connect(short, queue.ConnConfig{URL: url}); err == nil ||
		!strings.Contains(err.Error(), "no servers available") || !strings.Contains(err.Error(), "deadline exceeded") {
		t.Errorf("connect to a stopped server: %v", err)
	}
}
