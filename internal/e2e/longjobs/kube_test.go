package longjobs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/internal/executor/kube"
	"github.com/fleet-dev/fleet/internal/kubetest"
	"github.com/fleet-dev/fleet/job"
)

// namespace is one test's namespace: the worker's RBAC of
// deploy/kubernetes/worker-rbac.yaml, a kubeconfig of its ServiceAccount,
// the "restricted" Pod Security Standard, and a shared volume for outputs.
type namespace struct {
	env        *kubetest.Env
	name       string
	kubeconfig string
	shared     string
}

func kubeNamespace(t *testing.T) *namespace {
	t.Helper()
	env := kubetest.Start(t)
	n := &namespace{env: env, name: env.NewNamespace(t), shared: t.TempDir()}
	env.Restrict(t, n.name)
	env.Apply(t, n.name, filepath.Join(repoRoot(t), "deploy", "kubernetes", "worker-rbac.yaml"))
	n.kubeconfig = env.KubeconfigFor(t, n.name, "fleet-worker")
	env.SharedVolume(t, n.name, "fleet-shared", n.shared)
	return n
}

// workerArgs are the flags of a Kubernetes worker of pool in the namespace.
func (n *namespace) workerArgs(t *testing.T, id, pool string, more ...string) []string {
	return append([]string{"--executor", "kubernetes", "--kubeconfig", n.kubeconfig, "--namespace", n.name,
		"--id", id, "--pool", pool, "--shared-pvc", "fleet-shared", "--shared-dir", n.shared,
		"--data-dir", t.TempDir()}, more...)
}

// jobsOf lists the Kubernetes Jobs of a fleet job.
func (n *namespace) jobsOf(t *testing.T, id string) []batchv1.Job {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	list, err := n.env.Client.BatchV1().Jobs(n.name).List(ctx, metav1.ListOptions{LabelSelector: kube.LabelJobID + "=" + id})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// runningPod waits until the fleet job's pod runs, and returns it.
func (n *namespace) runningPod(t *testing.T, id string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	waitFor(t, "the pod of "+id+" to run", time.Minute, func() bool {
		pods, err := n.env.Client.CoreV1().Pods(n.name).List(context.Background(), metav1.ListOptions{LabelSelector: kube.LabelJobID + "=" + id})
		if err != nil || len(pods.Items) != 1 || pods.Items[0].Status.Phase != corev1.PodRunning {
			return false
		}
		pod = &pods.Items[0]
		return true
	})
	return pod
}

// writeOutput does what the pod's container would: it writes an output file
// into the attempt's folder on the shared volume.
func (n *namespace) writeOutput(t *testing.T, pod *corev1.Pod, name, content string) {
	t.Helper()
	for _, m := range pod.Spec.Containers[0].VolumeMounts {
		if m.MountPath == "/fleet/outputs" {
			if err := os.WriteFile(filepath.Join(n.shared, m.SubPath, name), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
			return
		}
	}
	t.Fatalf("pod %s mounts no outputs folder", pod.Name)
}

// longJob is a job whose pod runs for d (the simulated node reads the
// label), with one output.
func longJob(id, pool string, d time.Duration) *job.Request {
	return &job.Request{ID: id, Pool: pool, Image: "registry.example/trainer:1", Command: []string{"/train"},
		Labels:  map[string]string{kubetest.AnnotationDuration: d.String()},
		Outputs: []string{"model.txt"}, Timeout: dur(2 * time.Minute)}
}

// TestKubeAdoption: a job whose pod runs 20 s loses its worker 5 s in (a
// SIGKILL; a SIGTERM with --handoff), and a second worker of the pool,
// started then, adopts its Job: the same Job object finishes, the job
// succeeds after one attempt with the output its pod wrote, with one
// result (historytest), and no second Job is ever made.
func TestKubeAdoption(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handoff bool
	}{{"sigkill", false}, {"sigterm_handoff", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := startFleet(t)
			n := kubeNamespace(t)
			var extra []string
			if tc.handoff {
				extra = []string{"--handoff"}
			}
			first := f.worker(t, n.workerArgs(t, "first", "k8s", extra...)...)
			ear := f.listen(t, "k8s")
			id := f.Submit(t, longJob("train-"+tc.name, "k8s", 20*time.Second))
			pod := n.runningPod(t, id)
			jobs := n.jobsOf(t, id)
			if len(jobs) != 1 {
				t.Fatalf("%d Jobs, want 1", len(jobs))
			}
			uid := jobs[0].UID
			n.writeOutput(t, pod, "model.txt", "weights")
			time.Sleep(time.Until(pod.CreationTimestamp.Add(5 * time.Second)))
			if tc.handoff {
				first.Signal(syscall.SIGTERM)
				if !first.Wait(20 * time.Second) {
					t.Fatal("the worker did not stop within 20 s of SIGTERM with --handoff")
				}
			} else {
				first.Kill()
			}
			stopped := time.Now()
			f.worker(t, n.workerArgs(t, "second", "k8s")...)

			r := f.Await(t, id, 90*time.Second)
			t.Logf("result %s after %s (attempts %d, worker %s)", r.Status, time.Since(stopped).Round(time.Second), r.Attempts, r.WorkerID)
			if r.Status != job.StatusSucceeded || r.Attempts != 1 || len(r.History) != 0 || r.WorkerID != "second" {
				t.Fatalf("result: %s after %d attempts on %s, history %+v, failure %+v", r.Status, r.Attempts, r.WorkerID, r.History, r.Failure)
			}
			if r.Outputs["model.txt"] != "weights" {
				t.Errorf("outputs %q, want the pod's model.txt", r.Outputs)
			}
			// The adopting worker deletes the Job after the result; until
			// then, it is the one Job.
			name := jobs[0].Name
			for _, j := range n.jobsOf(t, id) {
				if j.UID != uid {
					t.Errorf("a second Job %s was made, beside %s", j.Name, name)
				}
			}
			waitFor(t, "the Job to be deleted after the result", 30*time.Second, func() bool { return len(n.jobsOf(t, id)) == 0 })
			events := f.Events(t, id, 10*time.Second)
			final := 0
			for _, e := range events {
				if e.Type.Final() {
					final++
				}
			}
			adopted := find(events, job.EventHeartbeat, job.PhaseAdopted)
			if final != 1 || count(events, job.EventStarted, "") != 1 || count(events, job.EventRetryScheduled, "") != 0 ||
				adopted == nil || adopted.WorkerID != "second" || adopted.Attempt != 1 || !strings.Contains(adopted.Message, name) {
				t.Errorf("events: %d final, %d started, %d retries, adopted %+v", final, count(events, job.EventStarted, ""),
					count(events, job.EventRetryScheduled, ""), adopted)
			}
			if tc.handoff && find(events, job.EventHeartbeat, job.PhaseHandedOff) == nil {
				t.Error("no handed_off event from the stopping worker")
			}
			s, err := f.Client.Status(context.Background(), id)
			if err != nil || s.Job.Adoptions != 1 || s.Job.Attempt != 1 {
				t.Errorf("record: %+v, %v; want one attempt, adopted once", s.Job, err)
			}
			f.requireHistory(t, "k8s", []string{id}, ear)
		})
	}
}

// TestKubeJobThatEndedWhileNoWorkerRan: the only worker is killed, the
// Jobs end while no worker runs, and the worker that starts later settles
// each from its real outcome, without running anything again: one result
// each (historytest).
func TestKubeJobThatEndedWhileNoWorkerRan(t *testing.T) {
	t.Parallel()
	f := startFleet(t)
	n := kubeNamespace(t)
	w := f.worker(t, n.workerArgs(t, "only", "k8s")...)
	ear := f.listen(t, "k8s")
	ok := longJob("ends-well", "k8s", 3*time.Second)
	bad := longJob("ends-badly", "k8s", 3*time.Second)
	bad.Labels[kubetest.AnnotationExitCode] = "3"
	bad.Outputs = nil
	f.Submit(t, ok)
	f.Submit(t, bad)
	pod := n.runningPod(t, ok.ID)
	n.writeOutput(t, pod, "model.txt", "done")
	n.runningPod(t, bad.ID)
	w.Kill()
	ran := map[string]string{ok.ID: n.jobsOf(t, ok.ID)[0].Name, bad.ID: n.jobsOf(t, bad.ID)[0].Name}
	n.env.WaitForJobCondition(t, n.name, ran[ok.ID], batchv1.JobComplete, time.Minute)
	n.env.WaitForJobCondition(t, n.name, ran[bad.ID], batchv1.JobFailed, time.Minute)

	f.worker(t, n.workerArgs(t, "later", "k8s")...)
	r := f.Await(t, ok.ID, time.Minute)
	if r.Status != job.StatusSucceeded || r.Attempts != 1 || r.Outputs["model.txt"] != "done" {
		t.Errorf("the Job that completed: %s after %d attempts, outputs %q, failure %+v", r.Status, r.Attempts, r.Outputs, r.Failure)
	}
	r = f.Await(t, bad.ID, time.Minute)
	if r.Status != job.StatusFailed || r.Attempts != 1 || r.ExitCode == nil || *r.ExitCode != 3 ||
		r.Failure == nil || r.Failure.Code != job.CodeExitCode {
		t.Errorf("the Job that failed: %s after %d attempts, exit %v, failure %+v", r.Status, r.Attempts, r.ExitCode, r.Failure)
	}
	for _, id := range []string{ok.ID, bad.ID} {
		// The one that ran, until the worker deletes it after the result.
		for _, j := range n.jobsOf(t, id) {
			if j.Name != ran[id] {
				t.Errorf("%s: a second Job %s, beside %s", id, j.Name, ran[id])
			}
		}
		waitFor(t, id+": its Job deleted after the result", 30*time.Second, func() bool { return len(n.jobsOf(t, id)) == 0 })
		adopted := find(f.Events(t, id, 10*time.Second), job.EventHeartbeat, job.PhaseAdopted)
		if adopted == nil || !strings.Contains(adopted.Message, "ended while no worker followed it") {
			t.Errorf("%s: adopted event %+v", id, adopted)
		}
	}
	f.requireHistory(t, "k8s", []string{ok.ID, bad.ID}, ear)
}

// TestKubeGPUPlacementAndPodTemplate: a pool whose pod template tolerates
// the GPU node's taint runs a job asking for an H100 there, with the
// template's node selector, tolerations, pull secrets and service account
// on its Job; a job asking for an A100 is refused at admission, naming the
// models there are; a pool without the toleration reports the pod
// unschedulable, class infrastructure, after --pending-wait.
func TestKubeGPUPlacementAndPodTemplate(t *testing.T) {
	t.Parallel()
	f := startFleet(t)
	n := kubeNamespace(t)
	ctx := context.Background()
	n.env.Apply(t, "", filepath.Join(repoRoot(t), "deploy", "kubernetes", "worker-nodes-rbac.yaml"))
	bindNodes(t, n)
	if _, err := n.env.Client.CoreV1().ServiceAccounts(n.name).Create(ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: "trainer"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tmpl := writeFile(t, "gpu-pool.yaml", `
metadata:
  labels:
    team: ml
  annotations:
    fleet.test/duration: 1500ms
spec:
  serviceAccountName: trainer
  nodeSelector:
    kubernetes.io/os: linux
  tolerations:
  - key: gpu
    operator: Equal
    value: "true"
    effect: NoSchedule
  imagePullSecrets:
  - name: registry-credentials
  containers:
  - name: job
    env:
    - name: NCCL_DEBUG
      value: INFO
`)
	f.worker(t, n.workerArgs(t, "gpu-worker", "gpu", "--pod-template", tmpl, "--placement-keys", "kubernetes.io/os")...)
	f.worker(t, n.workerArgs(t, "plain-worker", "plain", "--pending-wait", "3s")...)
	waitFor(t, "both workers to report the H100 node", 20*time.Second, func() bool {
		hbs, err := f.caps.Workers(ctx, "")
		seen := 0
		for _, hb := range hbs {
			if hb.Inventory != nil && slices.ContainsFunc(hb.Inventory.GPUs, func(g job.GPUModel) bool { return g.Model == "H100" && g.Count == 4 }) {
				seen++
			}
		}
		return err == nil && seen == 2
	})
	gpuJob := func(id, pool, model string) *job.Request {
		return &job.Request{ID: id, Pool: pool, Image: "registry.example/trainer:1", Command: []string{"/train"},
			Resources: &job.Resources{GPU: 1, GPUModel: model}, Timeout: dur(time.Minute)}
	}

	id := f.Submit(t, gpuJob("on-h100", "gpu", "H100"))
	// The Job and its pod as they run: the worker deletes them after the
	// result.
	pod := n.runningPod(t, id)
	jobs := n.jobsOf(t, id)
	if len(jobs) != 1 {
		t.Fatalf("%d Jobs, want 1", len(jobs))
	}
	r := f.Await(t, id, time.Minute)
	if r.Status != job.StatusSucceeded {
		t.Fatalf("the H100 job: %s %+v", r.Status, r.Failure)
	}
	spec := jobs[0].Spec.Template.Spec
	if want := map[string]string{"kubernetes.io/os": "linux", job.GPUModelLabel: "H100"}; !mapsEqual(spec.NodeSelector, want) {
		t.Errorf("nodeSelector %v, want %v", spec.NodeSelector, want)
	}
	if !slices.ContainsFunc(spec.Tolerations, func(tl corev1.Toleration) bool { return tl.Key == "gpu" && tl.Value == "true" }) ||
		len(spec.ImagePullSecrets) != 1 || spec.ImagePullSecrets[0].Name != "registry-credentials" || spec.ServiceAccountName != "trainer" {
		t.Errorf("tolerations %v, imagePullSecrets %v, serviceAccountName %q", spec.Tolerations, spec.ImagePullSecrets, spec.ServiceAccountName)
	}
	// The fleet's own settings stay where the template says nothing.
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken || spec.SecurityContext == nil ||
		spec.SecurityContext.RunAsNonRoot == nil || !*spec.SecurityContext.RunAsNonRoot || jobs[0].Spec.Template.Labels["team"] != "ml" ||
		!slices.ContainsFunc(spec.Containers[0].Env, func(e corev1.EnvVar) bool { return e.Name == "NCCL_DEBUG" }) {
		t.Errorf("pod spec: automount %v, security %+v, labels %v, env %v", spec.AutomountServiceAccountToken, spec.SecurityContext,
			jobs[0].Spec.Template.Labels, spec.Containers[0].Env)
	}
	if pod.Spec.NodeName != kubetest.GPUNode {
		t.Errorf("the H100 job's pod: %s on %q; want it on node %s", pod.Name, pod.Spec.NodeName, kubetest.GPUNode)
	}

	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := f.Client.Submit(sctx, gpuJob("on-a100", "gpu", "A100"))
	var rej *client.RejectedError
	if !errors.As(err, &rej) || !strings.Contains(rej.Reason, "A100") || !strings.Contains(rej.Reason, "4×H100") {
		t.Errorf("an A100 job: %v; want it refused at admission, naming the H100s", err)
	} else {
		t.Logf("refused: %s", rej.Reason)
	}

	id = f.Submit(t, gpuJob("intolerant", "plain", "H100"))
	r = f.Await(t, id, time.Minute)
	if r.Status != job.StatusFailed || r.Failure == nil || r.Failure.Class != job.ClassInfrastructure || r.Failure.Code != job.CodeUnschedulable {
		t.Errorf("the job of the pool without the toleration: %s %+v; want infrastructure/unschedulable", r.Status, r.Failure)
	} else {
		t.Logf("unschedulable: %s", r.Failure.Message)
	}
}

// bindNodes binds the ClusterRole of worker-nodes-rbac.yaml to the
// namespace's worker ServiceAccount, as its comment says to.
func bindNodes(t *testing.T, n *namespace) {
	t.Helper()
	name := "fleet-worker-nodes-" + n.name
	out, err := kubectl(n.env, "create", "clusterrolebinding", name, "--clusterrole=fleet-worker-nodes",
		"--serviceaccount="+n.name+":fleet-worker")
	if err != nil {
		t.Fatalf("kubectl create clusterrolebinding: %v\n%s", err, out)
	}
	t.Cleanup(func() { _, _ = kubectl(n.env, "delete", "clusterrolebinding", name) })
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
