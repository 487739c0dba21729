package kube

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/kubetest"
	"github.com/fleet-dev/fleet/job"
)

// workerRole reads the Role of deploy/kubernetes/worker-rbac.yaml.
func workerRole(t *testing.T) *rbacv1.Role {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "kubernetes", "worker-rbac.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range bytes.Split(data, []byte("\n---")) {
		var r rbacv1.Role
		if err := yaml.Unmarshal(doc, &r); err == nil && r.Kind == "Role" {
			return &r
		}
	}
	t.Fatal("worker-rbac.yaml has no Role")
	return nil
}

// grant makes a ServiceAccount bound to a Role of rules in ns, and returns
// a client that authenticates as it.
func grant(t *testing.T, env *kubetest.Env, ns, name string, rules []rbacv1.PolicyRule) kubernetes.Interface {
	t.Helper()
	ctx := context.Background()
	if _, err := env.Client.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Client.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: name},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: ns}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(env.ConfigFor(t, ns, name))
	if err != nil {
		t.Fatal(err)
	}
	return client
}

// without returns rules less one verb of one resource.
func without(rules []rbacv1.PolicyRule, group, res, verb string) []rbacv1.PolicyRule {
	var out []rbacv1.PolicyRule
	for _, r := range rules {
		r = *r.DeepCopy()
		if slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, res) {
			r.Verbs = slices.DeleteFunc(r.Verbs, func(v string) bool { return v == verb })
			if len(r.Verbs) == 0 {
				continue
			}
		}
		out = append(out, r)
	}
	return out
}

// rbacCase is one namespace where a worker runs under a set of rules.
type rbacCase struct {
	env    *kubetest.Env
	ns     string
	worker string
	client kubernetes.Interface
	shared string
}

func (c *rbacCase) executor(t *testing.T, worker string) *Executor {
	t.Helper()
	e, err := New(Config{Client: c.client, Namespace: c.ns, WorkerID: worker, Grace: time.Second, SyncTimeout: 5 * time.Second,
		PodAnnotations: map[string]string{kubetest.AnnotationDuration: "1500ms"}, SharedPVC: "fleet-shared", SharedDir: c.shared,
		Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// leftJob makes, as an admin, a Job of worker in the namespace, as an
// earlier life of it would have left: for the calls that find one.
func (c *rbacCase) leftJob(t *testing.T, worker, jobID string) {
	t.Helper()
	cfg := Config{Namespace: c.ns, SharedPVC: "", RunAsUser: 65532, CPULimitRatio: 2, MemoryLimitRatio: 1.5, Grace: time.Second,
		TTLAfterFinished: time.Minute, GPUResource: "nvidia.com/gpu", PodAnnotations: map[string]string{kubetest.AnnotationDuration: "1h"}}
	req := request(nil)
	s := cfg.build(&executor.Task{JobID: jobID, Attempt: 1, WorkerID: worker, Pool: "p", Request: req}, req, jobName(jobID, 1), "", "")
	if _, err := c.env.Client.BatchV1().Jobs(c.ns).Create(context.Background(), s.job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func forbidden(err error) bool {
	return err != nil && (apierrors.IsForbidden(err) || strings.Contains(err.Error(), "forbidden"))
}

// TestKubeRBACIsExactlyWhatTheWorkerNeeds holds the worker's Role to what
// the executor does: under the Role, the worker does all of it, adoption
// included; and for every verb of every rule, the Role without that verb
// makes the call that needs it fail, forbidden. So no rule is there for
// nothing, and none is missing.
func TestKubeRBACIsExactlyWhatTheWorkerNeeds(t *testing.T) {
	env := kubetest.Start(t)
	role := workerRole(t)
	setup := func(t *testing.T, rules []rbacv1.PolicyRule) *rbacCase {
		c := &rbacCase{env: env, ns: env.NewNamespace(t), worker: "worker-rbac", shared: t.TempDir()}
		env.SharedVolume(t, c.ns, "fleet-shared", c.shared)
		env.SetPodLogs(t, c.ns, "logged under RBAC")
		c.client = grant(t, env, c.ns, "fleet-worker", rules)
		return c
	}
	ctx := context.Background()

	t.Run("the_role_does_all_the_worker_does", func(t *testing.T) {
		t.Parallel()
		c := setup(t, role.Rules)
		e := c.executor(t, "worker-1")
		if err := e.Recover(ctx, "worker-1"); err != nil {
			t.Errorf("Recover: %v", err)
		}
		if _, err := e.Capacity(ctx); err != nil {
			t.Errorf("Capacity: %v", err)
		}
		rep := &recorder{}
		tk := &executor.Task{JobID: "rbac-run", Attempt: 1, WorkerID: "worker-1", Pool: "p", Report: rep,
			Request: request(func(r *job.Request) {
				r.Env = map[string]string{"TOKEN": "s3cr3t"}
				r.Persist = &job.Persist{Enabled: true}
			})}
		out, err := e.Run(ctx, tk)
		if err != nil || out.Status != job.StatusSucceeded || out.Stdout != "logged under RBAC\n" {
			t.Fatalf("Run: %v, %v", describeOrNil(out), err)
		}
		if err := e.Cleanup(ctx, tk); err != nil {
			t.Errorf("Cleanup: %v", err)
		}
		// A hand-off, and the adoption of the Job by another worker.
		hctx, cancel := context.WithCancelCause(ctx)
		rep = &recorder{}
		long := &executor.Task{JobID: "rbac-adopt", Attempt: 1, WorkerID: "worker-1", Pool: "p", Report: rep, Request: request(nil)}
		go func() {
			if rep.waitFor("Running", 30*time.Second) {
				cancel(executor.ErrLeaveRunning)
			}
		}()
		if _, err := e.Run(hctx, long); !errors.Is(err, executor.ErrLeftRunning) {
			t.Fatalf("Run on a hand-off: %v", err)
		}
		other := c.executor(t, "worker-2")
		f, err := other.Find(ctx, executor.Query{JobID: "rbac-adopt", Attempt: 1, Owner: "worker-1", Self: "worker-2"})
		if err != nil || f.Standing != executor.Running {
			t.Fatalf("Find: %+v, %v", f, err)
		}
		if err := other.RecoverAdoptable(ctx, "worker-1", func(string, string, int) bool { return true }); err != nil {
			t.Errorf("RecoverAdoptable: %v", err)
		}
		long.WorkerID = "worker-2"
		out, err = other.Adopt(ctx, long, f)
		if err != nil || out.Status != job.StatusSucceeded {
			t.Fatalf("Adopt: %v, %v", describeOrNil(out), err)
		}
		if err := other.Cleanup(ctx, long); err != nil {
			t.Errorf("Cleanup of the adopted attempt: %v", err)
		}
		if err := e.RemoveData(ctx, "", "rbac-run"); err != nil {
			t.Errorf("RemoveData: %v", err)
		}
		// The test control plane serves no metrics API: the worker may ask,
		// and is told it is not there; the attempt's usage is unknown.
		other.running["x"] = &attempt{t: long, req: long.Request}
		if u := other.Usage(ctx); len(u) != 0 {
			t.Errorf("usage %v without a metrics API, want none (unknown)", u)
		}
		if err := other.metricsErr; !apierrors.IsNotFound(err) {
			t.Errorf("the metrics API: %v, want not found (allowed, not served)", err)
		}
		// Nodes are for the optional ClusterRole: without it, no error.
		if inv, err := other.Inventory(ctx); err != nil || len(inv.Nodes) != 0 {
			t.Errorf("Inventory without the nodes' ClusterRole: %+v, %v", inv, err)
		}
	})

	// Each case takes one verb away and shows what then fails.
	cases := map[string]func(t *testing.T, c *rbacCase) error{
		"batch/jobs/create": func(t *testing.T, c *rbacCase) error {
			_, err := c.executor(t, c.worker).Run(ctx, &executor.Task{JobID: "j", Attempt: 1, WorkerID: c.worker, Pool: "p", Request: request(nil)})
			return err
		},
		"batch/jobs/list": func(t *testing.T, c *rbacCase) error {
			_, err := c.executor(t, c.worker).Find(ctx, executor.Query{JobID: "j", Attempt: 1, Owner: "w", Self: c.worker})
			return err
		},
		"batch/jobs/watch": func(t *testing.T, c *rbacCase) error { return watchError(t, c.executor(t, c.worker)) },
		"batch/jobs/delete": func(t *testing.T, c *rbacCase) error {
			c.leftJob(t, c.worker, "left")
			return c.executor(t, c.worker).Recover(ctx, c.worker)
		},
		"/pods/list": func(t *testing.T, c *rbacCase) error {
			c.leftJob(t, "w", "left")
			_, err := c.executor(t, c.worker).Find(ctx, executor.Query{JobID: "left", Attempt: 1, Owner: "w", Self: c.worker})
			return err
		},
		"/pods/watch": func(t *testing.T, c *rbacCase) error { return watchError(t, c.executor(t, c.worker)) },
		"/pods/log/get": func(t *testing.T, c *rbacCase) error {
			out, err := c.executor(t, c.worker).Run(ctx, &executor.Task{JobID: "j", Attempt: 1, WorkerID: c.worker, Pool: "p", Request: request(nil)})
			if err != nil {
				return err
			}
			if out.Stdout == "" {
				return errors.New("forbidden: the log could not be read")
			}
			return nil
		},
		"/secrets/create": func(t *testing.T, c *rbacCase) error {
			_, err := c.executor(t, c.worker).Run(ctx, &executor.Task{JobID: "j", Attempt: 1, WorkerID: c.worker, Pool: "p",
				Request: request(func(r *job.Request) { r.Env = map[string]string{"A": "b"} })})
			return err
		},
		"/secrets/patch": func(t *testing.T, c *rbacCase) error {
			_, err := c.executor(t, c.worker).Run(ctx, &executor.Task{JobID: "j", Attempt: 1, WorkerID: c.worker, Pool: "p",
				Request: request(func(r *job.Request) { r.Env = map[string]string{"A": "b"} })})
			return err
		},
		"/secrets/delete": func(t *testing.T, c *rbacCase) error {
			// A Job the quota refuses: its Secret, made first, must go.
			_, err := c.env.Client.CoreV1().ResourceQuotas(c.ns).Create(ctx, &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "no-jobs"},
				Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{"count/jobs.batch": resource.MustParse("0")}}}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			waitQuota(t, c)
			_, err = c.executor(t, c.worker).Run(ctx, &executor.Task{JobID: "j", Attempt: 1, WorkerID: c.worker, Pool: "p",
				Request: request(func(r *job.Request) { r.Env = map[string]string{"A": "b"} })})
			if err == nil || !strings.Contains(err.Error(), "exceeded quota") {
				t.Fatalf("Run under a quota of no Jobs: %v", err)
			}
			secrets, err := c.env.Client.CoreV1().Secrets(c.ns).List(ctx, metav1.ListOptions{LabelSelector: LabelWorkerID + "=" + c.worker})
			if err != nil {
				t.Fatal(err)
			}
			if len(secrets.Items) > 0 {
				return fmt.Errorf("forbidden: the Secret of a Job that could not be made is left")
			}
			return nil
		},
		"/secrets/deletecollection": func(t *testing.T, c *rbacCase) error { return c.executor(t, c.worker).Recover(ctx, c.worker) },
		"/resourcequotas/list": func(t *testing.T, c *rbacCase) error {
			_, err := c.executor(t, c.worker).Capacity(ctx)
			return err
		},
		"metrics.k8s.io/pods/list": func(t *testing.T, c *rbacCase) error {
			e := c.executor(t, c.worker)
			tk := task(request(nil))
			e.running["x"] = &attempt{t: tk, req: tk.Request}
			e.Usage(ctx)
			if e.metricsErr == nil || apierrors.IsNotFound(e.metricsErr) {
				return nil // allowed: the test control plane does not serve it
			}
			return e.metricsErr
		},
	}
	seen := map[string]bool{}
	for _, r := range role.Rules {
		for _, res := range r.Resources {
			for _, verb := range r.Verbs {
				group := r.APIGroups[0]
				key := group + "/" + res + "/" + verb
				seen[key] = true
				call, ok := cases[key]
				if !ok {
					t.Errorf("the Role grants %s, which no test shows the worker needs", key)
					continue
				}
				t.Run("without_"+strings.NewReplacer("/", "_", ".", "_").Replace(strings.TrimPrefix(key, "/")), func(t *testing.T) {
					t.Parallel()
					full := call(t, setup(t, role.Rules))
					if full != nil {
						t.Fatalf("under the whole Role: %v", full)
					}
					err := call(t, setup(t, without(role.Rules, group, res, verb)))
					if !forbidden(err) {
						t.Errorf("without %s: %v, want it forbidden", key, err)
					} else {
						t.Logf("without %s: %v", key, err)
					}
				})
			}
		}
	}
	for key := range cases {
		if !seen[key] {
			t.Errorf("the worker needs %s, which the Role does not grant", key)
		}
	}
}

// watchError starts the executor's informers and returns the error their
// watch met, if any, within a few seconds.
func watchError(t *testing.T, e *Executor) error {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if err := e.watchErr.Load(); err != nil {
			return *err
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

func waitQuota(t *testing.T, c *rbacCase) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		q, err := c.env.Client.CoreV1().ResourceQuotas(c.ns).Get(context.Background(), "no-jobs", metav1.GetOptions{})
		if err == nil && q.Status.Hard != nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("the quota is not in force")
}

func describeOrNil(out *executor.Outcome) string {
	if out == nil {
		return "no outcome"
	}
	return describe(out)
}
