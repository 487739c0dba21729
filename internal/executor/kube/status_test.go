package kube

import (
	"fmt"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fleet-dev/fleet/job"
)

func jobWith(conds ...batchv1.JobCondition) *batchv1.Job {
	return &batchv1.Job{Status: batchv1.JobStatus{Conditions: conds}}
}

func cond(t batchv1.JobConditionType, reason string) batchv1.JobCondition {
	return batchv1.JobCondition{Type: t, Status: corev1.ConditionTrue, Reason: reason, Message: "as the Job controller says"}
}

// podIn returns a pod whose container is in state s.
func podIn(phase corev1.PodPhase, s corev1.ContainerState, change ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "fleet-job-1-a1-abcde"},
		Spec: corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: ContainerName,
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: mustQuantity("384Mi")}}}}},
		Status: corev1.PodStatus{Phase: phase, ContainerStatuses: []corev1.ContainerStatus{{Name: ContainerName, State: s}}},
	}
	for _, c := range change {
		c(p)
	}
	return p
}

func exited(code int32, reason string) corev1.ContainerState {
	return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: reason}}
}

func waiting(reason string) corev1.ContainerState {
	return corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: "as the kubelet says"}}
}

var running = corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}

func withCondition(t corev1.PodConditionType, status corev1.ConditionStatus, reason string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: t, Status: status, Reason: reason, Message: "as Kubernetes says"})
	}
}

func TestJudge(t *testing.T) {
	for _, tc := range []struct {
		name string
		job  *batchv1.Job
		pod  *corev1.Pod
		// want is "status class/code exit", "running" for no verdict.
		want string
	}{
		{"no condition yet", jobWith(), podIn(corev1.PodRunning, running), "running"},
		{"failure only targeted: pods still stopping", jobWith(cond(batchv1.JobFailureTarget, "DeadlineExceeded")), podIn(corev1.PodRunning, running), "running"},
		// The pod decides before the Job's condition comes.
		{"pod succeeded, no condition yet", jobWith(), podIn(corev1.PodSucceeded, exited(0, "Completed")), "succeeded - 0"},
		{"success criteria met, not complete yet", jobWith(cond(batchv1.JobSuccessCriteriaMet, "CompletionsReached")), podIn(corev1.PodSucceeded, exited(0, "Completed")), "succeeded - 0"},
		{"pod exited 3, no condition yet", jobWith(), podIn(corev1.PodFailed, exited(3, "Error")), "failed execution/exit_code 3"},
		{"pod OOM killed, no condition yet", jobWith(), podIn(corev1.PodFailed, exited(137, "OOMKilled")), "failed oom/oom_killed 137"},
		{"pod evicted by the kubelet, no condition yet", jobWith(),
			podIn(corev1.PodFailed, exited(137, "Error"), func(p *corev1.Pod) { p.Status.Reason = "Evicted" }), "failed infrastructure/evicted 137"},
		{"pod failed, saying nothing, no condition yet", jobWith(), podIn(corev1.PodFailed, corev1.ContainerState{}), "failed infrastructure/pod_failed -"},
		// A pod being deleted (the deadline, an eviction through the API)
		// is the Job's to explain.
		{"pod failed while deleted, no condition yet", jobWith(cond(batchv1.JobFailureTarget, "DeadlineExceeded")),
			podIn(corev1.PodFailed, exited(143, "Error"), func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: time.Now()} }), "running"},
		{"complete", jobWith(cond(batchv1.JobComplete, "CompletionsReached")), podIn(corev1.PodSucceeded, exited(0, "Completed")), "succeeded - 0"},
		{"complete, pod not seen", jobWith(cond(batchv1.JobComplete, "")), nil, "succeeded - 0"},
		{"deadline", jobWith(cond(batchv1.JobFailed, "DeadlineExceeded")), podIn(corev1.PodRunning, running), "timed_out timeout/attempt_timeout -"},
		{"deadline, pod not seen", jobWith(cond(batchv1.JobFailed, "DeadlineExceeded")), nil, "timed_out timeout/attempt_timeout -"},
		{"deadline while pulling the image", jobWith(cond(batchv1.JobFailed, "DeadlineExceeded")), podIn(corev1.PodPending, waiting("ImagePullBackOff")), "failed image/image_pull_failed -"},
		{"deadline while unschedulable", jobWith(cond(batchv1.JobFailed, "DeadlineExceeded")),
			podIn(corev1.PodPending, corev1.ContainerState{}, withCondition(corev1.PodScheduled, corev1.ConditionFalse, "Unschedulable")), "failed infrastructure/unschedulable -"},
		{"exit code", jobWith(cond(batchv1.JobFailed, "BackoffLimitExceeded")), podIn(corev1.PodFailed, exited(3, "Error")), "failed execution/exit_code 3"},
		{"OOM", jobWith(cond(batchv1.JobFailed, "BackoffLimitExceeded")), podIn(corev1.PodFailed, exited(137, "OOMKilled")), "failed oom/oom_killed 137"},
		{"evicted by the kubelet", jobWith(cond(batchv1.JobFailed, "BackoffLimitExceeded")),
			podIn(corev1.PodFailed, exited(137, "Error"), func(p *corev1.Pod) { p.Status.Reason = "Evicted" }), "failed infrastructure/evicted 137"},
		{"evicted through the API", jobWith(cond(batchv1.JobFailed, "BackoffLimitExceeded")),
			podIn(corev1.PodFailed, exited(143, "Error"), withCondition(corev1.DisruptionTarget, corev1.ConditionTrue, "EvictionByEvictionAPI")), "failed infrastructure/evicted 143"},
		{"preempted", jobWith(cond(batchv1.JobFailed, "BackoffLimitExceeded")),
			podIn(corev1.PodFailed, exited(137, "Error"), withCondition(corev1.DisruptionTarget, corev1.ConditionTrue, "PreemptionByScheduler")), "failed infrastructure/evicted 137"},
		{"node unreachable", jobWith(cond(batchv1.JobFailed, "BackoffLimitExceeded")),
			podIn(corev1.PodRunning, running, withCondition(corev1.DisruptionTarget, corev1.ConditionTrue, "DeletionByTaintManager")), "failed infrastructure/node_lost -"},
		{"node removed", jobWith(cond(batchv1.JobFailed, "BackoffLimitExceeded")),
			podIn(corev1.PodFailed, running, withCondition(corev1.DisruptionTarget, corev1.ConditionTrue, "DeletionByPodGC")), "failed infrastructure/node_lost -"},
		{"node lost", jobWith(cond(batchv1.JobFailed, "BackoffLimitExceeded")),
			podIn(corev1.PodFailed, running, func(p *corev1.Pod) { p.Status.Reason = "NodeLost" }), "failed infrastructure/node_lost -"},
		{"rejected by the kubelet", jobWith(cond(batchv1.JobFailed, "BackoffLimitExceeded")),
			podIn(corev1.PodFailed, corev1.ContainerState{}, func(p *corev1.Pod) { p.Status.Reason = "OutOfnvidia.com/gpu" }), "failed infrastructure/pod_failed -"},
		{"failed, pod unknown", jobWith(cond(batchv1.JobFailed, "BackoffLimitExceeded")), nil, "failed infrastructure/pod_failed -"},
		{"failed, pod says nothing", jobWith(cond(batchv1.JobFailed, "BackoffLimitExceeded")), podIn(corev1.PodRunning, running), "failed infrastructure/pod_failed -"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := judge(tc.job, tc.pod, time.Minute)
			got := "running"
			if v != nil {
				failure, exit := "-", "-"
				if v.failure != nil {
					failure = fmt.Sprintf("%s/%s", v.failure.Class, v.failure.Code)
				}
				if v.exitCode != nil {
					exit = fmt.Sprint(*v.exitCode)
				}
				got = fmt.Sprintf("%s %s %s", v.status, failure, exit)
			}
			if got != tc.want {
				t.Errorf("judge = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestJudgeMessages(t *testing.T) {
	v := judge(jobWith(cond(batchv1.JobFailed, "DeadlineExceeded")), nil, 1500*time.Millisecond)
	equal(t, "timeout message", v.failure.Message, "ran longer than its timeout of 1.5s (activeDeadlineSeconds 2); Kubernetes stopped its pod")
	v = judge(jobWith(cond(batchv1.JobFailed, "BackoffLimitExceeded")), podIn(corev1.PodFailed, exited(137, "OOMKilled")), time.Minute)
	equal(t, "OOM message", v.failure.Message, "killed for exceeding its memory limit of 384Mi (OOMKilled)")
	v = judge(jobWith(cond(batchv1.JobFailed, "BackoffLimitExceeded")), podIn(corev1.PodFailed, exited(3, "Error")), time.Minute)
	equal(t, "exit message", v.failure.Message, "exited with code 3")
	equal(t, "phase", v.phase+"/"+v.reason, "Failed/Error")
}

func TestObserve(t *testing.T) {
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want progress
	}{
		{"no pod yet", nil, progress{phase: "Pending", reason: "Created", message: "waiting for the Job's pod"}},
		{"pending", podIn(corev1.PodPending, corev1.ContainerState{}), progress{phase: "Pending"}},
		{"creating", podIn(corev1.PodPending, waiting("ContainerCreating")), progress{phase: "Pending", reason: "ContainerCreating", message: "as the kubelet says"}},
		{"running", podIn(corev1.PodRunning, running), progress{phase: "Running", message: "pod fleet-job-1-a1-abcde on node node-1", started: true}},
		{"terminating", podIn(corev1.PodRunning, running, func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{} }),
			progress{phase: "Running", reason: "Terminating", message: "pod fleet-job-1-a1-abcde on node node-1", started: true}},
		{"exited", podIn(corev1.PodSucceeded, exited(0, "Completed")), progress{phase: "Succeeded", reason: "Completed", message: "pod fleet-job-1-a1-abcde: exit code 0", started: true}},
		{"image pull error", podIn(corev1.PodPending, waiting("ErrImagePull")), progress{phase: "Pending", reason: "ErrImagePull", message: "as the kubelet says", stuck: stuckImage}},
		{"image pull back-off", podIn(corev1.PodPending, waiting("ImagePullBackOff")), progress{phase: "Pending", reason: "ImagePullBackOff", message: "as the kubelet says", stuck: stuckImage}},
		{"invalid image name", podIn(corev1.PodPending, waiting("InvalidImageName")), progress{phase: "Pending", reason: "InvalidImageName", message: "as the kubelet says", stuck: stuckImage, hopeless: true}},
		{"never pull", podIn(corev1.PodPending, waiting("ErrImageNeverPull")), progress{phase: "Pending", reason: "ErrImageNeverPull", message: "as the kubelet says", stuck: stuckImage, hopeless: true}},
		{"config error", podIn(corev1.PodPending, waiting("CreateContainerConfigError")), progress{phase: "Pending", reason: "CreateContainerConfigError", message: "as the kubelet says", stuck: stuckPod}},
		{"unschedulable", podIn(corev1.PodPending, corev1.ContainerState{}, withCondition(corev1.PodScheduled, corev1.ConditionFalse, "Unschedulable")),
			progress{phase: "Pending", reason: "Unschedulable", message: "as Kubernetes says", stuck: stuckPod}},
		{"scheduled", podIn(corev1.PodPending, corev1.ContainerState{}, withCondition(corev1.PodScheduled, corev1.ConditionTrue, "")), progress{phase: "Pending"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := observe(tc.pod); got != tc.want {
				t.Errorf("observe =\n%+v, want\n%+v", got, tc.want)
			}
		})
	}
}

func TestStuckVerdict(t *testing.T) {
	for _, tc := range []struct {
		pod     *corev1.Pod
		waited  time.Duration
		want    string
		message string
	}{
		{podIn(corev1.PodPending, waiting("ImagePullBackOff")), 2 * time.Minute, "image/image_pull_failed",
			"the image could not be pulled for 2m0s: ImagePullBackOff: as the kubelet says"},
		{podIn(corev1.PodPending, waiting("InvalidImageName")), 0, "image/image_pull_failed",
			"the image could not be pulled: InvalidImageName: as the kubelet says"},
		{podIn(corev1.PodPending, waiting("ErrImageNeverPull")), 0, "image/image_not_present",
			"the image is not on the node, and pull_policy is never: ErrImageNeverPull: as the kubelet says"},
		{podIn(corev1.PodPending, corev1.ContainerState{}, withCondition(corev1.PodScheduled, corev1.ConditionFalse, "Unschedulable")), 5 * time.Minute,
			"infrastructure/unschedulable", "the pod could not be scheduled for 5m0s: as Kubernetes says"},
		{podIn(corev1.PodPending, waiting("CreateContainerConfigError")), 5 * time.Minute,
			"infrastructure/pod_stuck", "the container could not be created for 5m0s: CreateContainerConfigError: as the kubelet says"},
	} {
		v := stuckVerdict(observe(tc.pod), tc.waited)
		equal(t, "status", v.status, job.StatusFailed)
		equal(t, "failure", string(v.failure.Class)+"/"+string(v.failure.Code), tc.want)
		equal(t, "message", v.failure.Message, tc.message)
	}
}

func mustQuantity(s string) resource.Quantity { return resource.MustParse(s) }
