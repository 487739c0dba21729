package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/dispatcher"
	"github.com/fleet-dev/fleet/internal/dockertest"
	"github.com/fleet-dev/fleet/internal/executor/docker"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/worker"
	"github.com/fleet-dev/fleet/job"
)

func dur(d time.Duration) *job.Duration { v := job.Duration(d); return &v }
func fl(f float64) *float64             { return &f }

func byType(evs []*job.Event, t job.EventType) []*job.Event {
	var out []*job.Event
	for _, e := range evs {
		if e.Type == t {
			out = append(out, e)
		}
	}
	return out
}

func TestRetriesFollowTheBackoffPolicy(t *testing.T) {
	f := fleettest.Start(t)
	f.Worker(t, processExec(t), worker.Config{Slots: 4})
	for _, jitter := range []float64{0.2, 0} {
		t.Run(fmt.Sprintf("jitter %g", jitter), func(t *testing.T) {
			id := f.Submit(t, &job.Request{ID: fmt.Sprintf("backoff-%g", jitter), Command: []string{"sh", "-c", "exit 1"},
				Retry: &job.RetryPolicy{MaxAttempts: 4, InitialBackoff: dur(200 * time.Millisecond), Multiplier: 2,
					MaxBackoff: dur(time.Second), Jitter: fl(jitter)}})
			r := f.Await(t, id, 30*time.Second)
			if r.Status != job.StatusFailed || r.Attempts != 4 || len(r.History) != 3 {
				t.Fatalf("result: %s after %d attempts, history %d", r.Status, r.Attempts, len(r.History))
			}
			evs := f.Events(t, id, 10*time.Second)
			retries, starts := byType(evs, job.EventRetryScheduled), byType(evs, job.EventStarted)
			if len(retries) != 3 || len(starts) != 4 {
				t.Fatalf("%d retries and %d starts: %s", len(retries), len(starts), eventTypes(evs))
			}
			for i, e := range retries {
				base := 200 * time.Millisecond << i // 200ms, 400ms, 800ms: under max_backoff
				lo, hi := time.Duration(float64(base)*(1-jitter)), time.Duration(float64(base)*(1+jitter))+time.Millisecond
				if d := e.Delay.Std(); d < lo || d > hi {
					t.Errorf("retry %d: delay %s outside [%s, %s]", i+1, d, lo, hi)
				}
				// The next attempt starts when it was scheduled, not before.
				gap := starts[i+1].Time.Sub(e.Time)
				if gap < lo-20*time.Millisecond || gap > hi+time.Second {
					t.Errorf("retry %d: next attempt started %s after it was scheduled with a delay of %s", i+1, gap, e.Delay)
				}
				if e.Failure == nil || e.Failure.Class != job.ClassExecution || e.Attempt != i+1 {
					t.Errorf("retry %d: %+v", i+1, e)
				}
			}
		})
	}
}

func TestRetryOnAndNonRetryableExitCodes(t *testing.T) {
	f := fleettest.Start(t)
	f.Worker(t, processExec(t), worker.Config{Slots: 4})
	fast := dur(50 * time.Millisecond)
	for _, tc := range []struct {
		name     string
		code     int
		policy   job.RetryPolicy
		attempts int
	}{
		{"execution not in retry_on", 1, job.RetryPolicy{MaxAttempts: 3, RetryOn: []job.FailureClass{job.ClassTimeout}}, 1},
		{"non-retryable exit code", 3, job.RetryPolicy{MaxAttempts: 3, NonRetryableExitCodes: []int{3}}, 1},
		{"other exit code", 4, job.RetryPolicy{MaxAttempts: 2, NonRetryableExitCodes: []int{3}}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.policy
			p.InitialBackoff = fast
			id := f.Submit(t, &job.Request{ID: strings.ReplaceAll(tc.name, " ", "-"),
				Command: []string{"sh", "-c", fmt.Sprintf("exit %d", tc.code)}, Retry: &p})
			r := f.Await(t, id, 20*time.Second)
			if r.Status != job.StatusFailed || r.Attempts != tc.attempts || *r.ExitCode != tc.code {
				t.Errorf("%s after %d attempts (exit %v), want failed after %d", r.Status, r.Attempts, *r.ExitCode, tc.attempts)
			}
		})
	}
}

func TestExhaustedJobIsDeadLetteredOnceAndRetried(t *testing.T) {
	f := fleettest.Start(t)
	f.Worker(t, processExec(t), worker.Config{Slots: 4})
	// Fails until it runs under a retried id.
	cmd := []string{"sh", "-c", `case "$FLEET_JOB_ID" in *-retry-*) echo fixed; exit 0;; esac; echo broken >&2; exit 2`}
	id := f.Submit(t, &job.Request{ID: "doomed", Command: cmd,
		Retry: &job.RetryPolicy{MaxAttempts: 2, InitialBackoff: dur(50 * time.Millisecond)}})
	r := f.Await(t, id, 20*time.Second)
	if r.Status != job.StatusFailed || r.Attempts != 2 {
		t.Fatalf("result: %+v", r)
	}
	evs := f.Events(t, id, 10*time.Second)
	if n := len(byType(evs, job.EventDeadLettered)); n != 1 {
		t.Errorf("%d dead_lettered events", n)
	}
	if last := evs[len(evs)-1]; last.Type != job.EventFailed {
		t.Errorf("the last event is %s, not the final one", last.Type)
	}
	ctx := context.Background()
	dls, err := f.Client.DeadLetters(ctx, "default")
	if err != nil || len(dls) != 1 || dls[0].JobID != id || dls[0].Attempts != 2 || dls[0].Failure.Code != job.CodeExitCode {
		t.Fatalf("dead letters: %+v %v", dls, err)
	}

	out, err := exec.Command(fleettest.Binary(t, "fleetctl"), "dlq", "retry", id, "--nats-url", f.NATS.URL()).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != id+"-retry-1" {
		t.Fatalf("fleetctl dlq retry: %v\n%s", err, out)
	}
	r = f.Await(t, id+"-retry-1", 20*time.Second)
	if r.Status != job.StatusSucceeded || r.Stdout != "fixed\n" {
		t.Errorf("the retried job: %+v", r)
	}
	if dls, _ := f.Client.DeadLetters(ctx, ""); len(dls) != 1 {
		t.Errorf("%d dead letters after the retry succeeded", len(dls))
	}
}

func TestCancelInEveryState(t *testing.T) {
	f := fleettest.Start(t)
	ctx := context.Background()
	nc := f.NATS.Connect(t)
	laterEar, ear := listen(t, nc, job.DefaultTenant, "later"), listen(t, nc, job.DefaultTenant, "default")
	cancel := func(id string) string {
		t.Helper()
		r, err := f.Client.Cancel(ctx, id)
		if err != nil {
			t.Fatalf("cancel %s: %v", id, err)
		}
		return r.Message
	}

	// Queued, with no worker yet: it is finished at once and never starts.
	queued := f.Submit(t, &job.Request{ID: "cancel-queued", Pool: "later", Command: []string{"true"}})
	cancel(queued)
	if r := f.Await(t, queued, 10*time.Second); r.Status != job.StatusCancelled || r.Attempts != 0 || r.StartedAt != nil {
		t.Fatalf("queued job: %+v", r)
	}
	f.Worker(t, processExec(t), worker.Config{Pool: "later", Slots: 2})
	f.Worker(t, processExec(t), worker.Config{Slots: 4})

	// Running: stopped, grace then kill, nothing left behind.
	marker := fmt.Sprintf("%d.%d", 50+time.Now().Nanosecond()%40, os.Getpid())
	running := f.Submit(t, &job.Request{ID: "cancel-running", Command: []string{"sleep", marker}})
	waitEvent(t, f, running, job.EventStarted)
	if msg := cancel(running); !strings.Contains(msg, "told to stop") {
		t.Errorf("cancel of a running job: %q", msg)
	}
	if r := f.Await(t, running, 10*time.Second); r.Status != job.StatusCancelled || r.Failure.Class != job.ClassCancelled {
		t.Fatalf("running job: %+v", r)
	}
	if pids := processesWith(marker); len(pids) > 0 {
		t.Errorf("cancelled process still running: %v", pids)
	}

	// Waiting for its next attempt: it is not tried again.
	waiting := f.Submit(t, &job.Request{ID: "cancel-waiting", Command: []string{"sh", "-c", "exit 1"},
		Retry: &job.RetryPolicy{MaxAttempts: 3, InitialBackoff: dur(1500 * time.Millisecond), Jitter: fl(0)}})
	waitEvent(t, f, waiting, job.EventRetryScheduled)
	cancel(waiting)
	if r := f.Await(t, waiting, 10*time.Second); r.Status != job.StatusCancelled || r.Attempts != 1 {
		t.Fatalf("waiting job: %+v", r)
	}
	time.Sleep(2 * time.Second) // past the retry it had
	for _, id := range []string{queued, waiting} {
		if n := len(byType(f.Events(t, id, 5*time.Second), job.EventStarted)); n > 1 || (id == queued && n > 0) {
			t.Errorf("%s started %d times after its cancel", id, n)
		}
	}

	// Twice, or after the end: a clear no-op.
	for _, id := range []string{running, waiting} {
		if msg := cancel(id); !strings.Contains(msg, "nothing to cancel") {
			t.Errorf("cancel of a finished job: %q", msg)
		}
	}
	if _, err := f.Client.Cancel(ctx, "no-such-job"); err == nil {
		t.Error("cancel of an unknown job did not fail")
	}
	// A cancel and a worker never both end a job.
	requireHistory(t, nc, job.DefaultTenant, "later", "", []string{queued}, laterEar)
	requireHistory(t, nc, job.DefaultTenant, "default", "", []string{running, waiting}, ear)
}

func waitEvent(t *testing.T, f *fleettest.Fleet, id string, typ job.EventType) *job.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for e, err := range f.Client.Events(ctx, id) {
		if err != nil {
			t.Fatalf("waiting for %s of %s: %v", typ, id, err)
		}
		if e.Type == typ {
			return e
		}
	}
	t.Fatalf("%s ended without a %s event", id, typ)
	return nil
}

func TestQueueTimeoutAndDeadline(t *testing.T) {
	f := fleettest.Start(t)
	stale := f.Submit(t, &job.Request{ID: "stale", Pool: "slow-to-start", Command: []string{"true"}, QueueTimeout: dur(time.Second)})
	time.Sleep(1500 * time.Millisecond)
	f.Worker(t, processExec(t), worker.Config{Pool: "slow-to-start", Slots: 2})
	r := f.Await(t, stale, 20*time.Second)
	if r.Status != job.StatusTimedOut || r.Failure.Code != job.CodeQueueTimeout || r.Attempts != 0 {
		t.Errorf("queue_timeout: %+v %+v", r, r.Failure)
	}

	f.Worker(t, processExec(t), worker.Config{Slots: 2})
	late := f.Submit(t, &job.Request{ID: "late", Command: []string{"sleep", "5"}, Timeout: dur(10 * time.Second),
		Deadline: dur(time.Second)})
	r = f.Await(t, late, 20*time.Second)
	if r.Status != job.StatusTimedOut || r.Failure.Code != job.CodeDeadline {
		t.Errorf("deadline during an attempt: %+v %+v", r, r.Failure)
	}
	retrying := f.Submit(t, &job.Request{ID: "late-retry", Command: []string{"sh", "-c", "exit 1"}, Deadline: dur(time.Second),
		Retry: &job.RetryPolicy{MaxAttempts: 5, InitialBackoff: dur(2 * time.Second)}})
	r = f.Await(t, retrying, 20*time.Second)
	if r.Status != job.StatusTimedOut || r.Failure.Code != job.CodeDeadline || r.Attempts != 1 {
		t.Errorf("deadline before a retry: %+v %+v", r, r.Failure)
	}
}

// A worker told to stop (SIGTERM) lets a job that ends within its drain
// timeout finish, and hands back the one that does not, at once, without
// counting it as an attempt: another worker runs it, its first attempt.
// The pool's ack wait is a minute, so that a job left to it instead would
// plainly come back late; the long job runs until the test lets it end,
// so that it cannot end within the drain however late the signal comes.
func TestDrainHandsJobsBackAtOnceWithoutCountingThem(t *testing.T) {
	const ackWait = time.Minute
	f := fleettest.Start(t, func(c *dispatcher.Config) { c.Queue.AckWait = ackWait })
	env := []string{"FLEET_NATS_URL=" + f.NATS.URL(), "FLEET_DATA_DIR=" + t.TempDir(), "FLEET_REDIS_URL="}
	first := fleettest.StartProc(t, "worker", env, "--id", "leaving", "--slots", "2", "--drain-timeout", "1s", "--grace", "200ms",
		"--ack-wait", ackWait.String())
	first.WaitOutput(t, "worker started", 20*time.Second)
	nc := f.NATS.Connect(t)
	ear := listen(t, nc, job.DefaultTenant, "default")
	release := filepath.Join(t.TempDir(), "release")
	quick := f.Submit(t, &job.Request{ID: "quick", Command: []string{"sleep", "0.5"}})
	long := f.Submit(t, &job.Request{ID: "long", Command: []string{"sh", "-c", "while [ ! -e " + release + " ]; do sleep 0.05; done"}})
	waitEvent(t, f, long, job.EventStarted)
	waitEvent(t, f, quick, job.EventStarted)

	stayer := f.Worker(t, processExec(t), worker.Config{ID: "staying", Slots: 2})
	first.Signal(syscall.SIGTERM)
	signalled := time.Now()
	if !first.Wait(10 * time.Second) {
		t.Fatal("the draining worker did not stop")
	}
	// The quick job finished on the leaving worker within the drain timeout.
	if r := f.Await(t, quick, 10*time.Second); r.Status != job.StatusSucceeded || r.WorkerID != "leaving" {
		t.Errorf("quick: %+v", r)
	}
	// The long one came back at once (not after the ack wait), and the
	// hand-back did not count as an attempt.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for e, err := range f.Client.Events(ctx, long) {
		if err != nil {
			t.Fatalf("long never started on the staying worker: %v", err)
		}
		if e.Type == job.EventStarted && e.WorkerID == "staying" {
			break
		}
	}
	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	r := f.Await(t, long, 20*time.Second)
	if r.Status != job.StatusSucceeded || r.WorkerID != "staying" || r.Attempts != 1 || len(r.History) != 0 {
		t.Fatalf("long: %+v", r)
	}
	if took := r.StartedAt.Sub(signalled); took >= ackWait/2 {
		t.Errorf("the handed-back job restarted %s after SIGTERM: it waited for the ack wait (%s)", took, ackWait)
	}
	evs := f.Events(t, long, 5*time.Second)
	if n := len(byType(evs, job.EventSucceeded)); n != 1 {
		t.Errorf("%d succeeded events", n)
	}
	_ = stayer
	// The hand-back gave back exactly the attempt it had recorded.
	requireHistory(t, nc, job.DefaultTenant, "default", "", []string{quick, long}, ear)
}

func TestOOMRetryRaisesMemory(t *testing.T) {
	cli := dockertest.Client(t)
	image := dockertest.TestImage(t)
	f := fleettest.Start(t)
	exec, err := docker.New(docker.Config{Dir: t.TempDir(), Grace: 500 * time.Millisecond, Logger: fleettest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer exec.Close()
	_ = cli
	f.Worker(t, exec, worker.Config{ID: "oom-worker", Slots: 2, Backend: "docker"})
	id := f.Submit(t, &job.Request{ID: "hungry", Image: image, PullPolicy: job.PullNever,
		Command:   []string{"/testprog", "sleep", "300ms", "alloc", fmt.Sprint(40 << 20), "echo", "fed"},
		Resources: &job.Resources{Memory: "16Mi"},
		Retry:     &job.RetryPolicy{MaxAttempts: 3, OOMMemoryMultiplier: 4, InitialBackoff: dur(100 * time.Millisecond)}})
	r := f.Await(t, id, 60*time.Second)
	if r.Status != job.StatusSucceeded || r.Attempts != 2 || len(r.History) != 1 || r.History[0].Failure.Class != job.ClassOOM {
		t.Fatalf("result: %+v history %+v", r, r.History)
	}
	retry := waitEvent(t, f, id, job.EventRetryScheduled)
	if !strings.Contains(retry.Message, "memory raised from 16Mi to 64Mi") {
		t.Errorf("retry event: %q", retry.Message)
	}
}

// TestNotBefore submits jobs that may not start for three seconds: they
// are accepted at once, their record says when they start, and they start
// after that instant, not before, with a queue_timeout counted from it.
func TestNotBefore(t *testing.T) {
	f := fleettest.Start(t)
	f.Worker(t, processExec(t), worker.Config{Slots: 4})
	ctx := context.Background()
	at := time.Now().Add(3 * time.Second).Truncate(time.Millisecond)
	var ids []string
	for i := range 3 {
		ids = append(ids, f.Submit(t, &job.Request{ID: fmt.Sprintf("not-before-%d", i), Command: []string{"true"},
			NotBefore: &at, QueueTimeout: dur(2 * time.Second)}))
	}
	st, err := f.Client.Status(ctx, ids[0])
	if err != nil {
		t.Fatal(err)
	}
	if rec := st.Job; rec.State != job.StateQueued || rec.NextAttemptAt == nil || !rec.NextAttemptAt.Equal(at) {
		t.Errorf("status before not_before: state %s, next attempt %v, want queued until %s", rec.State, rec.NextAttemptAt, at)
	}
	past := time.Now().Add(-time.Hour)
	now := f.Submit(t, &job.Request{ID: "not-before-past", Command: []string{"true"}, NotBefore: &past})
	if r := f.Await(t, now, 10*time.Second); r.Status != job.StatusSucceeded || !r.StartedAt.Before(at) {
		t.Errorf("a not_before in the past: %+v, want it run at once", r)
	}
	for _, id := range ids {
		r := f.Await(t, id, 20*time.Second)
		if r.Status != job.StatusSucceeded || r.Attempts != 1 {
			t.Errorf("%s: %s after %d attempts (%+v), want succeeded after 1", id, r.Status, r.Attempts, r.Failure)
			continue
		}
		if r.StartedAt == nil || r.StartedAt.Before(at) {
			t.Errorf("%s started at %v, before its not_before %s", id, r.StartedAt, at)
		}
	}
}

// TestPausedPoolStartsNothing pauses a pool: for ten seconds, while jobs
// arrive, none starts and the running one goes on; on resume they all
// run, none lost, and only the job whose own queue_timeout passed during
// the pause times out.
func TestPausedPoolStartsNothing(t *testing.T) {
	f := fleettest.Start(t)
	// The reads every PausePoll are a fallback: the worker watches.
	f.Worker(t, processExec(t), worker.Config{Pool: "paused", Slots: 4, PausePoll: time.Hour})
	ctx := context.Background()

	running := f.Submit(t, &job.Request{ID: "pause-running", Pool: "paused", Command: []string{"sleep", "2"}})
	waitEvent(t, f, running, job.EventStarted)
	s, err := f.Client.PausePool(ctx, "paused", "maintenance of the GPU nodes")
	if err != nil {
		t.Fatal(err)
	}
	if !s.Paused || s.Since == nil || s.Reason != "maintenance of the GPU nodes" {
		t.Fatalf("pause answered %+v", s)
	}
	if s, err := f.Client.Pool(ctx, "paused"); err != nil || !s.Paused {
		t.Fatalf("pool show: %+v, %v", s, err)
	}
	// Every job submitted once the pause has answered waits: the first at
	// once, the others over a few seconds.
	pausedAt := time.Now()
	var ids []string
	for i := range 6 {
		ids = append(ids, f.Submit(t, &job.Request{ID: fmt.Sprintf("pause-%d", i), Pool: "paused", Command: []string{"true"}}))
		if i > 0 {
			time.Sleep(500 * time.Millisecond)
		}
	}
	short := f.Submit(t, &job.Request{ID: "pause-short-queue-timeout", Pool: "paused", Command: []string{"true"},
		QueueTimeout: dur(2 * time.Second)})
	if r := f.Await(t, running, 10*time.Second); r.Status != job.StatusSucceeded {
		t.Errorf("the attempt running when the pool was paused: %+v", r)
	}
	for time.Since(pausedAt) < 10*time.Second {
		for _, id := range ids {
			st, err := f.Client.Status(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if st.Job.State != job.StateQueued {
				t.Fatalf("%s is %s while its pool is paused", id, st.Job.State)
			}
		}
		time.Sleep(500 * time.Millisecond)
	}

	if s, err := f.Client.ResumePool(ctx, "paused"); err != nil || s.Paused || s.Since != nil {
		t.Fatalf("resume: %+v, %v", s, err)
	}
	for _, id := range ids {
		if r := f.Await(t, id, 20*time.Second); r.Status != job.StatusSucceeded || r.Attempts != 1 {
			t.Errorf("%s after the resume: %s, %d attempts (%+v)", id, r.Status, r.Attempts, r.Failure)
		}
	}
	if r := f.Await(t, short, 20*time.Second); r.Status != job.StatusTimedOut || r.Failure.Code != job.CodeQueueTimeout {
		t.Errorf("a job whose queue_timeout passed during the pause: %s %+v", r.Status, r.Failure)
	}

	if _, err := f.Client.PausePool(ctx, "paused", "line\nbreak"); err == nil {
		t.Error("a reason with a control character was accepted")
	}
	if _, err := f.Client.Pool(ctx, "not a pool"); err == nil {
		t.Error("an invalid pool name was accepted")
	}
}
