package worker

import (
	"fmt"
	"time"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/job"
)

// pausedRecheck is how long a job delivered while its pool is paused is
// left before a worker looks at it again.
const pausedRecheck = 2 * time.Second

// What a worker does with one delivery of a job message is decided here,
// by decide, from what it knows at that moment: every action a delivery
// takes comes from decide, and delivery.settle carries it out. What the
// delivery's pipeline learns on the way (a message that is not a request,
// a record it cannot read or write, no capacity for the attempt, a write
// refused because the record moved) goes into the situation, and decide is
// asked again. decide reads nothing and writes nothing, so every branch is
// a table test (decide_test.go).

// verb names an action.
type verb int

const (
	// doRun runs attempt n.
	doRun verb = iota + 1
	// doAck acknowledges a copy of a job that already ended.
	doAck
	// doFinish ends the job with outcome: a dead letter when it failed,
	// then the final record, which carries the one result; then ack or term.
	doFinish
	// doRetry records a failed attempt and schedules the next one after
	// delay (a NakWithDelay: the retry lives in JetStream).
	doRetry
	// doRequeue gives the job back to the pool at once, without counting
	// the delivery as an attempt.
	doRequeue
	// doLater leaves the job for a moment: the fleet could not read or
	// write what it needs (NATS is electing a leader), or another worker
	// still runs it. Nothing is written; the message comes back later.
	doLater
	// doRefuse terminates a message that is not a valid request.
	doRefuse
	// doAdopt takes over attempt n, which outlived the worker that started
	// it (it runs, or ended while no worker watched): the record names this
	// worker, an adopted event says so, and the attempt is followed to its
	// end as if it had run here. The attempt count does not grow.
	doAdopt
	// doAwaitOwner leaves the job for the worker that started its
	// attempt, the only one that can reach it: the record notes since when
	// it waits, and the message comes back after delay.
	doAwaitOwner
	// doLeaveRunning leaves an attempt running in its backend for another
	// worker to adopt, and gives the message back at once; the record still
	// says the attempt runs.
	doLeaveRunning
)

func (v verb) String() string {
	switch v {
	case doRun:
		return "run"
	case doAck:
		return "ack"
	case doFinish:
		return "finish"
	case doRetry:
		return "retry"
	case doRequeue:
		return "requeue"
	case doLater:
		return "later"
	case doRefuse:
		return "refuse"
	case doAdopt:
		return "adopt"
	case doAwaitOwner:
		return "await owner"
	case doLeaveRunning:
		return "leave running"
	}
	return fmt.Sprintf("verb(%d)", int(v))
}

// action is a decision about one delivery.
type action struct {
	verb verb
	// attempt is the attempt this delivery runs or settles, from 1.
	attempt int
	// attempts is how many attempts the job had, for doFinish.
	attempts int
	// lost lists attempts found lost with their worker, to add to the
	// history before anything else happens.
	lost []job.Attempt
	// restart is set when lost attempts are retried at once: a
	// retry_scheduled event says so before attempt runs.
	restart bool
	// outcome ends the job (doFinish) or the attempt (doRetry).
	outcome *executor.Outcome
	// delay and memory are when the next attempt starts, and with how
	// much memory when an OOM raised it (doRetry); delay is also how long
	// a job is left before it is looked at again (doLater).
	delay  time.Duration
	memory string
	// why explains a requeue, a wait or a refusal.
	why string
	// found is the attempt to adopt (doAdopt).
	found *executor.Found
	// rev is the revision of the record the decision was made on: what
	// it writes is a compare-and-set against it, so that a decision made
	// on a copy that is no longer the last version writes nothing.
	rev uint64
}

// situation is what the worker knows when it decides.
type situation struct {
	// malformed is why the message is not a job request; nothing else is
	// known then.
	malformed error
	// unsettled is why the fleet could not read or write what the
	// delivery needs (NATS electing a leader): nothing is decided now.
	unsettled error
	// noCapacity is why the worker's capacity cannot hold the attempt:
	// its reservation was refused, before anything was written.
	noCapacity string
	rec        *job.Record  // the job's record, as last read or written
	rev        uint64       // and its revision
	req        *job.Request // the normalized request
	submitted  time.Time    // when the job was submitted; zero if unknown
	now        time.Time
	self       string // this worker's id
	// ownerRuns: the worker recorded as running the job still holds the
	// attempt (its capacity lease says so).
	ownerRuns bool
	// recheck is how long a job another worker still runs is left before
	// it is looked at again: the ack wait.
	recheck time.Duration
	// draining: the worker is shutting down.
	draining bool
	// refused is the executor's reason it can never run the request.
	refused error
	// outcome is how the attempt ended, once it ran; nil before.
	outcome *executor.Outcome
	// requeued: the worker stopped the attempt to give the job back to
	// the pool (it is shutting down).
	requeued bool
	// leftRunning: the executor left the attempt running, for another
	// worker to adopt (the worker stops with --handoff).
	leftRunning bool
	// deadlineBound: the attempt's timeout was cut short to end at the
	// job's deadline, so that a timeout is the deadline's.
	deadlineBound bool
	// found is where the executor found the running attempt of an orphan
	// (see needsLookup); nil when it was not asked.
	found *executor.Found
	// adoptWait is how long a job waits for the worker that started its
	// attempt when only that worker can reach it; then the attempt is lost.
	adoptWait time.Duration
	// misfit is why this worker cannot run the request while another
	// worker of the pool might (its GPU models, its labels).
	misfit error
	// elsewhere says why another worker of the pool would start the job
	// sooner: it has the image this one would pull.
	elsewhere string
	// paused is set while the worker's pool is paused.
	paused bool
	// retryDelay computes backoff delays.
	retryDelay RetryDelayFunc
}

// attemptOf is the attempt number of this delivery. Attempts are counted
// in the record: an attempt is one a worker recorded as running. A
// delivery that ended before it got that far (its worker died, NATS did
// not answer, a draining worker handed it back) is not one.
func (s *situation) attemptOf() int { return s.rec.Attempt + 1 }

// orphan reports whether the record says an attempt runs that nothing runs
// any more: its worker died, or was cut off for longer than the ack wait.
func (s *situation) orphan() bool { return s.rec.State == job.StateRunning && !s.ownerRuns }

// needsLookup reports whether decide must be told where the backend's
// attempt of an orphan stands: it may be adopted rather than lost.
func (s *situation) needsLookup() bool { return s.orphan() && s.outcome == nil }

// needsOwner reports whether decide must be told if the worker recorded as
// running the job still runs it.
func (s *situation) needsOwner() bool {
	return s.outcome == nil && s.rec.State == job.StateRunning && s.rec.WorkerID != s.self
}

// queuedSince is when the job's queue_timeout starts counting: its
// submission, or its not_before when that is later.
func (s *situation) queuedSince() time.Time {
	if nb := s.req.NotBefore; nb != nil && nb.After(s.submitted) {
		return *nb
	}
	return s.submitted
}

// lostSoFar counts the attempts of the job lost to the fleet itself.
func lostSoFar(h []job.Attempt) int {
	n := 0
	for _, a := range h {
		if a.Failure != nil && a.Failure.Code == job.CodeWorkerLost {
			n++
		}
	}
	return n
}

// decide says what to do with a delivery: before the attempt runs when
// s.outcome is nil, after it ran otherwise.
func decide(s *situation) action {
	var a action
	if s.outcome != nil {
		a = decideOutcome(s)
	} else {
		a = decideDelivery(s)
	}
	a.rev = s.rev
	return a
}

func decideDelivery(s *situation) action {
	if s.malformed != nil {
		// Only the dispatcher publishes jobs: someone published to the
		// jobs subject directly.
		return action{verb: doRefuse, why: s.malformed.Error()}
	}
	rec, req, n := s.rec, s.req, s.attemptOf()
	switch {
	case s.unsettled != nil:
		// Nothing is written: the next delivery looks again.
		return action{verb: doLater, attempt: n, delay: laterDelay,
			why: "the job's state cannot be read or written now: " + s.unsettled.Error()}
	case s.noCapacity != "":
		// Nothing was written (the lease is reserved before the record):
		// the job is left a moment for a worker with room.
		return action{verb: doLater, attempt: n, delay: misfitDelay, why: s.noCapacity}
	case s.draining:
		return action{verb: doRequeue, attempt: n, why: "the worker is shutting down"}
	case rec.State.Final():
		// Finished by an earlier delivery that did not get to acknowledge,
		// or by a cancel.
		return action{verb: doAck, attempt: n}
	case s.orphan() && s.found != nil && (s.found.Standing == executor.Running || s.found.Standing == executor.Ended):
		// The attempt outlived its worker: it is taken over, not run again,
		// even when a cancel or the deadline ends it at once.
		return action{verb: doAdopt, attempt: rec.Attempt, found: s.found}
	case rec.CancelRequested:
		return finish(n, n-1, job.StatusCancelled,
			job.Failf(job.ClassCancelled, job.CodeCancelled, "cancelled before attempt %d started", n))
	case req.Deadline != nil && !s.submitted.IsZero() && s.now.After(s.submitted.Add(req.Deadline.Std())):
		return finish(n, n-1, job.StatusTimedOut,
			job.Failf(job.ClassTimeout, job.CodeDeadline, "the job's deadline of %s passed before attempt %d", req.Deadline, n))
	case req.QueueTimeout != nil && rec.StartedAt == nil && !s.submitted.IsZero() && s.now.After(s.queuedSince().Add(req.QueueTimeout.Std())):
		return finish(n, 0, job.StatusTimedOut,
			job.Failf(job.ClassTimeout, job.CodeQueueTimeout, "queued longer than queue_timeout %s", req.QueueTimeout))
	}

	if rec.StartedAt == nil && req.NotBefore != nil && s.now.Before(*req.NotBefore) {
		// Nothing is written: the job is queued until then.
		return action{verb: doLater, attempt: n, delay: req.NotBefore.Sub(s.now),
			why: "not before " + req.NotBefore.Format(time.RFC3339)}
	}

	var a action
	lost, last := lostSoFar(rec.History), rec.Failure
	if rec.State == job.StateRunning {
		// The result is the final version of the record: an attempt that
		// got as far as publishing it left the job final, acknowledged
		// above.
		switch {
		case s.ownerRuns:
			// Its worker still runs it and will settle it; JetStream
			// delivered it again because that worker's progress did not
			// reach it for a while. Look again later.
			return action{verb: doLater, attempt: n, delay: s.recheck,
				why: fmt.Sprintf("worker %s still runs attempt %d", rec.WorkerID, rec.Attempt)}
		case s.found != nil && s.found.Standing == executor.Unreachable:
			since := s.now
			if rec.AwaitingSince != nil {
				since = *rec.AwaitingSince
			}
			if left := since.Add(s.adoptWait).Sub(s.now); left > 0 {
				return action{verb: doAwaitOwner, attempt: rec.Attempt, delay: min(s.recheck, left),
					why: fmt.Sprintf("attempt %d runs where only worker %s can reach it (%s); waiting for it to come back for %s more",
						rec.Attempt, rec.WorkerID, s.found.Why, left.Round(time.Second))}
			}
		}
		k := rec.Attempt
		f := job.Failf(job.ClassInfrastructure, job.CodeWorkerLost, "worker %s stopped responding during attempt %d", rec.WorkerID, k)
		if s.found != nil && s.found.Standing == executor.Unreachable {
			f.Message += fmt.Sprintf(", and did not come back within the adopt wait of %s", s.adoptWait)
		} else if s.found != nil && s.found.Standing == executor.Gone && s.found.Why != "" {
			f.Message += "; " + s.found.Why
		}
		a.lost = []job.Attempt{{Attempt: k, WorkerID: rec.WorkerID, StartedAt: rec.StartedAt, Failure: f}}
		lost, last = lost+1, f
		if lost > *req.Retry.MaxLost {
			// The lost attempt is the job's last: the result describes it,
			// and the history holds the ones before.
			f.Message += fmt.Sprintf("; %d attempts were lost, more than max_lost %d", lost, *req.Retry.MaxLost)
			return finish(n, k, job.StatusFailed, f)
		}
		a.restart = true
	}
	switch {
	case n-lost > req.Retry.MaxAttempts:
		// Only a change of policy between deliveries gets here; the last
		// attempt, lost or failed, is the job's.
		if last == nil {
			last = job.Failf(job.ClassInfrastructure, job.CodeWorkerLost, "%d attempts ran without finishing", n-1)
		}
		return finish(n, n-1, job.StatusFailed, last)
	case s.refused != nil:
		act := finish(n, n, job.StatusFailed, job.Failf(job.ClassRejected, job.CodeInvalid, "%v", s.refused))
		act.lost = a.lost
		return act
	case s.misfit != nil:
		// Nothing is written: the worker that takes it records what was
		// lost.
		return action{verb: doLater, attempt: n, delay: misfitDelay, why: s.misfit.Error()}
	case s.elsewhere != "":
		return action{verb: doLater, attempt: n, delay: preferDelay, why: s.elsewhere}
	case s.paused:
		// Nothing is written: the worker that starts it after the resume
		// records what was lost.
		return action{verb: doLater, attempt: n, delay: pausedRecheck, why: "the pool is paused"}
	}
	a.verb, a.attempt = doRun, n
	return a
}

func decideOutcome(s *situation) action {
	// The record says which attempt ran: it was written when it began.
	n, out := s.rec.Attempt, s.outcome
	if s.leftRunning {
		return action{verb: doLeaveRunning, attempt: n, why: "the worker is stopping and leaves its attempts running for adoption"}
	}
	if s.requeued && out.Status != job.StatusSucceeded {
		return action{verb: doRequeue, attempt: n, why: "the worker is shutting down"}
	}
	if s.deadlineBound && out.Status == job.StatusTimedOut {
		o := *out
		o.Failure = job.Failf(job.ClassTimeout, job.CodeDeadline, "the job's deadline of %s passed during attempt %d", s.req.Deadline, n)
		out = &o
	}
	if out.Status == job.StatusFailed || out.Status == job.StatusTimedOut {
		if a, ok := retryPlan(s, n, out); ok {
			return a
		}
	}
	return action{verb: doFinish, attempt: n, attempts: n, outcome: out}
}

// retryPlan decides whether a failed attempt is tried again, after what
// delay and with how much memory. A retry that could not start before the
// job's deadline ends the job timed out instead.
func retryPlan(s *situation, n int, out *executor.Outcome) (action, bool) {
	p, f := s.req.Retry, out.Failure
	if f == nil || n-lostSoFar(s.rec.History) >= p.MaxAttempts {
		return action{}, false
	}
	memory := ""
	retries := p.Retries(f.Class, out.ExitCode)
	if f.Class == job.ClassOOM && p.OOMMemoryMultiplier > 1 {
		// Asking for more memory makes an oom failure worth retrying.
		cur, limit := s.req.Resources.MemoryBytes(), mustMemory(p.MaxMemory)
		next := min(int64(float64(cur)*p.OOMMemoryMultiplier), limit)
		if next > cur {
			memory, retries = job.FormatMemory(roundUpMi(next)), true
		}
	}
	if !retries {
		return action{}, false
	}
	delay := s.retryDelay(p, n)
	if d := s.req.Deadline; d != nil && !s.submitted.IsZero() && s.now.Add(delay).After(s.submitted.Add(d.Std())) {
		timedOut := *out
		timedOut.Status = job.StatusTimedOut
		timedOut.Failure = job.Failf(job.ClassTimeout, job.CodeDeadline,
			"attempt %d failed (%s: %s) and attempt %d could not start before the job's deadline of %s",
			n, f.Class, f.Message, n+1, d)
		return action{verb: doFinish, attempt: n, attempts: n, outcome: &timedOut}, true
	}
	return action{verb: doRetry, attempt: n, outcome: out, delay: delay, memory: memory}, true
}

// finish builds a doFinish of a job that ends without running attempt n.
func finish(n, attempts int, status job.Status, f *job.Failure) action {
	return action{verb: doFinish, attempt: n, attempts: attempts,
		outcome: &executor.Outcome{Status: status, Failure: f}}
}

// misfitDelay is how long a job that this worker cannot run, and another
// might, is left before it comes back.
const misfitDelay = time.Second

// preferDelay is how long a job's first delivery is left for a worker that
// has its image cached.
const preferDelay = 500 * time.Millisecond

func mustMemory(q string) int64 {
	v, _ := job.ParseMemory(q)
	return v
}

func roundUpMi(b int64) int64 { return (b + (1<<20 - 1)) &^ (1<<20 - 1) }
