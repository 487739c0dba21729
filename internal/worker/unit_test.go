package worker

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

func TestBackoffDelayStaysWithinTheJitter(t *testing.T) {
	r := &job.Request{Retry: &job.RetryPolicy{}}
	init, maxb, jit := job.Duration(100*time.Millisecond), job.Duration(time.Second), 0.25
	r.Retry.InitialBackoff, r.Retry.MaxBackoff, r.Retry.Multiplier, r.Retry.Jitter = &init, &maxb, 3, &jit
	r.Normalize()
	for n, base := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 300 * time.Millisecond, 3: 900 * time.Millisecond, 4: time.Second, 9: time.Second} {
		lo, hi := time.Duration(float64(base)*(1-jit)), time.Duration(float64(base)*(1+jit))+1
		seen := map[time.Duration]bool{}
		for i := 0; i < 200; i++ {
			d := BackoffDelay(r.Retry, n)
			if d < lo || d > hi {
				t.Fatalf("attempt %d: delay %s outside [%s, %s]", n, d, lo, hi)
			}
			seen[d] = true
		}
		if len(seen) < 10 {
			t.Errorf("attempt %d: only %d distinct delays: no jitter?", n, len(seen))
		}
	}
	zero := 0.0
	r.Retry.Jitter = &zero
	if d := BackoffDelay(r.Retry, 2); d != 300*time.Millisecond {
		t.Errorf("without jitter, attempt 2 waits %s, want 300ms", d)
	}
}

func TestDeliveryLogLines(t *testing.T) {
	var buf bytes.Buffer
	h := slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		}})
	w := &Worker{log: slog.New(h).With("component", "worker")}
	d := &delivery{w: w, id: "j", key: queue.JobKey{Tenant: "acme", Pool: "default", ID: "j"}, n: 2, traceID: "t1"}
	d.log().Warn("unkeyed")
	d.logJob()
	d.logAttempt()
	d.n, d.logAdopted = 3, 2 // the attempt logged is the one known when logAttempt was called
	d.logFinished(&job.Result{Status: job.StatusSucceeded, Attempts: 2})
	d.logFinished(&job.Result{Status: job.StatusFailed, Attempts: 2})
	d.log().Warn("later", "err", "x")
	want := `level=WARN msg=unkeyed component=worker
level=INFO msg="job finished" component=worker job_id=j tenant=acme attempt=2 trace_id=t1 adopted_attempt=2 status=failed attempts=2
level=WARN msg=later component=worker job_id=j tenant=acme attempt=2 trace_id=t1 adopted_attempt=2 err=x
`
	if buf.String() != want {
		t.Errorf("log:\n%s\nwant:\n%s", buf.String(), want)
	}
	buf.Reset()
	w.log = slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	d.logFinished(&job.Result{Status: job.StatusSucceeded, Attempts: 1})
	if !strings.Contains(buf.String(), `level=DEBUG msg="job finished"`) || !strings.Contains(buf.String(), "status=succeeded") {
		t.Errorf("a succeeded job at debug: %q", buf.String())
	}
}
