package monitor

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/capacity/ledger"
	"github.com/fleet-dev/fleet/internal/redistest"
	"github.com/fleet-dev/fleet/job"
)

// TestAdmissionWaitsForAPoolsFirstWorker: a request for a pool whose
// worker starts just after it (the README's tour: a worker started in the
// background, and a submission at once) is admitted once the worker's
// first heartbeat is in Redis, not refused as for a pool with no live
// worker. A pool whose worker never comes is refused after FirstWorker,
// and a request that comes while another waits is answered with it.
func TestAdmissionWaitsForAPoolsFirstWorker(t *testing.T) {
	srv := redistest.Start(t)
	workerStore := openStore(t, srv.URL(), 20*time.Millisecond)
	admStore := openStore(t, srv.URL(), 20*time.Millisecond)
	ctx := context.Background()
	a, err := NewAdmission(admStore, AdmitReject, nil)
	if err != nil {
		t.Fatal(err)
	}
	if a.FirstWorker != 2*time.Second {
		t.Errorf("FirstWorker defaults to %s, want 2s", a.FirstWorker)
	}
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer a.Stop(ctx)
	// The view is read once (Start reads it in the background).
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, f := a.pool("late"); !f.IsZero() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("admission never read the view")
		}
	}
	req := func(pool string) *job.Request {
		r := &job.Request{Pool: pool, Command: []string{"true"}}
		r.Normalize()
		return r
	}

	// The worker starts 500 ms after the request.
	started := make(chan time.Time, 1)
	w := ledger.New(workerStore, ledger.Config{WorkerID: "late", Pool: "late", Backend: "process", Slots: 1, Interval: time.Second})
	go func() {
		time.Sleep(500 * time.Millisecond)
		if err := w.Start(ctx); err != nil {
			t.Error(err)
		}
		started <- time.Now()
	}()
	defer w.Stop(ctx)
	asked := time.Now()
	warn, err := a.Admit(ctx, req("late"))
	answered := time.Now()
	if err != nil {
		t.Fatalf("a request for a pool whose first worker started 500 ms after it: %v", err)
	}
	if warn != "" {
		t.Errorf("admitted with a warning: %s", warn)
	}
	if at := <-started; answered.Sub(at) > 500*time.Millisecond {
		t.Errorf("admitted %s after the worker's first heartbeat, want within a few polls", answered.Sub(at).Round(time.Millisecond))
	}
	t.Logf("admitted %s after it was asked", answered.Sub(asked).Round(time.Millisecond))

	// No worker ever: refused after FirstWorker; one asked a second later
	// shares the wait.
	var wg sync.WaitGroup
	var laterErr error
	var laterTook time.Duration
	wg.Add(1)
	go func() {
		defer wg.Done()
		time.Sleep(time.Second)
		start := time.Now()
		_, laterErr = a.Admit(ctx, req("empty"))
		laterTook = time.Since(start)
	}()
	start := time.Now()
	_, err = a.Admit(ctx, req("empty"))
	took := time.Since(start)
	wg.Wait()
	if err == nil || !strings.Contains(err.Error(), `pool "empty" has no live worker`) {
		t.Fatalf("a pool whose worker never comes: %v", err)
	}
	if took < a.FirstWorker-50*time.Millisecond || took > a.FirstWorker+time.Second {
		t.Errorf("refused after %s, want after about %s", took.Round(time.Millisecond), a.FirstWorker)
	}
	if laterErr == nil || !strings.Contains(laterErr.Error(), "has no live worker") {
		t.Errorf("the request asked during the wait: %v", laterErr)
	}
	if laterTook > a.FirstWorker-500*time.Millisecond {
		t.Errorf("the request asked a second into the wait was refused after %s, want with the first (about 1s)", laterTook.Round(time.Millisecond))
	}

	// With FirstWorker 0, refused at once.
	a.FirstWorker = 0
	start = time.Now()
	if _, err := a.Admit(ctx, req("empty")); err == nil {
		t.Error("FirstWorker 0: admitted a request for a pool with no worker")
	}
	if d := time.Since(start); d > 500*time.Millisecond {
		t.Errorf("FirstWorker 0: refused after %s, want at once", d.Round(time.Millisecond))
	}
}
