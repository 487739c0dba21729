package kube

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/executor/executortest"
	"github.com/fleet-dev/fleet/internal/kubetest"
	"github.com/fleet-dev/fleet/job"
)

// These tests run the executor against a real API server, controller
// manager (the Job controller, the garbage collector) and scheduler, with
// kwok as the kubelet of a fake node (see internal/kubetest). Pods run
// nothing: annotations tell kwok how they end.

func TestMain(m *testing.M) {
	// The worker that the conformance suite's recover kills.
	executortest.MaybeOrphan(startOrphan)
	kubetest.Main(m)
}

type cluster struct {
	env    *kubetest.Env
	ns     string
	exec   *Executor
	report *recorder
}

// start gives the test a namespace where pods must meet the "restricted"
// Pod Security Standard, and an executor for it. pod holds the annotations
// that steer kwok.
func start(t *testing.T, pod map[string]string, change func(*Config)) *cluster {
	t.Helper()
	env := kubetest.Start(t)
	c := &cluster{env: env, ns: env.NewNamespace(t), report: &recorder{}}
	c.restrict(t)
	cfg := Config{Client: env.Client, Namespace: c.ns, WorkerID: "worker-1", PodAnnotations: pod,
		Grace: time.Second, ImagePullWait: 2 * time.Second, PendingWait: 2 * time.Second, Logger: testLogger(t)}
	if change != nil {
		change(&cfg)
	}
	var err error
	c.exec, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.exec.Close() })
	return c
}

// restrict makes the API server refuse pods that run as root, may gain
// privileges, keep capabilities or run without a seccomp profile.
func (c *cluster) restrict(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, err := c.env.Client.CoreV1().Namespaces().Get(ctx, c.ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Labels["pod-security.kubernetes.io/enforce"] = "restricted"
	if _, err := c.env.Client.CoreV1().Namespaces().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (c *cluster) run(ctx context.Context, req *job.Request) (*executor.Outcome, error) {
	tk := task(req)
	tk.Report = c.report
	return c.exec.Run(ctx, tk)
}

func (c *cluster) mustRun(t *testing.T, ctx context.Context, req *job.Request) *executor.Outcome {
	t.Helper()
	begin := time.Now()
	out, err := c.run(ctx, req)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	t.Logf("%s in %s; phases: %s", describe(out), time.Since(begin).Round(10*time.Millisecond), c.report.phaseList())
	return out
}

// left counts the Jobs and pods that still exist in the namespace.
func (c *cluster) left(t *testing.T) (jobs, pods int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	j, err := c.env.Client.BatchV1().Jobs(c.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := c.env.Client.CoreV1().Pods(c.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return len(j.Items), len(p.Items)
}

func timeout(d time.Duration) func(*job.Request) {
	return func(r *job.Request) {
		v := job.Duration(d)
		r.Timeout = &v
	}
}

// How attempts end, their logs, env, workspace and outputs, and crash
// recovery are the conformance suite's (TestConformance). These tests cover
// what is Kubernetes' own.

// TestKubeJobMetadata checks what the worker finds its attempts by, and
// that the Secret goes with its Job.
func TestKubeJobMetadata(t *testing.T) {
	t.Parallel()
	c := start(t, map[string]string{kubetest.AnnotationDuration: "1500ms"}, nil)
	out := c.mustRun(t, context.Background(), request(func(r *job.Request) {
		r.Env = map[string]string{"TOKEN": "s3cr3t"}
		r.Labels = map[string]string{"team": "search"}
	}))
	equal(t, "outcome", describe(out), "succeeded exit 0")
	equal(t, "phases", c.report.phaseList(), "Pending Running Succeeded")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	jobs, err := c.env.Client.BatchV1().Jobs(c.ns).List(ctx, metav1.ListOptions{LabelSelector: "fleet.dev/worker-id=worker-1,team=search"})
	if err != nil || len(jobs.Items) != 1 {
		t.Fatalf("Jobs of the worker: %v, %v", jobs, err)
	}
	j := jobs.Items[0]
	equal(t, "job id annotation", j.Annotations[AnnotationJobID], "job-1")
	secret, err := c.env.Client.CoreV1().Secrets(c.ns).Get(ctx, j.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the attempt's Secret: %v", err)
	}
	if len(secret.OwnerReferences) != 1 || secret.OwnerReferences[0].UID != j.UID {
		t.Errorf("Secret owners = %+v, want the Job", secret.OwnerReferences)
	}
}

func TestKubeImagePull(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		pullWait      time.Duration
		timeout       time.Duration
		want, message string
		// The executor deletes a Job it gives up on; a Job that failed
		// at its deadline stays for Cleanup, after the result.
		jobsLeft int
	}{
		{"after the bounded wait", 2 * time.Second, time.Minute, "failed image/image_pull_failed", "the image could not be pulled for 2s", 0},
		{"at the deadline", time.Minute, 2 * time.Second, "failed image/image_pull_failed", "the image could not be pulled: ", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := start(t, nil, func(c *Config) { c.ImagePullWait = tc.pullWait })
			out := c.mustRun(t, context.Background(), request(func(r *job.Request) {
				r.Image = "registry.example/" + kubetest.MissingImageMarker + ":1"
				timeout(tc.timeout)(r)
			}))
			equal(t, "outcome", describe(out), tc.want)
			if d := out.FinishedAt.Sub(out.StartedAt); d < 2*time.Second {
				t.Errorf("gave up on the image after %s, want 2s", d)
			}
			if !strings.HasPrefix(out.Failure.Message, tc.message) || !strings.Contains(out.Failure.Message, "ImagePull") {
				t.Errorf("message %q does not say why", out.Failure.Message)
			}
			if jobs, pods := c.left(t); jobs != tc.jobsLeft || pods != 0 {
				t.Errorf("%d Jobs and %d pods left, want %d and none", jobs, pods, tc.jobsLeft)
			}
		})
	}
}

func TestKubeUnschedulable(t *testing.T) {
	t.Parallel()
	c := start(t, nil, nil)
	out := c.mustRun(t, context.Background(), request(func(r *job.Request) { r.Resources = &job.Resources{CPU: "64"} }))
	equal(t, "outcome", describe(out), "failed infrastructure/unschedulable")
	if !strings.Contains(out.Failure.Message, "Insufficient cpu") {
		t.Errorf("message %q does not say why", out.Failure.Message)
	}
}

// sharedVolume makes a ReadWriteMany claim fleet-shared, bound to a
// hostPath volume at dir.
func (c *cluster) sharedVolume(t *testing.T, dir string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rwx := []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}
	size := corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}
	pv, err := c.env.Client.CoreV1().PersistentVolumes().Create(ctx, &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: c.ns + "-shared"},
		Spec: corev1.PersistentVolumeSpec{
			AccessModes: rwx, Capacity: size, StorageClassName: "manual",
			PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir}},
			ClaimRef:               &corev1.ObjectReference{Namespace: c.ns, Name: "fleet-shared"},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.env.Client.CoreV1().PersistentVolumes().Delete(context.Background(), pv.Name, metav1.DeleteOptions{})
	})
	_, err = c.env.Client.CoreV1().PersistentVolumeClaims(c.ns).Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "fleet-shared"},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: rwx, StorageClassName: new("manual"),
			Resources: corev1.VolumeResourceRequirements{Requests: size}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

func TestKubeRBAC(t *testing.T) {
	t.Parallel()
	env := kubetest.Start(t)
	ns, other := env.NewNamespace(t), env.NewNamespace(t)
	rbac := filepath.Join(repoRoot(t), "deploy", "kubernetes", "worker-rbac.yaml")
	apply := exec.Command(env.Kubectl, "--kubeconfig", env.KubeconfigPath, "apply", "-n", ns, "-f", rbac)
	if out, err := apply.CombinedOutput(); err != nil {
		t.Fatalf("kubectl apply: %v\n%s", err, out)
	}
	client, err := kubernetes.NewForConfig(env.ConfigFor(t, ns, "fleet-worker"))
	if err != nil {
		t.Fatal(err)
	}
	env.SetPodLogs(t, ns, "logged under RBAC")
	c := &cluster{env: env, ns: ns, report: &recorder{}}
	c.exec, err = New(Config{Client: client, Namespace: ns, WorkerID: "worker-1", Grace: time.Second, SyncTimeout: 5 * time.Second,
		PodAnnotations: map[string]string{kubetest.AnnotationDuration: "1500ms"}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.exec.Close() })
	ctx := context.Background()

	// What the worker does.
	if err := c.exec.Recover(ctx, "worker-1"); err != nil {
		t.Errorf("Recover: %v", err)
	}
	if _, err := c.exec.Capacity(ctx); err != nil {
		t.Errorf("Capacity: %v", err)
	}
	out := c.mustRun(t, ctx, request(func(r *job.Request) {
		r.Env = map[string]string{"TOKEN": "s3cr3t"}
		r.Inputs = map[string]string{"params.json": "{}"}
	}))
	equal(t, "outcome", describe(out), "succeeded exit 0")
	equal(t, "stdout", out.Stdout, "logged under RBAC\n")
	c.report = &recorder{}
	out = c.mustRun(t, cancelWhenRunning(c.report), request(timeout(time.Hour)))
	equal(t, "cancelled", describe(out), "cancelled cancelled/cancelled")
	if err := c.exec.Recover(ctx, "worker-1"); err != nil {
		t.Errorf("Recover of finished Jobs: %v", err)
	}

	// What it must not.
	forbidden := func(what string, err error) {
		t.Helper()
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s: err = %v, want Forbidden", what, err)
		}
	}
	_, err = client.BatchV1().Jobs(other).Create(ctx, &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{})
	forbidden("create a Job in another namespace", err)
	_, err = client.CoreV1().Pods(other).List(ctx, metav1.ListOptions{})
	forbidden("list pods in another namespace", err)
	_, err = client.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
	forbidden("read Secrets", err)
	_, err = client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{})
	forbidden("create a pod directly", err)

	elsewhere, err := New(Config{Client: client, Namespace: other, WorkerID: "worker-1", SyncTimeout: 2 * time.Second, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer elsewhere.Close()
	tk := task(request(nil))
	tk.Report = &recorder{}
	if _, err := elsewhere.Run(ctx, tk); err == nil || !strings.Contains(err.Error(), "forbidden") {
		t.Errorf("Run in another namespace: err = %v, want a forbidden watch", err)
	}
}

// cancelWhenRunning returns a context that a user cancels once the attempt
// reports its pod running.
func cancelWhenRunning(r *recorder) context.Context {
	ctx, cancel := context.WithCancelCause(context.Background())
	go func() {
		if r.waitFor("Running", 30*time.Second) {
			cancel(executor.ErrCancelled)
		} else {
			cancel(errors.New("the pod never ran"))
		}
	}()
	return ctx
}

func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}
