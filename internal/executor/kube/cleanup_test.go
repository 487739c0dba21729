package kube

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/job"
)

// TestRunEndsWithThePod: the attempt ends when its pod does, without the
// Job's condition, which the Job controller sets a second or more later;
// the Job and its Secret stay until Cleanup, which deletes them without
// waiting for the pod.
func TestRunEndsWithThePod(t *testing.T) {
	for _, tc := range []struct {
		name  string
		phase corev1.PodPhase
		state corev1.ContainerState
		want  string
	}{
		{"succeeded", corev1.PodSucceeded, exited(0, "Completed"), "succeeded exit 0"},
		{"exit code", corev1.PodFailed, exited(3, "Error"), "failed execution/exit_code exit 3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := setup(t, nil)
			req := request(func(r *job.Request) { r.Env = map[string]string{"TOKEN": "s3cr3t"} })
			done := b.run(context.Background(), req)
			j := b.awaitJob(t)
			b.setPod(t, j, corev1.PodRunning, running)
			b.report.await(t, "Running")
			b.setPod(t, j, tc.phase, tc.state)
			out := await(t, done)
			equal(t, "outcome", describe(out), tc.want)
			equal(t, "stdout", out.Stdout, "fake logs")
			if !b.jobExists(t, j.Name) {
				t.Fatal("Run deleted the Job: that is Cleanup's, after the result")
			}

			tk := task(req)
			if err := b.exec.Cleanup(context.Background(), tk); err != nil {
				t.Fatalf("Cleanup: %v", err)
			}
			if b.jobExists(t, j.Name) {
				t.Error("the Job is still there after Cleanup")
			}
			if _, err := b.client.CoreV1().Secrets(ns).Get(context.Background(), j.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("the Secret after Cleanup: %v, want it gone", err)
			}
			var propagation metav1.DeletionPropagation
			for _, a := range b.client.Actions() {
				if d, ok := a.(k8stesting.DeleteAction); ok && a.GetResource().Resource == "jobs" {
					propagation = *d.GetDeleteOptions().PropagationPolicy
				}
			}
			equal(t, "propagation", propagation, metav1.DeletePropagationBackground)
			// Again, or for an attempt with nothing left: nothing to do.
			if err := b.exec.Cleanup(context.Background(), tk); err != nil {
				t.Errorf("Cleanup again: %v", err)
			}
		})
	}
}

// TestCleanupOfAnAdoptedAttempt: Cleanup finds, through the API server,
// the Job of an attempt another worker made.
func TestCleanupOfAnAdoptedAttempt(t *testing.T) {
	theirs := endedJob("theirs", "worker-2", "job-7", 1, true)
	b := setup(t, nil, theirs)
	tk := &executor.Task{JobID: "job-7", Attempt: 1, WorkerID: "worker-1", Pool: "p"}
	if err := b.exec.Cleanup(context.Background(), tk); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	if b.jobExists(t, "theirs") {
		t.Error("the adopted attempt's Job is still there")
	}
}

// endedJob is a Job of workerID's attempt of jobID, ended (Complete) or
// still running.
func endedJob(name, workerID, jobID string, attempt int, complete bool) *batchv1.Job {
	j := ownedJob(name, workerID)
	j.Labels[LabelJobID] = labelValue(jobID)
	j.Labels[LabelAttempt] = strconv.Itoa(attempt)
	j.Annotations = map[string]string{AnnotationJobID: jobID, AnnotationWorkerID: workerID}
	if complete {
		j.Status.Conditions = []batchv1.JobCondition{cond(batchv1.JobComplete, "CompletionsReached")}
	}
	return j
}

// TestRecoverAdoptableSweepsPeers: a worker's start also deletes the
// ended Jobs that other workers left before their Cleanup, once their
// jobs' records say they no longer run; not those that still run, nor those
// that may still be adopted.
func TestRecoverAdoptableSweepsPeers(t *testing.T) {
	endedByPod := endedJob("ended-by-pod", "worker-3", "job-4", 1, false)
	pod := podIn(corev1.PodSucceeded, exited(0, "Completed"))
	pod.Name, pod.Namespace = "ended-by-pod-x", ns
	pod.Labels = map[string]string{batchv1.JobNameLabel: "ended-by-pod", LabelManagedBy: "fleet", LabelWorkerID: "worker-3"}
	runningPod := podIn(corev1.PodRunning, running)
	runningPod.Name, runningPod.Namespace = "still-running-x", ns
	runningPod.Labels = map[string]string{batchv1.JobNameLabel: "still-running", LabelManagedBy: "fleet", LabelWorkerID: "worker-2"}
	objects := []runtime.Object{
		endedJob("result-in", "worker-2", "job-1", 1, true),
		endedJob("may-be-adopted", "worker-2", "job-2", 1, true),
		endedJob("still-running", "worker-2", "job-3", 1, false),
		endedByPod, pod, runningPod,
	}
	b := setup(t, nil, objects...)
	var asked []string
	err := b.exec.RecoverAdoptable(context.Background(), "worker-1", func(_, jobID string, attempt int) bool {
		asked = append(asked, jobID)
		return jobID == "job-2" || jobID == "job-3"
	})
	if err != nil {
		t.Fatalf("RecoverAdoptable: %v", err)
	}
	var left []string
	jobs, _ := b.client.BatchV1().Jobs(ns).List(context.Background(), metav1.ListOptions{})
	for _, j := range jobs.Items {
		left = append(left, j.Name)
	}
	slices.Sort(left)
	equal(t, "Jobs left", strings.Join(left, " "), "may-be-adopted still-running")
	if slices.Contains(asked, "job-3") {
		t.Errorf("asked about a Job that still runs: %q", asked)
	}
}
