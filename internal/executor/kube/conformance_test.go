package kube

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/executor/executortest"
	"github.com/fleet-dev/fleet/internal/kubetest"
	"github.com/fleet-dev/fleet/job"
)

// TestConformance holds the Kubernetes executor to the executors' contract
// on the real control plane of internal/kubetest, whose node is simulated:
// no container runs. How a program ends (its run time, its exit code, an
// OOM kill) becomes the pod annotations that steer kwok, and what it prints
// becomes the pod's log. What it does to files, the test does itself once
// the pod runs, as its container would see them: from the pod and the
// Secret as the API server stored them, through their env, mounts and
// working directory (see play). So the workspace and env behaviours check
// the pod spec that reaches Kubernetes, not a running container.
func TestConformance(t *testing.T) {
	executortest.Run(t, executortest.Backend{
		Name: "kubernetes",
		Lacks: map[executortest.Ability]string{
			executortest.SeparateStderr: "Kubernetes merges a container's stdout and stderr into one log, which the executor reports as stdout",
			executortest.Usage:          "usage comes from the metrics API, which the test control plane does not serve (TestKubeRBACIsExactlyWhatTheWorkerNeeds asks it and finds it not found)",
		},
		Messages: map[string]string{
			"missing_output": "declared outputs not written: [never.txt]",
			"exit_code":      "exited with code 3: simulated exit code 3",
			"timeout":        "ran longer than its timeout of 2s (activeDeadlineSeconds 2); Kubernetes stopped its pod",
			"cancel":         "job cancelled; Job and pod deleted",
			"oom":            "killed for exceeding its memory limit of 24Mi (OOMKilled)", // 1.5 × 16Mi
			"image_missing":  "the image is not on the node, and pull_policy is never: ErrImageNeverPull",
		},
		New: newConformanceInstance,
	})
}

// conformanceNamespace is the namespace of one behaviour, shared by the
// workers it starts, with a shared volume for outputs.
type conformanceNamespace struct {
	c      *cluster
	shared string
}

var conformanceNamespaces sync.Map // *testing.T → *conformanceNamespace

func namespaceOf(t *testing.T) *conformanceNamespace {
	if n, ok := conformanceNamespaces.Load(t); ok {
		return n.(*conformanceNamespace)
	}
	env := kubetest.Start(t)
	n := &conformanceNamespace{c: &cluster{env: env, ns: env.NewNamespace(t)}, shared: t.TempDir()}
	n.c.restrict(t)
	n.c.sharedVolume(t, n.shared)
	// A pod whose claim is not bound yet is unschedulable: wait for it.
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		pvc, err := env.Client.CoreV1().PersistentVolumeClaims(n.c.ns).Get(ctx, "fleet-shared", metav1.GetOptions{})
		return err == nil && pvc.Status.Phase == corev1.ClaimBound, nil
	})
	if err != nil {
		t.Fatalf("the shared volume's claim is not bound: %v", err)
	}
	conformanceNamespaces.Store(t, n)
	t.Cleanup(func() { conformanceNamespaces.Delete(t) })
	return n
}

func newConformanceInstance(t *testing.T, c *executortest.Case) *executortest.Instance {
	n := namespaceOf(t)
	env, ns := n.c.env, n.c.ns
	var lines []string
	for _, l := range c.Program.Lines() {
		lines = append(lines, l.Text)
	}
	env.SetPodLogs(t, ns, lines...)
	logs := &lockedWriter{}
	cfg := Config{Client: env.Client, Namespace: ns, WorkerID: c.WorkerID, PodAnnotations: annotations(c.Program),
		Grace: time.Second, ImagePullWait: 2 * time.Second, PendingWait: 2 * time.Second,
		SharedPVC: "fleet-shared", SharedDir: n.shared,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.Close()
		if t.Failed() {
			t.Logf("the executor of worker %s logged:\n%s", c.WorkerID, logs)
		}
	})
	if len(c.Program.Files()) > 0 {
		playFiles(t, n, c)
	}
	return &executortest.Instance{
		Executor: e,
		Complete: func(r *job.Request) { completeRequest(r, c.Program) },
		Left:     func(t testing.TB) []string { return n.left(t, c.WorkerID) },
		Logs:     logs.String,
		Orphan: func(t *testing.T, r *job.Request) {
			r = r.Clone()
			completeRequest(r, c.Program)
			executortest.StartOrphan(t, orphan{Kubeconfig: env.KubeconfigPath, Namespace: ns, WorkerID: c.WorkerID,
				Annotations: cfg.PodAnnotations, SharedDir: n.shared, Request: r})
		},
	}
}

// completeRequest names an image that kwok starts; the command is never run.
func completeRequest(r *job.Request, prog executortest.Program) {
	r.Image = "registry.example/testprog:1"
	r.Command = append([]string{"/testprog"}, prog.Args()...)
}

// annotations tell kwok how the pod of prog ends. A program that prints or
// writes files runs for at least 2.5 s: kwok picks up the pod's log (its
// ClusterLogs are new), and the test plays the files, while it runs.
func annotations(prog executortest.Program) map[string]string {
	d, code, oom := prog.End()
	if (len(prog.Lines()) > 0 || len(prog.Files()) > 0) && d < 2500*time.Millisecond {
		d = 2500 * time.Millisecond
	}
	a := map[string]string{kubetest.AnnotationDuration: max(d, 200*time.Millisecond).String()}
	switch {
	case oom:
		a[kubetest.AnnotationOOM] = "true"
	case code != 0:
		a[kubetest.AnnotationExitCode] = strconv.Itoa(code)
	}
	return a
}

// left lists what of worker's attempts is left in the namespace: Jobs and
// pods that have not ended (a Job whose pod ended by itself has, though
// its condition may come later), Secrets whose Job is gone, folders on
// the shared volume. Ended Jobs are Cleanup's, after the result.
func (n *conformanceNamespace) left(t testing.TB, worker string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client, ns := n.c.env.Client, n.c.ns
	sel := metav1.ListOptions{LabelSelector: LabelWorkerID + "=" + labelValue(worker)}
	var left []string
	jobs, err := client.BatchV1().Jobs(ns).List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	pods, err := client.CoreV1().Pods(ns).List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	byJob := map[string][]*corev1.Pod{}
	for i := range pods.Items {
		p := &pods.Items[i]
		byJob[p.Labels["job-name"]] = append(byJob[p.Labels["job-name"]], p)
	}
	uids := map[string]bool{}
	for _, j := range jobs.Items {
		uids[string(j.UID)] = true
		// Ended by its condition, or by its pod's end (the condition
		// comes later).
		if judge(&j, newest(byJob[j.Name]), 0) == nil {
			left = append(left, "Job "+j.Name+" (not ended)")
		}
	}
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			left = append(left, fmt.Sprintf("pod %s (%s)", p.Name, p.Status.Phase))
		}
	}
	secrets, err := client.CoreV1().Secrets(ns).List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range secrets.Items {
		if len(s.OwnerReferences) == 0 || !uids[string(s.OwnerReferences[0].UID)] {
			left = append(left, "Secret "+s.Name+" (its Job is gone)")
		}
	}
	entries, _ := os.ReadDir(filepath.Join(n.shared, labelValue(worker)))
	for _, e := range entries {
		left = append(left, "outputs folder "+e.Name())
	}
	return left
}

// playFiles does, for every pod of the case's worker once it runs, what
// the program's file steps would do in its container.
func playFiles(t *testing.T, n *conformanceNamespace, c *executortest.Case) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	work := t.TempDir()
	go func() {
		defer close(done)
		played := map[string]bool{}
		for ctx.Err() == nil {
			pods, err := n.c.env.Client.CoreV1().Pods(n.c.ns).List(ctx, metav1.ListOptions{LabelSelector: LabelWorkerID + "=" + labelValue(c.WorkerID)})
			if err == nil {
				for i := range pods.Items {
					p := &pods.Items[i]
					if played[p.Name] || p.Status.Phase != corev1.PodRunning {
						continue
					}
					played[p.Name] = true
					if err := n.play(ctx, p, c.Program, filepath.Join(work, p.Name)); err != nil && ctx.Err() == nil {
						t.Errorf("play the program in pod %s: %v", p.Name, err)
					}
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
}

// play runs the file steps of prog as the container of pod would: env from
// its values and its Secret, inputs from the Secret volume's items, outputs
// in its sub-path of the shared volume, work in a folder of the test (an
// emptyDir), everything else on the root filesystem, read-only unless the
// container says otherwise.
func (n *conformanceNamespace) play(ctx context.Context, pod *corev1.Pod, prog executortest.Program, work string) error {
	var ctr *corev1.Container
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == ContainerName {
			ctr = &pod.Spec.Containers[i]
		}
	}
	if ctr == nil {
		return fmt.Errorf("no container %s", ContainerName)
	}
	secrets := map[string]*corev1.Secret{}
	secret := func(name string) (*corev1.Secret, error) {
		if s, ok := secrets[name]; ok {
			return s, nil
		}
		s, err := n.c.env.Client.CoreV1().Secrets(n.c.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		secrets[name] = s
		return s, nil
	}
	env := map[string]string{}
	for _, v := range ctr.Env {
		switch ref := v.ValueFrom; {
		case ref == nil:
			env[v.Name] = v.Value
		case ref.SecretKeyRef != nil:
			s, err := secret(ref.SecretKeyRef.Name)
			if err != nil {
				return fmt.Errorf("env %s: %w", v.Name, err)
			}
			env[v.Name] = string(s.Data[ref.SecretKeyRef.Key])
		default:
			return fmt.Errorf("env %s comes from where the test cannot follow", v.Name)
		}
	}
	if err := os.MkdirAll(work, 0o755); err != nil {
		return err
	}
	fs := &podFiles{readOnlyRoot: ctr.SecurityContext != nil && ctr.SecurityContext.ReadOnlyRootFilesystem != nil && *ctr.SecurityContext.ReadOnlyRootFilesystem}
	for _, m := range ctr.VolumeMounts {
		var vol *corev1.Volume
		for i := range pod.Spec.Volumes {
			if pod.Spec.Volumes[i].Name == m.Name {
				vol = &pod.Spec.Volumes[i]
			}
		}
		if vol == nil {
			return fmt.Errorf("mount %s has no volume", m.Name)
		}
		mnt := podMount{path: path.Clean(m.MountPath), readOnly: m.ReadOnly}
		switch {
		case vol.Secret != nil:
			s, err := secret(vol.Secret.SecretName)
			if err != nil {
				return fmt.Errorf("volume %s: %w", vol.Name, err)
			}
			mnt.readOnly = true // Secret volumes are, whatever the mount says
			mnt.files = map[string][]byte{}
			for _, item := range vol.Secret.Items {
				mnt.files[path.Clean(item.Path)] = s.Data[item.Key]
			}
		case vol.PersistentVolumeClaim != nil && vol.PersistentVolumeClaim.ClaimName == "fleet-shared":
			mnt.dir = filepath.Join(n.shared, filepath.FromSlash(m.SubPath))
		case vol.EmptyDir != nil:
			mnt.dir = filepath.Join(work, m.Name)
			if err := os.MkdirAll(mnt.dir, 0o755); err != nil {
				return err
			}
		default:
			return fmt.Errorf("volume %s is of a kind the test cannot play", vol.Name)
		}
		fs.mounts = append(fs.mounts, mnt)
	}
	expand := func(s string) string { return os.Expand(s, func(k string) string { return env[k] }) }
	for _, s := range prog.Files() {
		var err error
		switch s.Verb {
		case executortest.VerbCopy:
			var data []byte
			if data, err = fs.read(expand(s.Args[0])); err == nil {
				err = fs.write(expand(s.Args[1]), data)
			}
		case executortest.VerbWrite:
			err = fs.write(expand(s.Args[0]), []byte(s.Args[1]))
		case executortest.VerbEnvTo:
			v, ok := env[s.Args[0]]
			if !ok {
				v = "<unset>"
			}
			err = fs.write(expand(s.Args[1]), []byte(v))
		case executortest.VerbPwdTo:
			err = fs.write(expand(s.Args[0]), []byte(ctr.WorkingDir))
		case executortest.VerbWritable:
			state := "read-only"
			if fs.writable(expand(s.Args[0])) {
				state = "writable"
			}
			err = fs.write(expand(s.Args[1]), []byte(state))
		}
		if err != nil {
			return fmt.Errorf("%s %q: %w", s.Verb, s.Args, err)
		}
	}
	return nil
}

// podFiles is the file system a container of a pod sees.
type podFiles struct {
	mounts       []podMount
	readOnlyRoot bool
}

// podMount is one mount: a folder of the test's, or files from a Secret.
type podMount struct {
	path     string
	readOnly bool
	dir      string
	files    map[string][]byte
}

var errReadOnly = errors.New("read-only file system")

// find returns the mount p is in, and p within it; nil for the root
// filesystem.
func (f *podFiles) find(p string) (*podMount, string) {
	p = path.Clean(p)
	var best *podMount
	for i := range f.mounts {
		m := &f.mounts[i]
		if (p == m.path || strings.HasPrefix(p, m.path+"/")) && (best == nil || len(m.path) > len(best.path)) {
			best = m
		}
	}
	if best == nil {
		return nil, p
	}
	return best, strings.TrimPrefix(strings.TrimPrefix(p, best.path), "/")
}

func (f *podFiles) read(p string) ([]byte, error) {
	m, rel := f.find(p)
	switch {
	case m == nil:
		return nil, fmt.Errorf("%s: not in any mount of the pod", p)
	case m.files != nil:
		data, ok := m.files[rel]
		if !ok {
			return nil, fmt.Errorf("%s: %w", p, os.ErrNotExist)
		}
		return data, nil
	}
	return os.ReadFile(filepath.Join(m.dir, filepath.FromSlash(rel)))
}

func (f *podFiles) write(p string, data []byte) error {
	m, rel := f.find(p)
	switch {
	case !f.writable(p):
		return fmt.Errorf("%s: %w", p, errReadOnly)
	case m == nil:
		return fmt.Errorf("%s: on the root filesystem, which the test does not keep", p)
	}
	return os.WriteFile(filepath.Join(m.dir, filepath.FromSlash(rel)), data, 0o644)
}

func (f *podFiles) writable(p string) bool {
	m, _ := f.find(p)
	if m == nil {
		return !f.readOnlyRoot
	}
	return !m.readOnly && m.files == nil
}

// orphan is the attempt of a worker that the test kills.
type orphan struct {
	Kubeconfig  string
	Namespace   string
	WorkerID    string
	Annotations map[string]string
	SharedDir   string
	Request     *job.Request
}

// startOrphan is the killed worker's side of executortest.StartOrphan.
func startOrphan(spec []byte) (executor.Executor, *executor.Task, error) {
	var o orphan
	if err := json.Unmarshal(spec, &o); err != nil {
		return nil, nil, err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", o.Kubeconfig)
	if err != nil {
		return nil, nil, err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, err
	}
	e, err := New(Config{Client: client, Namespace: o.Namespace, WorkerID: o.WorkerID, PodAnnotations: o.Annotations,
		SharedPVC: "fleet-shared", SharedDir: o.SharedDir, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, nil, err
	}
	o.Request.Normalize()
	id := o.Request.ID
	if id == "" {
		id = "orphan"
	}
	return e, &executor.Task{JobID: id, Attempt: 1, WorkerID: o.WorkerID, Pool: "conformance", Request: o.Request}, nil
}

type lockedWriter struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedWriter) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
