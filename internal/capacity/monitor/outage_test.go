package monitor

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/capacity"
	"github.com/fleet-dev/fleet/internal/capacity/ledger"
	"github.com/fleet-dev/fleet/internal/redistest"
	"github.com/fleet-dev/fleet/job"
)

func openStore(t *testing.T, url string, probe time.Duration) *capacity.Store {
	t.Helper()
	s, err := capacity.Open(url, capacity.Config{Prefix: "fleettest", ProbeFirst: probe, ProbeMax: probe})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// logBuffer is a logger whose lines a test reads.
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

func (l *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

// Redis is cut off from the worker and the dispatcher for longer than a
// heartbeat TTL, keeping its data (a partition rather than a restart): the
// worker's heartbeat expires in it while the worker runs on. The reaper
// declares nobody lost while it cannot read Redis, says so once, and gives
// the worker one TTL after Redis answers to write its heartbeat again
// (here the worker's path heals 400 ms after the reaper's). A worker that
// dies after the return is found, and its job announced.
func TestReaperWaitsOutAnOutage(t *testing.T) {
	const interval = 200 * time.Millisecond
	srv := redistest.Start(t)
	workerPath, reaperPath := redistest.StartProxy(t, srv), redistest.StartProxy(t, srv)
	workerStore := openStore(t, workerPath.URL(), 20*time.Millisecond)
	reaperStore := openStore(t, reaperPath.URL(), 20*time.Millisecond)
	ctx := context.Background()
	w := ledger.New(workerStore, ledger.Config{WorkerID: "runner", Pool: "p", Backend: "process", Slots: 2, Interval: interval})
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer w.Stop(ctx)
	if err := w.Reserve(ctx, capacity.Lease{JobID: "long", Attempt: 1}); err != nil {
		t.Fatal(err)
	}

	var logs logBuffer
	var mu sync.Mutex
	var lost []string
	r := NewReaper(reaperStore, ReaperConfig{Interval: interval, Every: 20 * time.Millisecond, Logger: logs.logger(),
		Announce: func(_ context.Context, e *job.Event) error {
			mu.Lock()
			defer mu.Unlock()
			lost = append(lost, e.WorkerID+"/"+e.JobID)
			return nil
		}})
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer r.Stop(ctx)
	time.Sleep(2 * interval)

	workerPath.Cut()
	reaperPath.Cut()
	time.Sleep(6 * interval) // twice the TTL
	reaperPath.Heal()
	time.Sleep(2 * interval)
	workerPath.Heal()
	time.Sleep(4 * interval) // past the grace (3 intervals from the reaper's return)
	if !workerStore.Up() || !reaperStore.Up() {
		t.Fatal("the stores' breakers did not close after the partition healed")
	}
	mu.Lock()
	if len(lost) != 0 {
		t.Fatalf("the reaper declared lost, across an outage, a worker that ran on: %v", lost)
	}
	mu.Unlock()
	if n := strings.Count(logs.String(), "no worker is declared lost until Redis answers"); n != 1 {
		t.Errorf("the reaper logged the outage %d times, want once:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "workers have one heartbeat TTL to report") {
		t.Errorf("the reaper did not log the return:\n%s", logs.String())
	}

	// A worker that dies after the return (it beats once, with a lease,
	// and never again) is found.
	hb := &job.Heartbeat{WorkerID: "doomed", Pool: "p", Backend: "process", Version: "test", Health: job.HealthHealthy,
		ObservedAt: time.Now().UTC(), Slots: job.Slots{Total: 1}, Running: []job.RunningAttempt{}}
	if _, err := workerStore.Beat(ctx, capacity.Beat{Heartbeat: hb, TTL: 3 * interval, LeaseTTL: 5 * interval,
		Totals: capacity.Totals{Slots: 1}, Leases: []capacity.Lease{{JobID: "held", Attempt: 1}}}); err != nil {
		t.Fatal(err)
	}
	died := time.Now()
	for {
		mu.Lock()
		got := strings.Join(lost, " ")
		mu.Unlock()
		if got == "doomed/held" {
			t.Logf("the worker that died after the return was found %s after its last heartbeat (TTL %s)",
				time.Since(died).Round(time.Millisecond), 3*interval)
			break
		}
		if got != "" || time.Since(died) > 3*interval+2*time.Second {
			t.Fatalf("lost after the return: %q, want doomed/held", got)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// While Redis is away admission costs nothing and judges by its last view;
// when Redis comes back empty, a pool whose worker has not written its
// heartbeat again is not refused as having none for Settle, and what no
// worker could run is refused at once.
func TestAdmissionAcrossAnOutage(t *testing.T) {
	srv := redistest.Start(t)
	workerStore := openStore(t, srv.URL(), 20*time.Millisecond)
	admStore := openStore(t, srv.URL(), 20*time.Millisecond)
	ctx := context.Background()
	w := ledger.New(workerStore, ledger.Config{WorkerID: "w", Pool: "p", Backend: "process", Slots: 2,
		CPUMilli: ptr(2000), MemoryBytes: ptr(1 << 30), Interval: 100 * time.Millisecond})
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer w.Stop(ctx)
	var logs logBuffer
	a, err := NewAdmission(admStore, AdmitReject, logs.logger())
	if err != nil {
		t.Fatal(err)
	}
	const settle = 1500 * time.Millisecond
	a.Settle = settle
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer a.Stop(ctx)
	req := func(mem string) *job.Request {
		r := &job.Request{Pool: "p", Command: []string{"true"}, Resources: &job.Resources{Memory: mem}}
		r.Normalize()
		return r
	}
	admit := func(mem string) (string, error) {
		t.Helper()
		start := time.Now()
		warn, err := a.Admit(ctx, req(mem))
		if d := time.Since(start); d > 100*time.Millisecond {
			t.Errorf("Admit took %s", d)
		}
		return warn, err
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := admit("64Gi"); err != nil && strings.Contains(err.Error(), "needs 64Gi memory") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("admission never saw the worker")
		}
		time.Sleep(20 * time.Millisecond)
	}

	srv.Stop()
	time.Sleep(1200 * time.Millisecond) // several refreshes fail, at once
	if _, err := admit("64Gi"); err == nil {
		t.Error("with Redis just gone, admission let through what its last view says no worker could run")
	}
	if _, err := admit("256Mi"); err != nil {
		t.Errorf("with Redis just gone: %v", err)
	}
	// The worker does not come back (as one slower to notice Redis).
	_ = w.Stop(ctx)
	srv.Start() // empty
	for !admStore.Up() {
		time.Sleep(5 * time.Millisecond)
	}
	a.refresh(ctx)
	if hbs, err := admStore.Workers(ctx, "p"); err != nil || len(hbs) != 0 {
		t.Fatalf("workers after the return: %v %v, want none", hbs, err)
	}
	if warn, err := admit("256Mi"); err != nil {
		t.Errorf("a request that fits, while the worker has not reported again: %v (%s)", err, warn)
	}
	if _, err := admit("64Gi"); err == nil || !strings.Contains(err.Error(), "needs 64Gi memory") {
		t.Errorf("after the return, what no worker could run: %v", err)
	}
	if !strings.Contains(logs.String(), "capacity readable again") {
		t.Errorf("admission did not log the return:\n%s", logs.String())
	}
	// Once Settle has passed, the worker that did not report is gone (the
	// request waits FirstWorker for one to report, as for any pool with no
	// live worker).
	time.Sleep(settle)
	a.refresh(ctx)
	if _, err := a.Admit(ctx, req("256Mi")); err == nil || !strings.Contains(err.Error(), "has no live worker") {
		t.Errorf("past Settle, a pool whose worker never came back: %v", err)
	}
}
