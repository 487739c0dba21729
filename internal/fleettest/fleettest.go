// Package fleettest starts fleets for tests: a real NATS server with
// JetStream, a dispatcher and workers, in the test process or as real
// processes that tests may kill.
package fleettest

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/internal/dispatcher"
	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/natstest"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/internal/worker"
	"github.com/fleet-dev/fleet/job"
)

// Fleet is a NATS server and a dispatcher running in the test process.
type Fleet struct {
	NATS       *natstest.Server
	NC         *nats.Conn
	Dispatcher *dispatcher.Dispatcher
	API        *httptest.Server
	Client     *client.Client
	Queue      queue.Config
}

// Option adjusts a fleet before it starts.
type Option func(*dispatcher.Config)

// Start starts NATS and a dispatcher with its HTTP API; they stop when the
// test ends. Streams are kept in files, as in production.
func Start(t testing.TB, opts ...Option) *Fleet {
	t.Helper()
	return StartOn(t, natstest.Run(t), opts...)
}

// StartOn starts a fleet, as Start, on a NATS server of the test's.
func StartOn(t testing.TB, srv *natstest.Server, opts ...Option) *Fleet {
	t.Helper()
	f := &Fleet{NATS: srv}
	f.NC = f.NATS.Connect(t)
	cfg := dispatcher.Config{Queue: queue.Config{AckWait: 5 * time.Second}, Logger: Logger(t)}
	for _, o := range opts {
		o(&cfg)
	}
	f.Queue = cfg.Queue
	d, err := dispatcher.New(f.NC, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = d.Stop(ctx)
	})
	// The server has the dispatcher's subscriptions before any request of
	// the test's other connections.
	if err := f.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	f.Dispatcher = d
	f.API = httptest.NewServer(dispatcher.NewAPI(d))
	t.Cleanup(f.API.Close)
	f.Client, err = client.New(f.NATS.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// Worker starts a worker in the test process; it stops when the test ends.
func (f *Fleet) Worker(t testing.TB, exec executor.Executor, cfg worker.Config) *worker.Worker {
	t.Helper()
	if cfg.Queue.AckWait == 0 {
		cfg.Queue = f.Queue
	}
	if cfg.Backend == "" {
		cfg.Backend = "process"
	}
	if cfg.ID == "" {
		cfg.ID = "w-" + job.NewID()[16:]
	}
	if cfg.Logger == nil {
		cfg.Logger = Logger(t)
	}
	w, err := worker.New(f.NATS.Connect(t), exec, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = w.Stop(ctx)
	})
	return w
}

// Await waits for a job's result.
func (f *Fleet) Await(t testing.TB, id string, within time.Duration) *job.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	r, err := f.Client.Result(ctx, id)
	if err != nil {
		t.Fatalf("result of %s: %v", id, err)
	}
	return r
}

// Events returns a job's events once it has ended.
func (f *Fleet) Events(t testing.TB, id string, within time.Duration) []*job.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	var out []*job.Event
	for e, err := range f.Client.Events(ctx, id) {
		if err != nil {
			t.Fatalf("events of %s: %v", id, err)
		}
		out = append(out, e)
	}
	return out
}

// Submit submits a request and fails the test unless it is accepted.
func (f *Fleet) Submit(t testing.TB, r *job.Request) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := f.Client.Submit(ctx, r)
	if err != nil {
		t.Fatalf("submit: %v", err)
	}
	return s.JobID
}

// Logger logs warnings and errors through the test's log, so that they
// show only when the test fails or runs with -v.
func Logger(t testing.TB) *slog.Logger {
	w := &testWriter{t: t}
	t.Cleanup(func() { w.mu.Lock(); w.done = true; w.mu.Unlock() })
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// testWriter writes to the test's log until the test ends, and to stderr
// after, since testing panics on a log after the end.
type testWriter struct {
	t    testing.TB
	mu   sync.Mutex
	done bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return os.Stderr.Write(p)
	}
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
