package kube

import (
	"cmp"
	"fmt"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/fleet-dev/fleet/job"
)

// verdict is how an attempt ended.
type verdict struct {
	status   job.Status
	exitCode *int
	failure  *job.Failure
	// phase and reason are the backend's last word, for the lifecycle.
	phase, reason string
	// stop: the Job still runs, and must be deleted.
	stop bool
	// handedOff: the worker stopped following the attempt, which runs on.
	handedOff bool
}

// message explains the verdict in a phase report.
func (v *verdict) message() string {
	if v.failure != nil {
		return v.failure.Message
	}
	return "the Job completed"
}

// judge says how an attempt ended from its Job and its newest pod (nil when
// none was seen), or returns nil while it has not ended. When judge returns
// a verdict nothing of the attempt is running: Kubernetes marks a Job
// Complete or Failed only once its pods have stopped, and a pod that ended
// by itself has stopped.
//
// The pod decides first: its Job has one pod and no retries (backoffLimit
// 0, restartPolicy Never), so once that pod has ended by itself the Job
// can only end the same way, and its condition would say so a second or
// more later (the Job controller batches pod updates for a second, then
// removes its finalizer from the pod). The Job's condition decides when
// the Job controller ended the attempt (its deadline) or the pod ended
// without a word (deleted before it ran).
func judge(j *batchv1.Job, pod *corev1.Pod, timeout time.Duration) *verdict {
	if c := jobCondition(j, batchv1.JobComplete); c != nil {
		zero := 0
		return &verdict{status: job.StatusSucceeded, exitCode: &zero, phase: "Succeeded", reason: "Completed"}
	}
	c := jobCondition(j, batchv1.JobFailed)
	if c == nil {
		return podEnded(pod)
	}
	if c.Reason == batchv1.JobReasonDeadlineExceeded {
		// A pod that never got to run failed for a reason of its own.
		if p := observe(pod); pod != nil && p.stuck != notStuck {
			return stuckVerdict(p, 0)
		}
		return &verdict{status: job.StatusTimedOut, phase: "Failed", reason: c.Reason,
			failure: job.Failf(job.ClassTimeout, job.CodeAttemptTimeout,
				"ran longer than its timeout of %s (activeDeadlineSeconds %d); Kubernetes stopped its pod", timeout, deadlineSeconds(timeout))}
	}
	if v := podFailure(pod); v != nil {
		return v
	}
	return &verdict{status: job.StatusFailed, phase: "Failed", reason: c.Reason,
		failure: job.Failf(job.ClassInfrastructure, job.CodePodFailed, "the Job failed: %s: %s", c.Reason, c.Message)}
}

// podEnded says how an attempt ended from its pod alone, once the pod has
// ended by itself: Succeeded, or Failed while no one deletes it. A pod
// that is being deleted (the Job's deadline, a cancel, an eviction
// through the API) may yet be explained better by its Job's condition, so
// podEnded leaves it to the Job. It returns nil while the pod has not
// ended.
func podEnded(pod *corev1.Pod) *verdict {
	if pod == nil || pod.DeletionTimestamp != nil {
		return nil
	}
	switch pod.Status.Phase {
	case corev1.PodSucceeded:
		zero := 0
		return &verdict{status: job.StatusSucceeded, exitCode: &zero, phase: "Succeeded", reason: "Completed"}
	case corev1.PodFailed:
		if v := podFailure(pod); v != nil {
			return v
		}
		reason := cmp.Or(pod.Status.Reason, "Failed")
		return &verdict{status: job.StatusFailed, phase: "Failed", reason: reason,
			failure: job.Failf(job.ClassInfrastructure, job.CodePodFailed, "pod %s failed: %s: %s", pod.Name, reason, pod.Status.Message)}
	}
	return nil
}

// podFailure explains a failed pod: out of memory, disrupted (evicted,
// preempted, its node lost), or exited with a code. It returns nil when the
// pod says nothing.
func podFailure(pod *corev1.Pod) *verdict {
	if pod == nil {
		return nil
	}
	failed := func(class job.FailureClass, code job.FailureCode, reason string, exitCode *int, format string, args ...any) *verdict {
		return &verdict{status: job.StatusFailed, exitCode: exitCode, phase: "Failed", reason: reason,
			failure: job.Failf(class, code, format, args...)}
	}
	term := terminated(pod)
	var exitCode *int
	if term != nil {
		code := int(term.ExitCode)
		exitCode = &code
	}
	if term != nil && term.Reason == "OOMKilled" {
		return failed(job.ClassOOM, job.CodeOOMKilled, term.Reason, exitCode,
			"killed for exceeding its memory limit of %s (OOMKilled)", memoryLimit(pod))
	}
	if c := podCondition(pod, corev1.DisruptionTarget); c != nil && c.Status == corev1.ConditionTrue {
		code := job.CodeEvicted
		if c.Reason == "DeletionByTaintManager" || c.Reason == "DeletionByPodGC" {
			code = job.CodeNodeLost // its node became unreachable or was removed
		}
		return failed(job.ClassInfrastructure, code, c.Reason, exitCode, "pod %s was disrupted: %s: %s", pod.Name, c.Reason, c.Message)
	}
	switch pod.Status.Reason {
	case "":
	case "Evicted":
		return failed(job.ClassInfrastructure, job.CodeEvicted, pod.Status.Reason, exitCode, "pod %s was evicted: %s", pod.Name, pod.Status.Message)
	case "NodeLost":
		return failed(job.ClassInfrastructure, job.CodeNodeLost, pod.Status.Reason, exitCode, "pod %s lost its node: %s", pod.Name, pod.Status.Message)
	default:
		if term == nil {
			return failed(job.ClassInfrastructure, job.CodePodFailed, pod.Status.Reason, nil, "pod %s failed: %s: %s", pod.Name, pod.Status.Reason, pod.Status.Message)
		}
	}
	if term != nil && term.ExitCode != 0 {
		msg := fmt.Sprintf("exited with code %d", term.ExitCode)
		if term.Message != "" {
			msg += ": " + term.Message
		}
		return failed(job.ClassExecution, job.CodeExitCode, term.Reason, exitCode, "%s", msg)
	}
	return nil
}

// stuck says why a pod makes no progress.
type stuck int

const (
	notStuck   stuck = iota
	stuckImage       // its image cannot be pulled
	stuckPod         // unschedulable, or its container cannot be created
)

// progress is what a running attempt's pod shows.
type progress struct {
	phase, reason, message string
	// started: the container has started, so it has a log.
	started bool
	stuck   stuck
	// hopeless: stuck for good, no wait will help.
	hopeless bool
}

// Waiting reasons of a container whose image cannot be pulled.
var imageReasons = map[string]bool{
	"ErrImagePull": true, "ImagePullBackOff": true, "RegistryUnavailable": true, "SignatureValidationFailed": true,
	// These never change by waiting.
	"InvalidImageName": false, "ErrImageNeverPull": false,
}

// observe describes a pod that has not ended the attempt yet; pod is nil
// before the Job controller has created it.
func observe(pod *corev1.Pod) progress {
	if pod == nil {
		return progress{phase: "Pending", reason: "Created", message: "waiting for the Job's pod"}
	}
	p := progress{phase: string(pod.Status.Phase)}
	if c := podCondition(pod, corev1.PodScheduled); c != nil && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
		p.reason, p.message, p.stuck = c.Reason, c.Message, stuckPod
		return p
	}
	for _, s := range pod.Status.ContainerStatuses {
		if s.Name != ContainerName {
			continue
		}
		switch {
		case s.State.Running != nil:
			p.started = true
			p.message = fmt.Sprintf("pod %s on node %s", pod.Name, pod.Spec.NodeName)
		case s.State.Terminated != nil:
			p.started = true
			p.reason = s.State.Terminated.Reason
			p.message = fmt.Sprintf("pod %s: exit code %d", pod.Name, s.State.Terminated.ExitCode)
		case s.State.Waiting != nil:
			w := s.State.Waiting
			p.reason, p.message = w.Reason, w.Message
			if retry, ok := imageReasons[w.Reason]; ok {
				p.stuck, p.hopeless = stuckImage, !retry
			} else if w.Reason == "CreateContainerConfigError" || w.Reason == "CreateContainerError" {
				p.stuck = stuckPod
			}
		}
	}
	if pod.DeletionTimestamp != nil && p.reason == "" {
		p.reason = "Terminating"
	}
	return p
}

// stuckVerdict is the end of an attempt whose pod stayed stuck too long,
// for waited when it is known.
func stuckVerdict(p progress, waited time.Duration) *verdict {
	v := &verdict{status: job.StatusFailed, phase: p.phase, reason: p.reason}
	waitedFor := ""
	if waited > 0 {
		waitedFor = fmt.Sprintf(" for %s", waited.Round(time.Second))
	}
	switch {
	case p.reason == "ErrImageNeverPull":
		// Not on the node, and its pull policy forbids a pull.
		v.failure = job.Failf(job.ClassImage, job.CodeImageNotPresent, "the image is not on the node, and pull_policy is never: %s: %s", p.reason, p.message)
	case p.stuck == stuckImage:
		v.failure = job.Failf(job.ClassImage, job.CodeImagePull, "the image could not be pulled%s: %s: %s", waitedFor, p.reason, p.message)
	case p.reason == corev1.PodReasonUnschedulable:
		v.failure = job.Failf(job.ClassInfrastructure, job.CodeUnschedulable, "the pod could not be scheduled%s: %s", waitedFor, p.message)
	default:
		v.failure = job.Failf(job.ClassInfrastructure, job.CodePodStuck, "the container could not be created%s: %s: %s", waitedFor, p.reason, p.message)
	}
	return v
}

func terminated(pod *corev1.Pod) *corev1.ContainerStateTerminated {
	for _, s := range pod.Status.ContainerStatuses {
		if s.Name == ContainerName {
			return s.State.Terminated
		}
	}
	return nil
}

func memoryLimit(pod *corev1.Pod) string {
	for _, c := range pod.Spec.Containers {
		if c.Name == ContainerName {
			if q, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
				return q.String()
			}
		}
	}
	return "unknown"
}

func jobCondition(j *batchv1.Job, t batchv1.JobConditionType) *batchv1.JobCondition {
	for i, c := range j.Status.Conditions {
		if c.Type == t && c.Status == corev1.ConditionTrue {
			return &j.Status.Conditions[i]
		}
	}
	return nil
}

func podCondition(pod *corev1.Pod, t corev1.PodConditionType) *corev1.PodCondition {
	for i, c := range pod.Status.Conditions {
		if c.Type == t {
			return &pod.Status.Conditions[i]
		}
	}
	return nil
}
