package longjobs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/fleet-dev/fleet/internal/executor/kube"
	"github.com/fleet-dev/fleet/internal/kubetest"
	"github.com/fleet-dev/fleet/job"
)

// TestKubePersist: on Kubernetes a job's data directory is a folder of the
// shared volume, mounted at /fleet/data of its pod; it goes when the job
// ends, and when the job is cancelled while it runs. (That a retry reads
// the checkpoint of an earlier attempt is the conformance suite's persist
// behaviour: the simulated node runs no container that could write one
// and then fail only once.)
func TestKubePersist(t *testing.T) {
	t.Parallel()
	f := startFleet(t)
	n := kubeNamespace(t)
	f.worker(t, n.workerArgs(t, "keeper", "k8s", "--data-retention", "1h")...)
	dataDir := func(id string) string { return filepath.Join(n.shared, ".fleet-data", id) }
	exists := func(path string) bool { _, err := os.Stat(path); return err == nil }

	for _, tc := range []struct {
		name   string
		cancel bool
	}{{"ends", false}, {"cancelled", true}} {
		id := "persist-" + tc.name
		r := longJob(id, "k8s", 4*time.Second)
		r.Outputs = nil
		r.Persist = &job.Persist{Enabled: true}
		if tc.cancel {
			r.Labels["fleet.test/duration"] = "1h"
		}
		f.Submit(t, r)
		pod := n.runningPod(t, id)
		mounted := false
		for _, m := range pod.Spec.Containers[0].VolumeMounts {
			if m.MountPath == "/fleet/data" && m.SubPath == ".fleet-data/"+id {
				mounted = true
			}
		}
		if !mounted || !exists(dataDir(id)) {
			t.Fatalf("%s: data folder there %v, mounts %+v; want %s mounted at /fleet/data", tc.name, exists(dataDir(id)),
				pod.Spec.Containers[0].VolumeMounts, dataDir(id))
		}
		// What the container would write.
		if err := os.WriteFile(filepath.Join(dataDir(id), "counter"), []byte("1"), 0o644); err != nil {
			t.Fatal(err)
		}
		want := job.StatusSucceeded
		if tc.cancel {
			want = job.StatusCancelled
			if _, err := f.Client.Cancel(context.Background(), id); err != nil {
				t.Fatal(err)
			}
		}
		if res := f.Await(t, id, time.Minute); res.Status != want {
			t.Fatalf("%s: %s %+v, want %s", tc.name, res.Status, res.Failure, want)
		}
		waitFor(t, "the data folder of "+id+" to go", 10*time.Second, func() bool { return !exists(dataDir(id)) })
	}
}

// TestKubeCheckpointAcrossAttempts: the first attempt's pod writes a
// checkpoint into its data folder and fails; the second attempt's pod, of a
// new Job, mounts the same folder and finds it. The simulated node runs no
// container: the test writes and reads the files as the containers would,
// and ends each pod by its annotations (exit code 1, then 0).
func TestKubeCheckpointAcrossAttempts(t *testing.T) {
	t.Parallel()
	f := startFleet(t)
	n := kubeNamespace(t)
	f.worker(t, n.workerArgs(t, "keeper", "k8s")...)
	ctx := context.Background()
	id := "resume-on-kube"
	r := longJob(id, "k8s", time.Hour)
	r.Outputs = []string{"counter"}
	r.Persist = &job.Persist{Enabled: true}
	r.Retry = &job.RetryPolicy{MaxAttempts: 2, InitialBackoff: dur(100 * time.Millisecond)}
	f.Submit(t, r)
	data := filepath.Join(n.shared, ".fleet-data", id)

	// runningPod waits for the pod of an attempt to run, with the job's
	// data folder mounted, and returns it.
	runningPod := func(attempt int) *corev1.Pod {
		var pod *corev1.Pod
		waitFor(t, fmt.Sprintf("the pod of attempt %d to run", attempt), time.Minute, func() bool {
			pods, err := n.env.Client.CoreV1().Pods(n.name).List(ctx, metav1.ListOptions{
				LabelSelector: kube.LabelJobID + "=" + id + "," + kube.LabelAttempt + "=" + strconv.Itoa(attempt)})
			if err != nil || len(pods.Items) != 1 || pods.Items[0].Status.Phase != corev1.PodRunning {
				return false
			}
			pod = &pods.Items[0]
			return true
		})
		if !slices.ContainsFunc(pod.Spec.Containers[0].VolumeMounts, func(m corev1.VolumeMount) bool {
			return m.MountPath == "/fleet/data" && m.SubPath == ".fleet-data/"+id
		}) {
			t.Fatalf("attempt %d: mounts %+v; want the job's data folder at /fleet/data", attempt, pod.Spec.Containers[0].VolumeMounts)
		}
		return pod
	}
	// finish makes the simulated node end the pod in a second, with code.
	finish := func(pod *corev1.Pod, code string) {
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q,%q:%q}}}`, kubetest.AnnotationExitCode, code,
			kubetest.AnnotationDuration, time.Now().Add(time.Second).UTC().Format(time.RFC3339))
		if _, err := n.env.Client.CoreV1().Pods(n.name).Patch(ctx, pod.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	first := runningPod(1)
	if err := os.WriteFile(filepath.Join(data, "counter"), []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	finish(first, "1")

	second := runningPod(2)
	checkpoint, err := os.ReadFile(filepath.Join(data, "counter"))
	if err != nil {
		t.Fatalf("attempt 2 finds no checkpoint: %v", err)
	}
	n.writeOutput(t, second, "counter", string(checkpoint))
	finish(second, "0")

	res := f.Await(t, id, time.Minute)
	if res.Status != job.StatusSucceeded || res.Attempts != 2 || res.Outputs["counter"] != "1" ||
		len(res.History) != 1 || res.History[0].ExitCode == nil || *res.History[0].ExitCode != 1 {
		t.Fatalf("result: %s after %d attempts, outputs %q, history %+v", res.Status, res.Attempts, res.Outputs, res.History)
	}
	waitFor(t, "the data folder to go", 10*time.Second, func() bool { _, err := os.Stat(data); return errors.Is(err, os.ErrNotExist) })
}
