package job

import (
	"errors"
	"fmt"
)

// FailureClass says why an attempt failed; retry policies are keyed on it.
type FailureClass string

// Failure classes.
const (
	ClassExecution      FailureClass = "execution"      // the command exited non-zero
	ClassTimeout        FailureClass = "timeout"        // an attempt, the queue wait or the job ran out of time
	ClassOOM            FailureClass = "oom"            // killed for exceeding its memory limit
	ClassImage          FailureClass = "image"          // the image is missing or could not be pulled
	ClassInfrastructure FailureClass = "infrastructure" // daemon or API errors, worker lost, eviction
	ClassCancelled      FailureClass = "cancelled"      // a user asked for it to stop
	ClassRejected       FailureClass = "rejected"       // the request is not acceptable
)

var classes = []FailureClass{ClassExecution, ClassTimeout, ClassOOM, ClassImage, ClassInfrastructure, ClassCancelled, ClassRejected}

func classNames() []string {
	s := make([]string, len(classes))
	for i, c := range classes {
		s[i] = string(c)
	}
	return s
}

// Valid reports whether c is one of the failure classes.
func (c FailureClass) Valid() bool {
	for _, k := range classes {
		if c == k {
			return true
		}
	}
	return false
}

// FailureCode says precisely why an attempt failed, within its class.
type FailureCode string

// Failure codes: every code an attempt or a job can fail with, by class.
// Producers and dashboards may match on them; they are part of the contract.
const (
	// execution
	CodeExitCode      FailureCode = "exit_code"        // the command exited non-zero
	CodeStartFailed   FailureCode = "start_failed"     // the command could not be started
	CodeOutputMissing FailureCode = "output_missing"   // a declared output was not written
	CodeOutputLarge   FailureCode = "output_too_large" // the outputs exceed the worker's limit
	CodeOutputNotText FailureCode = "output_not_text"  // an output is not UTF-8 text

	// timeout
	CodeAttemptTimeout FailureCode = "attempt_timeout" // one attempt ran longer than timeout
	CodeQueueTimeout   FailureCode = "queue_timeout"   // queued longer than queue_timeout
	CodeDeadline       FailureCode = "deadline"        // the whole job exceeded its deadline
	CodeJobOverdue     FailureCode = "job_overdue"     // a Kubernetes Job outlived its deadline; the worker deleted it

	// oom
	CodeOOMKilled FailureCode = "oom_killed" // killed for exceeding its memory limit

	// image
	CodeImageNotPresent FailureCode = "image_not_present" // not on the host, and the pull policy is never
	CodeImagePull       FailureCode = "image_pull_failed" // the image could not be pulled

	// infrastructure
	CodeWorkerLost        FailureCode = "worker_lost"        // the worker stopped during the attempt
	CodeExecutorError     FailureCode = "executor_error"     // the executor could not run or follow the attempt
	CodeOutputUnreadable  FailureCode = "output_unreadable"  // an output could not be read back
	CodeContainerVanished FailureCode = "container_vanished" // someone else removed the container
	CodeContainerLost     FailureCode = "container_lost"     // the Docker daemon lost the container
	CodeUnschedulable     FailureCode = "unschedulable"      // no node could take the pod
	CodePodStuck          FailureCode = "pod_stuck"          // the pod's container could not be created
	CodeEvicted           FailureCode = "evicted"            // the pod was evicted or preempted
	CodeNodeLost          FailureCode = "node_lost"          // the pod's node went away
	CodePodFailed         FailureCode = "pod_failed"         // the pod failed without an exit code
	CodeJobDeleted        FailureCode = "job_deleted"        // someone else deleted the Kubernetes Job
	CodeOutputNotStored   FailureCode = "output_not_stored"  // an output could not be written to the object store
	CodeInputNotFetched   FailureCode = "input_not_fetched"  // an input by reference could not be read from the object store

	// cancelled, rejected
	CodeCancelled    FailureCode = "cancelled"       // a user cancelled the job
	CodeInvalid      FailureCode = "invalid_request" // the request is not acceptable
	CodeInputMissing FailureCode = "input_missing"   // an input by reference names no object
	CodeInputChanged FailureCode = "input_changed"   // an input's object differs from its reference (digest or size)
)

// Failure describes why an attempt or a job failed. Message is for people;
// it never carries environment values.
type Failure struct {
	Class   FailureClass `json:"class"`
	Code    FailureCode  `json:"code"`
	Message string       `json:"message"`
}

// Error makes a Failure usable as an error, so executors can return one to
// say how an attempt failed.
func (f *Failure) Error() string {
	return fmt.Sprintf("%s (%s): %s", f.Class, f.Code, f.Message)
}

// Is reports whether target is a Failure of the same class and, when
// target names one, the same code, so that errors.Is matches a wrapped
// Failure against a pattern:
//
//	errors.Is(err, &job.Failure{Class: job.ClassOOM})
//	errors.Is(err, &job.Failure{Class: job.ClassTimeout, Code: job.CodeDeadline})
func (f *Failure) Is(target error) bool {
	t, ok := target.(*Failure)
	if !ok || f == nil || t == nil {
		return false
	}
	return t.Class == f.Class && (t.Code == "" || t.Code == f.Code)
}

// AsFailure returns the Failure err is or wraps, if any.
func AsFailure(err error) (*Failure, bool) {
	var f *Failure
	ok := errors.As(err, &f)
	return f, ok
}

// Failf builds a Failure.
func Failf(class FailureClass, code FailureCode, format string, args ...any) *Failure {
	return &Failure{Class: class, Code: code, Message: fmt.Sprintf(format, args...)}
}
