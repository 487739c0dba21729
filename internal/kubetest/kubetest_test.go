package kubetest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/fleet-dev/fleet/internal/kubetest"
)

func TestMain(m *testing.M) { kubetest.Main(m) }

// newJob returns a one-pod Job that is never retried, as the executor makes.
func newJob(name string, annotations map[string]string) *batchv1.Job {
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: batchv1.JobSpec{
			BackoffLimit: new(int32(0)),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Annotations: annotations},
				Spec: corev1.PodSpec{
					RestartPolicy: corev1.RestartPolicyNever,
					Containers: []corev1.Container{{
						Name:    "main",
						Image:   "registry.example/fleet/worker:test",
						Command: []string{"/bin/true"},
					}},
				},
			},
		},
	}
}

func createJob(t *testing.T, client kubernetes.Interface, namespace string, job *batchv1.Job) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := client.BatchV1().Jobs(namespace).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create job: %v", err)
	}
}

func jobPods(t *testing.T, client kubernetes.Interface, namespace, job string) []corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pods, err := client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "job-name=" + job})
	if err != nil {
		t.Fatalf("list pods: %v", err)
	}
	return pods.Items
}

func TestJobSucceeds(t *testing.T) {
	t.Parallel()
	env := kubetest.Start(t)
	ns := env.NewNamespace(t)
	env.SetPodLogs(t, ns, "hello from kwok", "second line")

	begin := time.Now()
	createJob(t, env.Client, ns, newJob("ok", map[string]string{kubetest.AnnotationDuration: "500ms"}))
	job := env.WaitForJobCondition(t, ns, "ok", batchv1.JobComplete, time.Minute)
	t.Logf("job created -> Complete in %s", time.Since(begin).Round(10*time.Millisecond))
	if job.Status.Succeeded != 1 {
		t.Errorf("succeeded = %d, want 1", job.Status.Succeeded)
	}

	pods := jobPods(t, env.Client, ns, "ok")
	if len(pods) != 1 {
		t.Fatalf("got %d pods, want 1", len(pods))
	}
	pod := pods[0]
	if pod.Status.Phase != corev1.PodSucceeded {
		t.Errorf("pod phase = %s, want Succeeded", pod.Status.Phase)
	}
	term := pod.Status.ContainerStatuses[0].State.Terminated
	if term == nil || term.ExitCode != 0 || term.Reason != "Completed" {
		t.Errorf("container state = %+v, want terminated with exit code 0, reason Completed", pod.Status.ContainerStatuses[0].State)
	}

	// kwok serves the lines set above as the container's log.
	var logs string
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		raw, err := env.Client.CoreV1().Pods(ns).GetLogs(pod.Name, &corev1.PodLogOptions{Container: "main"}).DoRaw(ctx)
		cancel()
		logs = string(raw)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("get logs: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if want := "hello from kwok\nsecond line\n"; logs != want {
		t.Errorf("logs = %q, want %q", logs, want)
	}
}

func TestJobFailsWithExitCode(t *testing.T) {
	t.Parallel()
	env := kubetest.Start(t)
	ns := env.NewNamespace(t)

	createJob(t, env.Client, ns, newJob("exit3", map[string]string{kubetest.AnnotationExitCode: "3"}))
	job := env.WaitForJobCondition(t, ns, "exit3", batchv1.JobFailed, time.Minute)
	if job.Status.Failed != 1 {
		t.Errorf("failed = %d, want 1", job.Status.Failed)
	}
	pods := jobPods(t, env.Client, ns, "exit3")
	if len(pods) != 1 {
		t.Fatalf("got %d pods, want 1", len(pods))
	}
	if pods[0].Status.Phase != corev1.PodFailed {
		t.Errorf("pod phase = %s, want Failed", pods[0].Status.Phase)
	}
	term := pods[0].Status.ContainerStatuses[0].State.Terminated
	if term == nil || term.ExitCode != 3 || term.Reason != "Error" {
		t.Errorf("container state = %+v, want terminated with exit code 3, reason Error", pods[0].Status.ContainerStatuses[0].State)
	}
}

func TestJobOOMKilled(t *testing.T) {
	t.Parallel()
	env := kubetest.Start(t)
	ns := env.NewNamespace(t)

	createJob(t, env.Client, ns, newJob("oom", map[string]string{kubetest.AnnotationOOM: "true", kubetest.AnnotationDuration: "200ms"}))
	env.WaitForJobCondition(t, ns, "oom", batchv1.JobFailed, time.Minute)
	pods := jobPods(t, env.Client, ns, "oom")
	if len(pods) != 1 {
		t.Fatalf("got %d pods, want 1", len(pods))
	}
	term := pods[0].Status.ContainerStatuses[0].State.Terminated
	if term == nil || term.ExitCode != 137 || term.Reason != "OOMKilled" {
		t.Errorf("container state = %+v, want terminated with exit code 137, reason OOMKilled", pods[0].Status.ContainerStatuses[0].State)
	}
}

func TestJobDeadlineExceeded(t *testing.T) {
	t.Parallel()
	env := kubetest.Start(t)
	ns := env.NewNamespace(t)

	job := newJob("slow", map[string]string{kubetest.AnnotationDuration: "1h"})
	job.Spec.ActiveDeadlineSeconds = new(int64(2))
	createJob(t, env.Client, ns, job)
	got := env.WaitForJobCondition(t, ns, "slow", batchv1.JobFailed, time.Minute)
	var reason string
	for _, c := range got.Status.Conditions {
		if c.Type == batchv1.JobFailed {
			reason = c.Reason
		}
	}
	if reason != batchv1.JobReasonDeadlineExceeded {
		t.Errorf("Failed reason = %q, want %q", reason, batchv1.JobReasonDeadlineExceeded)
	}
	// The Job controller deleted the running pod and kwok removed it.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for len(jobPods(t, env.Client, ns, "slow")) != 0 {
		if ctx.Err() != nil {
			t.Fatalf("the pod of the timed-out job was not deleted")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestImagePullError(t *testing.T) {
	t.Parallel()
	env := kubetest.Start(t)
	ns := env.NewNamespace(t)

	job := newJob("noimage", nil)
	job.Spec.Template.Spec.Containers[0].Image = "registry.example/does-not-exist:1"
	createJob(t, env.Client, ns, job)

	seen := map[string]bool{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for !seen["ErrImagePull"] || !seen["ImagePullBackOff"] {
		if ctx.Err() != nil {
			t.Fatalf("saw waiting reasons %v, want ErrImagePull and ImagePullBackOff", seen)
		}
		for _, p := range jobPods(t, env.Client, ns, "noimage") {
			if p.Status.Phase != corev1.PodPending {
				t.Fatalf("pod phase = %s, want Pending", p.Status.Phase)
			}
			for _, s := range p.Status.ContainerStatuses {
				if s.State.Waiting != nil {
					seen[s.State.Waiting.Reason] = true
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestServiceAccountRBAC(t *testing.T) {
	t.Parallel()
	env := kubetest.Start(t)
	ns := env.NewNamespace(t)
	other := env.NewNamespace(t)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := env.Client.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "job-runner"},
		Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{"batch"},
			Resources: []string{"jobs"},
			Verbs:     []string{"create", "get", "list", "watch", "delete"},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create role: %v", err)
	}
	_, err = env.Client.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "job-runner"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "job-runner"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "fleet-worker", Namespace: ns}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create role binding: %v", err)
	}

	client, err := kubernetes.NewForConfig(env.ConfigFor(t, ns, "fleet-worker"))
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	if _, err := client.BatchV1().Jobs(ns).Create(ctx, newJob("allowed", nil), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create job in own namespace: %v", err)
	}
	_, err = client.BatchV1().Jobs(other).Create(ctx, newJob("denied", nil), metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("create job in another namespace: err = %v, want Forbidden", err)
	}
	if !strings.Contains(err.Error(), "system:serviceaccount:"+ns+":fleet-worker") {
		t.Errorf("Forbidden error does not name the service account: %v", err)
	}
}

// TestLabelsSteerAPodWithoutAnnotations: a pod's labels of the annotations'
// names steer it when it has no such annotation.
func TestLabelsSteerAPodWithoutAnnotations(t *testing.T) {
	t.Parallel()
	env := kubetest.Start(t)
	ns := env.NewNamespace(t)
	j := newJob("labelled", nil)
	j.Spec.Template.Labels = map[string]string{kubetest.AnnotationExitCode: "4", kubetest.AnnotationDuration: "1500ms"}
	begin := time.Now()
	createJob(t, env.Client, ns, j)
	env.WaitForJobCondition(t, ns, "labelled", batchv1.JobFailed, time.Minute)
	if took := time.Since(begin); took < 1500*time.Millisecond {
		t.Errorf("the pod ended after %s, before the duration of its label", took)
	}
	pods := jobPods(t, env.Client, ns, "labelled")
	if len(pods) != 1 {
		t.Fatalf("got %d pods, want 1", len(pods))
	}
	if term := pods[0].Status.ContainerStatuses[0].State.Terminated; term == nil || term.ExitCode != 4 {
		t.Errorf("container state = %+v, want terminated with exit code 4", pods[0].Status.ContainerStatuses[0].State)
	}
}

// TestGPUNodeTakesOnlyPodsThatTolerateItsTaint: the GPU node is tainted,
// and labelled with its GPU model.
func TestGPUNodeTakesOnlyPodsThatTolerateItsTaint(t *testing.T) {
	t.Parallel()
	env := kubetest.Start(t)
	ns := env.NewNamespace(t)
	gpu := func(name string, tolerate bool) *batchv1.Job {
		j := newJob(name, map[string]string{kubetest.AnnotationDuration: "500ms"})
		j.Spec.Template.Spec.NodeSelector = map[string]string{"nvidia.com/gpu.product": "H100"}
		j.Spec.Template.Spec.Containers[0].Resources = corev1.ResourceRequirements{
			Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}}
		if tolerate {
			j.Spec.Template.Spec.Tolerations = []corev1.Toleration{{Key: "gpu", Operator: corev1.TolerationOpEqual, Value: "true", Effect: corev1.TaintEffectNoSchedule}}
		}
		return j
	}
	createJob(t, env.Client, ns, gpu("tolerates", true))
	createJob(t, env.Client, ns, gpu("intolerant", false))
	env.WaitForJobCondition(t, ns, "tolerates", batchv1.JobComplete, time.Minute)
	if pods := jobPods(t, env.Client, ns, "tolerates"); len(pods) != 1 || pods[0].Spec.NodeName != kubetest.GPUNode {
		t.Errorf("the pod that tolerates the taint: %d pods, on %q", len(pods), pods[0].Spec.NodeName)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		pods := jobPods(t, env.Client, ns, "intolerant")
		if len(pods) == 1 {
			for _, c := range pods[0].Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Reason == corev1.PodReasonUnschedulable {
					t.Logf("unschedulable: %s", c.Message)
					return
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pod that does not tolerate the taint is not unschedulable: %+v", pods)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
