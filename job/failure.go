package job

import "fmt"

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

// Failure codes: every code an attempt or a job can fail with, by class.
// Producers and dashboards may match on them; they are part of the contract.
const (
	// execution
	CodeExitCode      = "exit_code"        // the command exited non-zero
	CodeStartFailed   = "start_failed"     // the command could not be started
	CodeOutputMissing = "output_missing"   // a declared output was not written
	CodeOutputLarge   = "output_too_large" // the outputs exceed the worker's limit
	CodeOutputNotText = "output_not_text"  // an output is not UTF-8 text

	// timeout
	CodeAttemptTimeout = "attempt_timeout" // one attempt ran longer than timeout
	CodeQueueTimeout   = "queue_timeout"   // queued longer than queue_timeout
	CodeDeadline       = "deadline"        // the whole job exceeded its deadline
	CodeJobOverdue     = "job_overdue"     // a Kubernetes Job outlived its deadline; the worker deleted it

	// oom
	CodeOOMKilled = "oom_killed" // killed for exceeding its memory limit

	// image
	CodeImageNotPresent = "image_not_present" // not on the host, and the pull policy is never
	CodeImagePull       = "image_pull_failed" // the image could not be pulled

	// infrastructure
	CodeWorkerLost        = "worker_lost"        // the worker stopped during the attempt
	CodeExecutorError     = "executor_error"     // the executor could not run or follow the attempt
	CodeOutputUnreadable  = "output_unreadable"  // an output could not be read back
	CodeContainerVanished = "container_vanished" // someone else removed the container
	CodeContainerLost     = "container_lost"     // the Docker daemon lost the container
	CodeUnschedulable     = "unschedulable"      // no node could take the pod
	CodePodStuck          = "pod_stuck"          // the pod's container could not be created
	CodeEvicted           = "evicted"            // the pod was evicted or preempted
	CodeNodeLost          = "node_lost"          // the pod's node went away
	CodePodFailed         = "pod_failed"         // the pod failed without an exit code
	CodeJobDeleted        = "job_deleted"        // someone else deleted the Kubernetes Job
	CodeOutputNotStored   = "output_not_stored"  // an output could not be written to the object store
	CodeInputNotFetched   = "input_not_fetched"  // an input by reference could not be read from the object store

	// cancelled, rejected
	CodeCancelled    = "cancelled"       // a user cancelled the job
	CodeInvalid      = "invalid_request" // the request is not acceptable
	CodeInputMissing = "input_missing"   // an input by reference names no object
	CodeInputChanged = "input_changed"   // an input's object differs from its reference (digest or size)
)

// Failure describes why an attempt or a job failed. Message is for people;
// it never carries environment values.
type Failure struct {
	Class   FailureClass `json:"class"`
	Code    string       `json:"code"`
	Message string       `json:"message"`
}

// Error makes a Failure usable as an error, so executors can return one to
// say how an attempt failed.
func (f *Failure) Error() string {
	return fmt.Sprintf("%s (%s): %s", f.Class, f.Code, f.Message)
}

// Failf builds a Failure.
func Failf(class FailureClass, code, format string, args ...any) *Failure {
	return &Failure{Class: class, Code: code, Message: fmt.Sprintf(format, args...)}
}
