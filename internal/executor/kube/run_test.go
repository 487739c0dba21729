package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/job"
)

// These tests run the executor against client-go's fake clientset: the
// tests play the Job controller and the kubelet by writing the Job's and
// pod's status, and the executor sees them through its informers.

const ns = "fleet"

type bundle struct {
	client *fake.Clientset
	exec   *Executor
	report *recorder
}

// setup returns an executor whose fake API server holds objects. change
// may adjust the configuration, and add reactors to the client, before the
// executor starts.
func setup(t *testing.T, change func(*Config), objects ...runtime.Object) *bundle {
	t.Helper()
	client := fake.NewClientset(objects...)
	// The garbage collector: pods go with their Job.
	client.PrependReactor("delete", "jobs", func(a k8stesting.Action) (bool, runtime.Object, error) {
		name := a.(k8stesting.DeleteAction).GetName()
		pods, _ := client.Tracker().List(corev1.SchemeGroupVersion.WithResource("pods"), corev1.SchemeGroupVersion.WithKind("Pod"), ns)
		for _, p := range pods.(*corev1.PodList).Items {
			if p.Labels[batchv1.JobNameLabel] == name {
				_ = client.Tracker().Delete(corev1.SchemeGroupVersion.WithResource("pods"), ns, p.Name)
			}
		}
		return false, nil, nil
	})
	cfg := Config{Client: client, Namespace: ns, WorkerID: "worker-1", Logger: testLogger(t)}
	if change != nil {
		change(&cfg)
	}
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return &bundle{client: client, exec: e, report: &recorder{}}
}

type result struct {
	out *executor.Outcome
	err error
}

// run runs an attempt of req in the background.
func (b *bundle) run(ctx context.Context, req *job.Request) <-chan result {
	done := make(chan result, 1)
	tk := task(req)
	tk.Pool = "default"
	tk.Report = b.report
	go func() {
		out, err := b.exec.Run(ctx, tk)
		done <- result{out, err}
	}()
	return done
}

// awaitJob waits for the attempt's Job.
func (b *bundle) awaitJob(t *testing.T) *batchv1.Job {
	t.Helper()
	var j *batchv1.Job
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 5*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := b.client.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{})
		if err != nil || len(list.Items) == 0 {
			return false, err
		}
		j = &list.Items[0]
		return true, nil
	})
	if err != nil {
		t.Fatalf("no Job: %v", err)
	}
	return j
}

// setPod creates or updates the Job's pod, as the Job controller and the
// kubelet would.
func (b *bundle) setPod(t *testing.T, j *batchv1.Job, phase corev1.PodPhase, s corev1.ContainerState, change ...func(*corev1.Pod)) {
	t.Helper()
	pod := podIn(phase, s, change...)
	pod.Name = j.Name + "-pod"
	pod.Namespace = ns
	pod.Labels = map[string]string{batchv1.JobNameLabel: j.Name}
	for k, v := range j.Spec.Template.Labels {
		pod.Labels[k] = v
	}
	ctx := context.Background()
	pods := b.client.CoreV1().Pods(ns)
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		_, err = pods.UpdateStatus(ctx, pod, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	} else if err != nil {
		t.Fatal(err)
	}
}

// endJob gives the Job a terminal condition.
func (b *bundle) endJob(t *testing.T, j *batchv1.Job, c batchv1.JobCondition) {
	t.Helper()
	j = j.DeepCopy()
	j.Status.Conditions = append(j.Status.Conditions, c)
	if _, err := b.client.BatchV1().Jobs(ns).UpdateStatus(context.Background(), j, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (b *bundle) jobExists(t *testing.T, name string) bool {
	t.Helper()
	_, err := b.client.BatchV1().Jobs(ns).Get(context.Background(), name, metav1.GetOptions{})
	return err == nil
}

func await(t *testing.T, done <-chan result) *executor.Outcome {
	t.Helper()
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatalf("Run: %v", r.err)
		}
		return r.out
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}
	return nil
}

func describe(out *executor.Outcome) string {
	s := string(out.Status)
	if out.Failure != nil {
		s += " " + string(out.Failure.Class) + "/" + string(out.Failure.Code)
	}
	if out.ExitCode != nil {
		s += fmt.Sprintf(" exit %d", *out.ExitCode)
	}
	return s
}

func TestRunSucceeds(t *testing.T) {
	b := setup(t, nil)
	req := request(func(r *job.Request) {
		r.Env = map[string]string{"TOKEN": "s3cr3t"}
		r.Inputs = map[string]string{"params.json": "{}"}
	})
	done := b.run(context.Background(), req)
	j := b.awaitJob(t)

	b.setPod(t, j, corev1.PodRunning, running)
	b.report.await(t, "Running")
	b.setPod(t, j, corev1.PodSucceeded, exited(0, "Completed"))
	b.endJob(t, j, cond(batchv1.JobComplete, "CompletionsReached"))
	out := await(t, done)

	secret, err := b.client.CoreV1().Secrets(ns).Get(context.Background(), j.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("Secret: %v", err)
	}
	if len(secret.OwnerReferences) != 1 || secret.OwnerReferences[0].Kind != "Job" || secret.OwnerReferences[0].Name != j.Name {
		t.Errorf("Secret owners = %+v, want the Job %s", secret.OwnerReferences, j.Name)
	}

	equal(t, "outcome", describe(out), "succeeded exit 0")
	equal(t, "stdout", out.Stdout, "fake logs")
	if out.StartedAt.IsZero() || out.FinishedAt.Before(out.StartedAt) {
		t.Errorf("started %s, finished %s", out.StartedAt, out.FinishedAt)
	}
	equal(t, "phases", b.report.phaseList(), "Pending Running Succeeded")
	equal(t, "logs", b.report.logList(), "stdout:fake logs")
}

func TestRunReadsTheLogOfAQuickPod(t *testing.T) {
	b := setup(t, nil)
	done := b.run(context.Background(), request(nil))
	j := b.awaitJob(t)
	b.setPod(t, j, corev1.PodSucceeded, exited(0, "Completed"))
	b.endJob(t, j, cond(batchv1.JobComplete, "CompletionsReached"))
	out := await(t, done)
	equal(t, "outcome", describe(out), "succeeded exit 0")
	equal(t, "stdout", out.Stdout, "fake logs")
}

func TestRunFailures(t *testing.T) {
	for _, tc := range []struct {
		name  string
		pod   corev1.ContainerState
		phase corev1.PodPhase
		end   batchv1.JobCondition
		want  string
	}{
		{"exit code", exited(3, "Error"), corev1.PodFailed, cond(batchv1.JobFailed, "BackoffLimitExceeded"), "failed execution/exit_code exit 3"},
		{"OOM", exited(137, "OOMKilled"), corev1.PodFailed, cond(batchv1.JobFailed, "BackoffLimitExceeded"), "failed oom/oom_killed exit 137"},
		{"deadline", running, corev1.PodRunning, cond(batchv1.JobFailed, "DeadlineExceeded"), "timed_out timeout/attempt_timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := setup(t, nil)
			done := b.run(context.Background(), request(nil))
			j := b.awaitJob(t)
			b.setPod(t, j, tc.phase, tc.pod)
			b.endJob(t, j, tc.end)
			out := await(t, done)
			equal(t, "outcome", describe(out), tc.want)
		})
	}
}

func TestRunAsksTheAPIServerWhenTheCacheLags(t *testing.T) {
	// Once lagging is set, the API server has the pod's end and the
	// executor's cache does not.
	var lagging atomic.Pointer[corev1.Pod]
	b := setup(t, func(c *Config) {
		c.Client.(*fake.Clientset).PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
			if p := lagging.Load(); p != nil {
				return true, &corev1.PodList{Items: []corev1.Pod{*p}}, nil
			}
			return false, nil, nil
		})
	})
	done := b.run(context.Background(), request(nil))
	j := b.awaitJob(t)
	b.setPod(t, j, corev1.PodRunning, running)
	b.report.await(t, "Running")
	failed := podIn(corev1.PodFailed, exited(2, "Error"))
	failed.Labels = map[string]string{batchv1.JobNameLabel: j.Name}
	lagging.Store(failed)
	b.endJob(t, j, cond(batchv1.JobFailed, "BackoffLimitExceeded"))
	out := await(t, done)
	equal(t, "outcome", describe(out), "failed execution/exit_code exit 2")
}

func TestRunCancel(t *testing.T) {
	b := setup(t, nil)
	ctx, cancel := context.WithCancelCause(context.Background())
	done := b.run(ctx, request(nil))
	j := b.awaitJob(t)
	b.setPod(t, j, corev1.PodRunning, running)
	b.report.await(t, "Running")
	cancel(executor.ErrCancelled)
	out := await(t, done)

	equal(t, "outcome", describe(out), "cancelled cancelled/cancelled")
	equal(t, "message", out.Failure.Message, "job cancelled; Job and pod deleted")
	if b.jobExists(t, j.Name) {
		t.Error("the Job is still there")
	}
	var propagation metav1.DeletionPropagation
	for _, a := range b.client.Actions() {
		if d, ok := a.(k8stesting.DeleteAction); ok && a.GetResource().Resource == "jobs" {
			propagation = *d.GetDeleteOptions().PropagationPolicy
		}
	}
	equal(t, "propagation", propagation, metav1.DeletePropagationForeground)
}

func TestRunStuck(t *testing.T) {
	for _, tc := range []struct {
		name  string
		state corev1.ContainerState
		cond  func(*corev1.Pod)
		want  string
		wait  time.Duration
	}{
		{"image pull error", waiting("ErrImagePull"), nil, "failed image/image_pull_failed", 300 * time.Millisecond},
		{"invalid image name", waiting("InvalidImageName"), nil, "failed image/image_pull_failed", 0},
		{"unschedulable", corev1.ContainerState{}, withCondition(corev1.PodScheduled, corev1.ConditionFalse, "Unschedulable"), "failed infrastructure/unschedulable", 300 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := setup(t, func(c *Config) {
				c.ImagePullWait = 300 * time.Millisecond
				c.PendingWait = 300 * time.Millisecond
			})
			done := b.run(context.Background(), request(nil))
			j := b.awaitJob(t)
			begin := time.Now()
			var change []func(*corev1.Pod)
			if tc.cond != nil {
				change = append(change, tc.cond)
			}
			b.setPod(t, j, corev1.PodPending, tc.state, change...)
			out := await(t, done)
			equal(t, "outcome", describe(out), tc.want)
			if waited := time.Since(begin); waited < tc.wait {
				t.Errorf("gave up after %s, want %s", waited, tc.wait)
			}
			if b.jobExists(t, j.Name) {
				t.Error("the Job of a stuck pod is still there")
			}
		})
	}
}

func TestRunOverdue(t *testing.T) {
	b := setup(t, func(c *Config) { c.DeadlineSlack = 100 * time.Millisecond })
	done := b.run(context.Background(), request(func(r *job.Request) {
		d := job.Duration(time.Second)
		r.Timeout = &d
	}))
	j := b.awaitJob(t)
	b.setPod(t, j, corev1.PodRunning, running)
	out := await(t, done)
	equal(t, "outcome", describe(out), "timed_out timeout/job_overdue")
	if b.jobExists(t, j.Name) {
		t.Error("the overdue Job is still there")
	}
}

func TestRunJobDeletedElsewhere(t *testing.T) {
	b := setup(t, nil)
	done := b.run(context.Background(), request(nil))
	j := b.awaitJob(t)
	b.setPod(t, j, corev1.PodRunning, running)
	b.report.await(t, "Running")
	if err := b.client.BatchV1().Jobs(ns).Delete(context.Background(), j.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	out := await(t, done)
	equal(t, "outcome", describe(out), "failed infrastructure/job_deleted")
}

func TestRunOutputs(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write bool
		want  string
	}{
		{"written", true, "succeeded exit 0"},
		{"missing", false, "failed execution/output_missing exit 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			shared := t.TempDir()
			b := setup(t, func(c *Config) { c.SharedPVC, c.SharedDir = "fleet-shared", shared })
			done := b.run(context.Background(), request(func(r *job.Request) { r.Outputs = []string{"greeting.txt"} }))
			j := b.awaitJob(t)
			var sub string
			for _, m := range j.Spec.Template.Spec.Containers[0].VolumeMounts {
				if m.MountPath == "/fleet/outputs" {
					sub = m.SubPath
				}
			}
			if !strings.HasPrefix(sub, "worker-1/job-1-2-") {
				t.Fatalf("outputs sub-path = %q", sub)
			}
			if tc.write { // as the container would
				if err := os.WriteFile(filepath.Join(shared, sub, "greeting.txt"), []byte("hi\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			b.setPod(t, j, corev1.PodSucceeded, exited(0, "Completed"))
			b.endJob(t, j, cond(batchv1.JobComplete, "CompletionsReached"))
			out := await(t, done)
			equal(t, "outcome", describe(out), tc.want)
			if tc.write {
				equal(t, "output", out.Outputs["greeting.txt"], "hi\n")
			}
			if entries, _ := os.ReadDir(filepath.Join(shared, "worker-1")); len(entries) != 0 {
				t.Errorf("the attempt's folder is left on the shared volume: %v", entries)
			}
		})
	}
}

func TestRunRejectsBeforeTheAPIServer(t *testing.T) {
	b := setup(t, nil)
	done := b.run(context.Background(), request(func(r *job.Request) { r.Image = "" }))
	r := <-done
	var f *job.Failure
	if !errors.As(r.err, &f) || f.Class != job.ClassRejected {
		t.Fatalf("Run = %v, %v; want a rejection", r.out, r.err)
	}
	for _, a := range b.client.Actions() {
		if a.GetVerb() != "list" && a.GetVerb() != "watch" {
			t.Errorf("the API server was asked to %s %s", a.GetVerb(), a.GetResource().Resource)
		}
	}
}

func TestRunCleansUpAFailedSubmit(t *testing.T) {
	b := setup(t, func(c *Config) {
		c.Client.(*fake.Clientset).PrependReactor("create", "jobs", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewForbidden(batchv1.Resource("jobs"), "", errors.New("not allowed"))
		})
	})
	done := b.run(context.Background(), request(func(r *job.Request) { r.Env = map[string]string{"A": "b"} }))
	r := <-done
	if !apierrors.IsForbidden(r.err) {
		t.Fatalf("Run = %v, %v; want the Forbidden error", r.out, r.err)
	}
	secrets, _ := b.client.CoreV1().Secrets(ns).List(context.Background(), metav1.ListOptions{})
	if len(secrets.Items) != 0 {
		t.Errorf("Secrets left: %d", len(secrets.Items))
	}
}

func TestValidate(t *testing.T) {
	withPVC := Config{SharedPVC: "shared"}
	for _, tc := range []struct {
		name string
		cfg  Config
		req  func(*job.Request)
		want string // "" for valid
	}{
		{"valid", Config{}, nil, ""},
		{"no image", Config{}, func(r *job.Request) { r.Image = " " }, "an image is required"},
		{"outputs without a shared volume", Config{}, func(r *job.Request) { r.Outputs = []string{"a"} }, "no shared volume to collect them from"},
		{"outputs with a shared volume", withPVC, func(r *job.Request) { r.Outputs = []string{"a"} }, ""},
		{"reserved label", Config{}, func(r *job.Request) { r.Labels = map[string]string{"fleet.dev/worker-id": "x"} }, `label "fleet.dev/worker-id" is reserved`},
		{"Job controller label", Config{}, func(r *job.Request) { r.Labels = map[string]string{"batch.kubernetes.io/job-name": "x"} }, "is reserved"},
		{"too much for a Secret", Config{}, func(r *job.Request) { r.Inputs = map[string]string{"big": strings.Repeat("x", 1<<20)} }, "more than a Kubernetes Secret holds"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &Executor{cfg: tc.cfg}
			err := e.Validate(request(tc.req))
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate = %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Validate = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestNewRefusesABadConfig(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*Config)
		want   string
	}{
		{"no namespace", func(c *Config) { c.Namespace = "" }, "namespace"},
		{"bad namespace", func(c *Config) { c.Namespace = "Fleet_NS" }, "namespace"},
		{"no worker", func(c *Config) { c.WorkerID = "" }, "worker id"},
		{"ratio below 1", func(c *Config) { c.CPULimitRatio = 0.5 }, "ratios"},
		{"claim without folder", func(c *Config) { c.SharedPVC = "x" }, "folder"},
		{"root", func(c *Config) { c.RunAsUser = -1 }, "root"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Client: fake.NewClientset(), Namespace: ns, WorkerID: "w"}
			tc.change(&cfg)
			_, err := New(cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New = %v, want an error about %s", err, tc.want)
			}
		})
	}
}

// recorder is a executor.Reporter that remembers what it was told.
type recorder struct {
	mu     sync.Mutex
	phases []string
	lines  []string
}

func (r *recorder) Log(stream, line string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, stream+":"+line)
}

func (r *recorder) Phase(phase, message string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.phases = append(r.phases, phase+" "+message)
}

// phaseList lists the phases reported, without repeats.
func (r *recorder) phaseList() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var s []string
	for _, p := range r.phases {
		p, _, _ = strings.Cut(p, " ")
		if len(s) == 0 || s[len(s)-1] != p {
			s = append(s, p)
		}
	}
	return strings.Join(s, " ")
}

func (r *recorder) logList() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.lines, "\n")
}

// await waits until a phase is reported.
func (r *recorder) await(t *testing.T, phase string) {
	t.Helper()
	if !r.waitFor(phase, 5*time.Second) {
		t.Fatalf("phase %s not reported; got %s", phase, r.phaseList())
	}
}

// waitFor waits until a phase is reported, and says whether it was.
func (r *recorder) waitFor(phase string, timeout time.Duration) bool {
	err := wait.PollUntilContextTimeout(context.Background(), 5*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		return strings.Contains(" "+r.phaseList()+" ", " "+phase+" "), nil
	})
	return err == nil
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}
