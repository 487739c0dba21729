package worker

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/job"
)

// TestDecide holds every branch of decide to what it must do, without NATS.
func TestDecide(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	sub := now.Add(-time.Minute)
	started := now.Add(-30 * time.Second)
	exit := func(c int) *int { return &c }
	failed := func(class job.FailureClass, code job.FailureCode, exitCode *int) *executor.Outcome {
		return &executor.Outcome{Status: executor.StatusOf(&job.Failure{Class: class}), ExitCode: exitCode,
			Failure: job.Failf(class, code, "it failed"), StartedAt: started, FinishedAt: now}
	}
	request := func(edit func(r *job.Request)) *job.Request {
		r := &job.Request{ID: "j", Command: []string{"true"}, Resources: &job.Resources{Memory: "256Mi"},
			Retry: &job.RetryPolicy{MaxAttempts: 3}}
		if edit != nil {
			edit(r)
		}
		r.Normalize()
		return r
	}
	queued := func() *job.Record { return &job.Record{ID: "j", State: job.StateQueued} }
	runningOn := func(worker string, attempt int) *job.Record {
		return &job.Record{ID: "j", State: job.StateRunning, Attempt: attempt, WorkerID: worker, StartedAt: &started}
	}
	running := &executor.Found{Standing: executor.Running, Handle: "Job ns/fleet-j-a1-x"}
	ended := &executor.Found{Standing: executor.Ended, Handle: "Job ns/fleet-j-a1-x"}
	gone := &executor.Found{Standing: executor.Gone, Why: "no Job of attempt 1 in namespace ns"}
	unreachable := &executor.Found{Standing: executor.Unreachable, Why: "its container is on another Docker host"}
	cancelled := func(r *job.Record) *job.Record { r.CancelRequested = true; return r }
	awaiting := func(r *job.Record, since time.Time) *job.Record { r.AwaitingSince = &since; return r }

	cases := []struct {
		name string
		s    situation
		want action
		// check looks further at what decide returned.
		check func(t *testing.T, a action)
	}{
		{
			name: "a first delivery runs attempt 1",
			s:    situation{rec: queued(), req: request(nil)},
			want: action{verb: doRun, attempt: 1},
		},
		{
			name: "a message that is not a request is refused",
			s:    situation{malformed: errors.New("invalid request: command is missing")},
			want: action{verb: doRefuse, why: "command is missing"},
		},
		{
			name: "a record that cannot be read leaves the job for later, with nothing written",
			s:    situation{rec: queued(), req: request(nil), unsettled: errors.New("nats: timeout")},
			want: action{verb: doLater, attempt: 1, delay: laterDelay, why: "nats: timeout"},
		},
		{
			name: "no capacity for the attempt leaves the job for a worker with room, with nothing written",
			s:    situation{rec: queued(), req: request(nil), noCapacity: "no capacity for this attempt: needs 4 CPU, 1 left"},
			want: action{verb: doLater, attempt: 1, delay: misfitDelay, why: "needs 4 CPU"},
		},
		{
			name: "no capacity to adopt an attempt leaves it running for a worker with room",
			s:    situation{rec: runningOn("w0", 2), req: request(nil), found: running, noCapacity: "all slots are in use"},
			want: action{verb: doLater, attempt: 3, delay: misfitDelay, why: "all slots"},
		},
		{
			name: "a draining worker hands the job back",
			s:    situation{rec: queued(), req: request(nil), draining: true},
			want: action{verb: doRequeue, attempt: 1},
		},
		{
			name: "a copy of a finished job is acknowledged",
			s:    situation{rec: &job.Record{ID: "j", State: job.StateSucceeded, Attempt: 1}, req: request(nil)},
			want: action{verb: doAck, attempt: 2},
		},
		{
			name: "a cancel that raced the delivery finishes the job cancelled",
			s:    situation{rec: &job.Record{ID: "j", State: job.StateQueued, CancelRequested: true}, req: request(nil)},
			want: action{verb: doFinish, attempt: 1, attempts: 0, outcome: wantOutcome(job.StatusCancelled, job.ClassCancelled, job.CodeCancelled, nil)},
			check: func(t *testing.T, a action) {
				wantFailure(t, a, job.StatusCancelled, job.ClassCancelled, job.CodeCancelled)
			},
		},
		{
			name: "a job past its deadline is finished timed out",
			s: situation{rec: queued(), req: request(func(r *job.Request) { d := job.Duration(30 * time.Second); r.Deadline = &d }),
				submitted: sub},
			want: action{verb: doFinish, attempt: 1, attempts: 0, outcome: wantOutcome(job.StatusTimedOut, job.ClassTimeout, job.CodeDeadline, nil)},
			check: func(t *testing.T, a action) {
				wantFailure(t, a, job.StatusTimedOut, job.ClassTimeout, job.CodeDeadline)
			},
		},
		{
			name: "a job queued longer than its queue_timeout is finished timed out",
			s: situation{rec: queued(), req: request(func(r *job.Request) { d := job.Duration(time.Second); r.QueueTimeout = &d }),
				submitted: sub},
			want: action{verb: doFinish, attempt: 1, attempts: 0, outcome: wantOutcome(job.StatusTimedOut, job.ClassTimeout, job.CodeQueueTimeout, nil)},
			check: func(t *testing.T, a action) {
				wantFailure(t, a, job.StatusTimedOut, job.ClassTimeout, job.CodeQueueTimeout)
			},
		},
		{
			name: "a job whose not_before is ahead is left until then, with nothing written",
			s: situation{rec: queued(), req: request(func(r *job.Request) { nb := now.Add(90 * time.Second); r.NotBefore = &nb }),
				submitted: sub},
			want: action{verb: doLater, attempt: 1, delay: 90 * time.Second},
		},
		{
			name: "a delivery while the pool is paused is left, with nothing written",
			s:    situation{rec: queued(), req: request(nil), submitted: sub, paused: true},
			want: action{verb: doLater, attempt: 1, delay: pausedRecheck},
		},
		{
			name: "a cancel of a job of a paused pool still finishes it",
			s:    situation{rec: cancelled(queued()), req: request(nil), submitted: sub, paused: true},
			want: action{verb: doFinish, attempt: 1, attempts: 0, outcome: wantOutcome(job.StatusCancelled, job.ClassCancelled, job.CodeCancelled, nil)},
		},
		{
			name: "a job whose not_before has passed runs",
			s: situation{rec: queued(), req: request(func(r *job.Request) { nb := now.Add(-time.Second); r.NotBefore = &nb }),
				submitted: sub},
			want: action{verb: doRun, attempt: 1},
		},
		{
			name: "queue_timeout counts from not_before when that is later than the submission",
			s: situation{rec: queued(), req: request(func(r *job.Request) {
				d, nb := job.Duration(40*time.Second), sub.Add(30*time.Second)
				r.QueueTimeout, r.NotBefore = &d, &nb
			}), submitted: sub},
			want: action{verb: doRun, attempt: 1},
		},
		{
			name: "queue_timeout after not_before times the job out",
			s: situation{rec: queued(), req: request(func(r *job.Request) {
				d, nb := job.Duration(20*time.Second), sub.Add(30*time.Second)
				r.QueueTimeout, r.NotBefore = &d, &nb
			}), submitted: sub},
			want: action{verb: doFinish, attempt: 1, attempts: 0, outcome: wantOutcome(job.StatusTimedOut, job.ClassTimeout, job.CodeQueueTimeout, nil)},
			check: func(t *testing.T, a action) {
				wantFailure(t, a, job.StatusTimedOut, job.ClassTimeout, job.CodeQueueTimeout)
			},
		},
		{
			name: "a cancel of a job waiting for its not_before finishes it cancelled",
			s: situation{rec: cancelled(queued()), req: request(func(r *job.Request) { nb := now.Add(time.Hour); r.NotBefore = &nb }),
				submitted: sub},
			want: action{verb: doFinish, attempt: 1, attempts: 0, outcome: wantOutcome(job.StatusCancelled, job.ClassCancelled, job.CodeCancelled, nil)},
		},
		{
			name: "queue_timeout does not apply once the job has started",
			s: situation{rec: &job.Record{ID: "j", State: job.StateRetrying, Attempt: 1, StartedAt: &started},
				req: request(func(r *job.Request) { d := job.Duration(time.Second); r.QueueTimeout = &d }), submitted: sub},
			want: action{verb: doRun, attempt: 2},
		},
		{
			name: "a lost attempt is recorded and the next one runs at once",
			s:    situation{rec: runningOn("w1", 1), req: request(nil)},
			want: action{verb: doRun, attempt: 2, restart: true, lost: lostOn(1, "w1")},
			check: func(t *testing.T, a action) {
				if len(a.lost) != 1 || a.lost[0].Attempt != 1 || a.lost[0].WorkerID != "w1" || a.lost[0].Failure.Code != job.CodeWorkerLost ||
					!strings.Contains(a.lost[0].Failure.Message, "w1 stopped responding") {
					t.Errorf("lost %+v", a.lost)
				}
			},
		},
		{
			name: "a job whose worker still runs it is left to that worker",
			s:    situation{rec: runningOn("w1", 1), req: request(nil), ownerRuns: true, recheck: 30 * time.Second},
			want: action{verb: doLater, attempt: 2, delay: 30 * time.Second},
		},
		{
			name: "a delivery that ended before its attempt was recorded is not an attempt",
			s:    situation{rec: queued(), req: request(nil)},
			want: action{verb: doRun, attempt: 1},
			check: func(t *testing.T, a action) {
				if len(a.lost) != 0 {
					t.Errorf("lost %+v", a.lost)
				}
			},
		},
		{
			name: "a lost attempt does not use up max_attempts",
			s:    situation{rec: runningOn("w1", 3), req: request(nil)},
			want: action{verb: doRun, attempt: 4, restart: true, lost: lostOn(3, "w1")},
		},
		{
			name: "lost attempts are run again whatever retry_on says",
			s:    situation{rec: runningOn("w1", 1), req: request(func(r *job.Request) { r.Retry.RetryOn = []job.FailureClass{} })},
			want: action{verb: doRun, attempt: 2, restart: true, lost: lostOn(1, "w1")},
		},
		{
			name: "more lost attempts than max_lost fail the job",
			s: situation{rec: withHistory(runningOn("w4", 4), lostAttempt(1), lostAttempt(2), lostAttempt(3)),
				req: request(nil)},
			want: action{verb: doFinish, attempt: 5, attempts: 4, outcome: wantOutcome(job.StatusFailed, job.ClassInfrastructure, job.CodeWorkerLost, nil)},
			check: func(t *testing.T, a action) {
				wantFailure(t, a, job.StatusFailed, job.ClassInfrastructure, job.CodeWorkerLost)
				// The lost attempt is the job's last: the result describes
				// it, so that attempts are the history and one.
				if len(a.lost) != 0 || !strings.Contains(a.outcome.Failure.Message, "w4 stopped responding during attempt 4") ||
					!strings.Contains(a.outcome.Failure.Message, "max_lost 3") {
					t.Errorf("lost %+v, failure %+v", a.lost, a.outcome.Failure)
				}
			},
		},
		{
			name: "with max_lost 0 the first lost attempt fails the job",
			s:    situation{rec: runningOn("w1", 1), req: request(func(r *job.Request) { zero := 0; r.Retry.MaxLost = &zero })},
			want: action{verb: doFinish, attempt: 2, attempts: 1, outcome: wantOutcome(job.StatusFailed, job.ClassInfrastructure, job.CodeWorkerLost, nil)},
			check: func(t *testing.T, a action) {
				wantFailure(t, a, job.StatusFailed, job.ClassInfrastructure, job.CodeWorkerLost)
			},
		},
		{
			name: "hand-backs are not attempts",
			s:    situation{rec: &job.Record{ID: "j", State: job.StateQueued, Handbacks: 2}, req: request(nil)},
			want: action{verb: doRun, attempt: 1},
		},
		{
			name: "a request the executor refuses is rejected",
			s:    situation{rec: queued(), req: request(nil), refused: errors.New("docker executor cannot run it: no image")},
			want: action{verb: doFinish, attempt: 1, attempts: 1, outcome: wantOutcome(job.StatusFailed, job.ClassRejected, job.CodeInvalid, nil)},
			check: func(t *testing.T, a action) {
				wantFailure(t, a, job.StatusFailed, job.ClassRejected, job.CodeInvalid)
			},
		},
		{
			name: "a succeeded attempt finishes the job",
			s: situation{rec: runningOn("w", 1), req: request(nil),
				outcome: &executor.Outcome{Status: job.StatusSucceeded, ExitCode: exit(0)}},
			want: action{verb: doFinish, attempt: 1, attempts: 1, outcome: wantOutcome(job.StatusSucceeded, "", "", exit(0))},
		},
		{
			name: "a failed attempt with attempts left is retried after the backoff",
			s: situation{rec: runningOn("w", 1), req: request(nil), now: now,
				outcome: failed(job.ClassExecution, job.CodeExitCode, exit(1))},
			want: action{verb: doRetry, attempt: 1, delay: 7 * time.Second, outcome: wantOutcome(job.StatusFailed, job.ClassExecution, job.CodeExitCode, exit(1))},
		},
		{
			name: "a lost attempt leaves the attempts that failed their budget",
			s: situation{rec: withHistory(runningOn("w", 3), lostAttempt(1)), req: request(nil), now: now,
				outcome: failed(job.ClassExecution, job.CodeExitCode, exit(1))},
			want: action{verb: doRetry, attempt: 3, delay: 9 * time.Second, outcome: wantOutcome(job.StatusFailed, job.ClassExecution, job.CodeExitCode, exit(1))},
		},
		{
			name: "the last attempt's failure is the job's",
			s: situation{rec: runningOn("w", 3), req: request(nil), now: now,
				outcome: failed(job.ClassExecution, job.CodeExitCode, exit(1))},
			want: action{verb: doFinish, attempt: 3, attempts: 3, outcome: wantOutcome(job.StatusFailed, job.ClassExecution, job.CodeExitCode, exit(1))},
		},
		{
			name: "a non-retryable exit code is not retried",
			s: situation{rec: runningOn("w", 1), req: request(func(r *job.Request) { r.Retry.NonRetryableExitCodes = []int{2} }),
				now: now, outcome: failed(job.ClassExecution, job.CodeExitCode, exit(2))},
			want: action{verb: doFinish, attempt: 1, attempts: 1, outcome: wantOutcome(job.StatusFailed, job.ClassExecution, job.CodeExitCode, exit(2))},
		},
		{
			name: "a class not in retry_on is not retried",
			s: situation{rec: runningOn("w", 1), req: request(func(r *job.Request) { r.Retry.RetryOn = []job.FailureClass{job.ClassTimeout} }),
				now: now, outcome: failed(job.ClassExecution, job.CodeExitCode, exit(1))},
			want: action{verb: doFinish, attempt: 1, attempts: 1, outcome: wantOutcome(job.StatusFailed, job.ClassExecution, job.CodeExitCode, exit(1))},
		},
		{
			name: "an OOM is retried with more memory",
			s: situation{rec: runningOn("w", 1), req: request(func(r *job.Request) { r.Retry.OOMMemoryMultiplier = 2 }),
				now: now, outcome: failed(job.ClassOOM, job.CodeOOMKilled, exit(137))},
			want: action{verb: doRetry, attempt: 1, delay: 7 * time.Second, memory: "512Mi", outcome: wantOutcome(job.StatusFailed, job.ClassOOM, job.CodeOOMKilled, exit(137))},
		},
		{
			name: "an OOM at the memory cap is not retried",
			s: situation{rec: runningOn("w", 1), req: request(func(r *job.Request) {
				r.Retry.OOMMemoryMultiplier, r.Retry.MaxMemory = 2, "256Mi"
			}), now: now, outcome: failed(job.ClassOOM, job.CodeOOMKilled, exit(137))},
			want: action{verb: doFinish, attempt: 1, attempts: 1, outcome: wantOutcome(job.StatusFailed, job.ClassOOM, job.CodeOOMKilled, exit(137))},
		},
		{
			name: "a retry that could not start before the deadline times the job out",
			s: situation{rec: runningOn("w", 1), req: request(func(r *job.Request) { d := job.Duration(61 * time.Second); r.Deadline = &d }),
				submitted: sub, now: now, outcome: failed(job.ClassExecution, job.CodeExitCode, exit(1))},
			want: action{verb: doFinish, attempt: 1, attempts: 1, outcome: wantOutcome(job.StatusTimedOut, job.ClassTimeout, job.CodeDeadline, exit(1))},
			check: func(t *testing.T, a action) {
				wantFailure(t, a, job.StatusTimedOut, job.ClassTimeout, job.CodeDeadline)
			},
		},
		{
			name: "a timeout cut short by the deadline is the deadline's",
			s: situation{rec: runningOn("w", 1), req: request(func(r *job.Request) { r.Retry.MaxAttempts = 1 }), now: now,
				outcome: failed(job.ClassTimeout, job.CodeAttemptTimeout, nil), deadlineBound: true},
			want: action{verb: doFinish, attempt: 1, attempts: 1, outcome: wantOutcome(job.StatusTimedOut, job.ClassTimeout, job.CodeDeadline, nil)},
			check: func(t *testing.T, a action) {
				wantFailure(t, a, job.StatusTimedOut, job.ClassTimeout, job.CodeDeadline)
			},
		},
		{
			name: "an attempt stopped for a drain hands the job back",
			s: situation{rec: runningOn("w", 1), req: request(nil), now: now, requeued: true,
				outcome: &executor.Outcome{Status: job.StatusCancelled, Failure: job.Failf(job.ClassCancelled, job.CodeCancelled, "drain")}},
			want: action{verb: doRequeue, attempt: 1},
		},
		{
			name: "an attempt that succeeded while the worker drained is kept",
			s: situation{rec: runningOn("w", 1), req: request(nil), now: now, requeued: true,
				outcome: &executor.Outcome{Status: job.StatusSucceeded}},
			want: action{verb: doFinish, attempt: 1, attempts: 1, outcome: wantOutcome(job.StatusSucceeded, "", "", nil)},
		},
		// Adoption: an attempt whose worker is gone may still run in its
		// backend.
		{
			name: "an orphan whose attempt still runs is adopted, and the attempt count stays",
			s:    situation{rec: runningOn("w1", 2), req: request(nil), found: running},
			want: action{verb: doAdopt, attempt: 2, found: running},
			check: func(t *testing.T, a action) {
				if a.found != running || len(a.lost) != 0 || a.restart {
					t.Errorf("found %+v, lost %+v, restart %v", a.found, a.lost, a.restart)
				}
			},
		},
		{
			name: "a worker restarted with the same id adopts its own attempt",
			s:    situation{rec: runningOn("w1", 1), req: request(nil), found: running},
			want: action{verb: doAdopt, attempt: 1, found: running},
		},
		{
			name: "an attempt that ended while no worker watched is adopted to be settled from its status",
			s:    situation{rec: runningOn("w1", 1), req: request(nil), found: ended},
			want: action{verb: doAdopt, attempt: 1, found: ended},
		},
		{
			name: "an attempt that is gone is lost, and the next one runs",
			s:    situation{rec: runningOn("w1", 1), req: request(nil), found: gone},
			want: action{verb: doRun, attempt: 2, restart: true, lost: lostOn(1, "w1")},
			check: func(t *testing.T, a action) {
				if len(a.lost) != 1 || !strings.Contains(a.lost[0].Failure.Message, "no Job of attempt 1") {
					t.Errorf("lost %+v", a.lost)
				}
			},
		},
		{
			name: "a running orphan is adopted even when it was cancelled meanwhile, to be stopped",
			s:    situation{rec: cancelled(runningOn("w1", 1)), req: request(nil), found: running},
			want: action{verb: doAdopt, attempt: 1, found: running},
		},
		{
			name: "a running orphan is adopted even past the deadline, to be stopped",
			s: situation{rec: runningOn("w1", 1), req: request(func(r *job.Request) { d := job.Duration(30 * time.Second); r.Deadline = &d }),
				submitted: sub, found: running},
			want: action{verb: doAdopt, attempt: 1, found: running},
		},
		{
			name: "a draining worker adopts nothing",
			s:    situation{rec: runningOn("w1", 1), req: request(nil), found: running, draining: true},
			want: action{verb: doRequeue, attempt: 2},
		},
		{
			name: "an attempt only its owner can reach waits for the owner",
			s:    situation{rec: runningOn("w1", 1), req: request(nil), found: unreachable, adoptWait: 10 * time.Minute, recheck: 30 * time.Second},
			want: action{verb: doAwaitOwner, attempt: 1, delay: 30 * time.Second},
		},
		{
			name: "the wait for the owner ends at the adopt wait",
			s: situation{rec: awaiting(runningOn("w1", 1), now.Add(-9*time.Minute-50*time.Second)), req: request(nil), found: unreachable,
				adoptWait: 10 * time.Minute, recheck: 30 * time.Second},
			want: action{verb: doAwaitOwner, attempt: 1, delay: 10 * time.Second},
		},
		{
			name: "an owner that does not come back within the adopt wait loses the attempt",
			s: situation{rec: awaiting(runningOn("w1", 1), now.Add(-11*time.Minute)), req: request(nil), found: unreachable,
				adoptWait: 10 * time.Minute, recheck: 30 * time.Second},
			want: action{verb: doRun, attempt: 2, restart: true, lost: lostOn(1, "w1")},
			check: func(t *testing.T, a action) {
				if len(a.lost) != 1 || !strings.Contains(a.lost[0].Failure.Message, "did not come back within the adopt wait of 10m0s") {
					t.Errorf("lost %+v", a.lost)
				}
			},
		},
		{
			name: "a cancel while waiting for the owner finishes the job",
			s:    situation{rec: cancelled(runningOn("w1", 1)), req: request(nil), found: unreachable, adoptWait: 10 * time.Minute},
			want: action{verb: doFinish, attempt: 2, attempts: 1, outcome: wantOutcome(job.StatusCancelled, job.ClassCancelled, job.CodeCancelled, nil)},
			check: func(t *testing.T, a action) {
				wantFailure(t, a, job.StatusCancelled, job.ClassCancelled, job.CodeCancelled)
			},
		},
		{
			name: "an attempt handed off by a stopping worker gives the message back, record unchanged",
			s: situation{rec: runningOn("w", 1), req: request(nil), now: now, leftRunning: true,
				outcome: &executor.Outcome{Status: job.StatusCancelled, Failure: job.Failf(job.ClassCancelled, job.CodeCancelled, "hand off")}},
			want: action{verb: doLeaveRunning, attempt: 1},
		},
		{
			name: "an adopted attempt that succeeded finishes the job with its attempt count",
			s: situation{rec: runningOn("w2", 3), req: request(nil), now: now,
				outcome: &executor.Outcome{Status: job.StatusSucceeded, ExitCode: exit(0)}},
			want: action{verb: doFinish, attempt: 3, attempts: 3, outcome: wantOutcome(job.StatusSucceeded, "", "", exit(0))},
		},
		{
			name: "a worker that cannot run the request leaves it for one that can",
			s:    situation{rec: queued(), req: request(nil), misfit: errors.New("no GPU of model H100 on this host")},
			want: action{verb: doLater, attempt: 1, delay: misfitDelay},
		},
		{
			name: "a first delivery is left a moment for a worker that has the image",
			s:    situation{rec: queued(), req: request(nil), elsewhere: "another worker has image x cached"},
			want: action{verb: doLater, attempt: 1, delay: preferDelay},
		},
		{
			name: "a cancelled attempt finishes the job cancelled",
			s: situation{rec: runningOn("w", 1), req: request(nil), now: now,
				outcome: &executor.Outcome{Status: job.StatusCancelled, Failure: job.Failf(job.ClassCancelled, job.CodeCancelled, "stop")}},
			want: action{verb: doFinish, attempt: 1, attempts: 1, outcome: wantOutcome(job.StatusCancelled, job.ClassCancelled, job.CodeCancelled, nil)},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := c.s
			if s.now.IsZero() {
				s.now = now
			}
			s.retryDelay = func(p *job.RetryPolicy, n int) time.Duration { return time.Duration(n+6) * time.Second }
			got := decide(&s)
			if g, w := viewOf(got), viewOf(c.want); !reflect.DeepEqual(g, w) {
				t.Errorf("decide =\n  %+v\nwant\n  %+v", g, w)
			}
			if c.want.why != "" && !strings.Contains(got.why, c.want.why) {
				t.Errorf("why %q, want it to say %q", got.why, c.want.why)
			}
			switch got.verb {
			case doLater, doRequeue, doAwaitOwner, doRefuse, doLeaveRunning:
				if got.why == "" {
					t.Errorf("%s without a reason", got.verb)
				}
			}
			if c.check != nil {
				c.check(t, got)
			}
		})
	}
}

// actionView is all of an action but the texts meant for people (its why,
// and the messages of failures), which the cases check where they matter.
type actionView struct {
	Verb     verb
	Attempt  int
	Attempts int
	Lost     []attemptView
	Restart  bool
	Outcome  outcomeView
	Delay    time.Duration
	Memory   string
	Found    *executor.Found
}

type attemptView struct {
	Attempt  int
	WorkerID string
	Class    job.FailureClass
	Code     job.FailureCode
}

type outcomeView struct {
	Status   job.Status
	Class    job.FailureClass
	Code     job.FailureCode
	ExitCode *int
}

func viewOf(a action) actionView {
	v := actionView{Verb: a.verb, Attempt: a.attempt, Attempts: a.attempts, Restart: a.restart,
		Delay: a.delay, Memory: a.memory, Found: a.found}
	for _, l := range a.lost {
		av := attemptView{Attempt: l.Attempt, WorkerID: l.WorkerID}
		if l.Failure != nil {
			av.Class, av.Code = l.Failure.Class, l.Failure.Code
		}
		v.Lost = append(v.Lost, av)
	}
	if o := a.outcome; o != nil {
		v.Outcome = outcomeView{Status: o.Status, ExitCode: o.ExitCode}
		if o.Failure != nil {
			v.Outcome.Class, v.Outcome.Code = o.Failure.Class, o.Failure.Code
		}
	}
	return v
}

// wantOutcome is the outcome a case expects, for the comparison of viewOf.
func wantOutcome(status job.Status, class job.FailureClass, code job.FailureCode, exitCode *int) *executor.Outcome {
	o := &executor.Outcome{Status: status, ExitCode: exitCode}
	if class != "" {
		o.Failure = &job.Failure{Class: class, Code: code}
	}
	return o
}

// lostOn is a lost attempt a case expects.
func lostOn(n int, worker string) []job.Attempt {
	return []job.Attempt{{Attempt: n, WorkerID: worker, Failure: &job.Failure{Class: job.ClassInfrastructure, Code: job.CodeWorkerLost}}}
}

func withHistory(r *job.Record, h ...job.Attempt) *job.Record {
	r.History = append(r.History, h...)
	return r
}

func lostAttempt(n int) job.Attempt {
	return job.Attempt{Attempt: n, Failure: job.Failf(job.ClassInfrastructure, job.CodeWorkerLost, "lost")}
}

func wantFailure(t *testing.T, a action, status job.Status, class job.FailureClass, code job.FailureCode) {
	t.Helper()
	if a.outcome == nil || a.outcome.Status != status || a.outcome.Failure == nil ||
		a.outcome.Failure.Class != class || a.outcome.Failure.Code != code {
		t.Errorf("outcome %+v, want %s %s/%s", a.outcome, status, class, code)
	}
}
