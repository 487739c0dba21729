package kubetest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// callTimeout bounds each API call a helper makes.
const callTimeout = 30 * time.Second

var invalidName = regexp.MustCompile(`[^a-z0-9-]+`)

// NewNamespace creates a namespace for the test, waits until its default
// ServiceAccount exists (pods cannot be created before), and deletes it when
// the test ends.
func (e *Env) NewNamespace(t testing.TB) string {
	t.Helper()
	prefix := strings.Trim(invalidName.ReplaceAllString(strings.ToLower(t.Name()), "-"), "-")
	if len(prefix) > 40 {
		prefix = strings.TrimRight(prefix[:40], "-")
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	ns, err := e.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: "kt-" + prefix + "-",
			Labels:       map[string]string{"fleet.test/kubetest": "true"},
			Annotations:  map[string]string{"fleet.test/test-name": t.Name()},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("kubetest: create namespace: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		policy := metav1.DeletePropagationBackground
		err := e.Client.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{PropagationPolicy: &policy})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("kubetest: delete namespace %s: %v", ns.Name, err)
		}
	})

	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, callTimeout, true, func(ctx context.Context) (bool, error) {
		_, err := e.Client.CoreV1().ServiceAccounts(ns.Name).Get(ctx, "default", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		t.Fatalf("kubetest: wait for the default service account of %s: %v", ns.Name, err)
	}
	return ns.Name
}

// ConfigFor returns a config that authenticates as the ServiceAccount
// namespace/serviceAccount, creating the account if needed, with a token from
// the TokenRequest API valid for an hour. Bind it to Roles to test RBAC.
func (e *Env) ConfigFor(t testing.TB, namespace, serviceAccount string) *rest.Config {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	accounts := e.Client.CoreV1().ServiceAccounts(namespace)
	_, err := accounts.Create(ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: serviceAccount},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("kubetest: create service account %s/%s: %v", namespace, serviceAccount, err)
	}
	expiry := int64(time.Hour / time.Second)
	token, err := accounts.CreateToken(ctx, serviceAccount, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("kubetest: request a token for %s/%s: %v", namespace, serviceAccount, err)
	}
	cfg := rest.AnonymousClientConfig(e.AdminConfig)
	cfg.BearerToken = token.Status.Token
	return cfg
}

// WaitForJobCondition waits until the Job has condition cond with status True
// and returns it. It fails the test at the timeout, or at once if the Job ends
// with the other terminal condition, reporting the Job's and its pods' state.
func (e *Env) WaitForJobCondition(t testing.TB, namespace, name string, cond batchv1.JobConditionType, timeout time.Duration) *batchv1.Job {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var job *batchv1.Job
	var wrongEnd *batchv1.JobCondition
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		var err error
		job, err = e.Client.BatchV1().Jobs(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for i, c := range job.Status.Conditions {
			if c.Status != corev1.ConditionTrue {
				continue
			}
			if c.Type == cond {
				return true, nil
			}
			if c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed {
				wrongEnd = &job.Status.Conditions[i]
				return true, nil
			}
		}
		return false, nil
	})
	switch {
	case err != nil:
		t.Fatalf("kubetest: job %s/%s has no condition %s after %s: %v\n%s", namespace, name, cond, timeout, err, e.describeJob(namespace, name, job))
	case wrongEnd != nil:
		t.Fatalf("kubetest: job %s/%s ended %s (%s: %s) instead of %s\n%s", namespace, name, wrongEnd.Type, wrongEnd.Reason, wrongEnd.Message, cond, e.describeJob(namespace, name, job))
	}
	return job
}

// describeJob summarises a Job and its pods for failure messages.
func (e *Env) describeJob(namespace, name string, job *batchv1.Job) string {
	var b strings.Builder
	if job != nil {
		fmt.Fprintf(&b, "job status: active=%d succeeded=%d failed=%d\n", job.Status.Active, job.Status.Succeeded, job.Status.Failed)
		for _, c := range job.Status.Conditions {
			fmt.Fprintf(&b, "  condition %s=%s reason=%s message=%q\n", c.Type, c.Status, c.Reason, c.Message)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	pods, err := e.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "job-name=" + name})
	if err != nil {
		fmt.Fprintf(&b, "list pods: %v\n", err)
		return b.String()
	}
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "pod %s: phase=%s node=%q deleting=%t\n", p.Name, p.Status.Phase, p.Spec.NodeName, p.DeletionTimestamp != nil)
		for _, s := range p.Status.ContainerStatuses {
			fmt.Fprintf(&b, "  container %s: %+v\n", s.Name, s.State)
		}
	}
	return b.String()
}

var clusterLogsResource = schema.GroupVersionResource{Group: "kwok.x-k8s.io", Version: "v1alpha1", Resource: "clusterlogs"}

// SetPodLogs makes every container of every pod in namespace log lines on
// stdout, as GetLogs (and kubectl logs) will return them. Calling it again
// replaces the lines; calling it with no lines gives empty logs. Without it,
// GetLogs fails with "no logs found for container". kwok picks the setting up
// asynchronously, so set it before the pods start, or poll GetLogs.
func (e *Env) SetPodLogs(t testing.TB, namespace string, lines ...string) {
	t.Helper()
	path := filepath.Join(e.podLogDir, namespace+".log")
	var b strings.Builder
	ts := time.Now().UTC()
	for i, line := range lines {
		// CRI log format: timestamp, stream, "F" for a full line, the line.
		fmt.Fprintf(&b, "%s stdout F %s\n", ts.Add(time.Duration(i)*time.Microsecond).Format(time.RFC3339Nano), line)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
		t.Fatalf("kubetest: write pod log: %v", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatalf("kubetest: write pod log: %v", err)
	}

	client, err := dynamic.NewForConfig(e.AdminConfig)
	if err != nil {
		t.Fatalf("kubetest: dynamic client: %v", err)
	}
	name := "kubetest-" + namespace
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kwok.x-k8s.io/v1alpha1",
		"kind":       "ClusterLogs",
		"metadata":   map[string]any{"name": name},
		"spec": map[string]any{
			"selector": map[string]any{"matchNamespaces": []any{namespace}},
			"logs":     []any{map[string]any{"logsFile": path}},
		},
	}}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	_, err = client.Resource(clusterLogsResource).Create(ctx, obj, metav1.CreateOptions{})
	switch {
	case apierrors.IsAlreadyExists(err):
		return // same file, new content
	case err != nil:
		t.Fatalf("kubetest: create ClusterLogs %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		err := client.Resource(clusterLogsResource).Delete(ctx, name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("kubetest: delete ClusterLogs %s: %v", name, err)
		}
		_ = os.Remove(path)
	})
}

// SharedVolume makes a ReadWriteMany claim named claim in namespace, bound
// to a hostPath volume at dir (pods run nothing, so the test and the
// workers in this process use dir as the volume), and waits until it is
// bound.
func (e *Env) SharedVolume(t testing.TB, namespace, claim, dir string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	rwx := []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}
	size := corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}
	pv, err := e.Client.CoreV1().PersistentVolumes().Create(ctx, &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: namespace + "-" + claim},
		Spec: corev1.PersistentVolumeSpec{
			AccessModes: rwx, Capacity: size, StorageClassName: "manual",
			PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir}},
			ClaimRef:               &corev1.ObjectReference{Namespace: namespace, Name: claim},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("kubetest: create volume: %v", err)
	}
	t.Cleanup(func() {
		_ = e.Client.CoreV1().PersistentVolumes().Delete(context.Background(), pv.Name, metav1.DeleteOptions{})
	})
	manual := "manual"
	_, err = e.Client.CoreV1().PersistentVolumeClaims(namespace).Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: claim},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: rwx, StorageClassName: &manual,
			Resources: corev1.VolumeResourceRequirements{Requests: size}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("kubetest: create claim: %v", err)
	}
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, callTimeout, true, func(ctx context.Context) (bool, error) {
		c, err := e.Client.CoreV1().PersistentVolumeClaims(namespace).Get(ctx, claim, metav1.GetOptions{})
		return err == nil && c.Status.Phase == corev1.ClaimBound, nil
	})
	if err != nil {
		t.Fatalf("kubetest: claim %s/%s is not bound: %v", namespace, claim, err)
	}
}

// KubeconfigFor writes a kubeconfig file that authenticates as the
// ServiceAccount namespace/serviceAccount (see ConfigFor), for a process
// the test starts, and returns its path.
func (e *Env) KubeconfigFor(t testing.TB, namespace, serviceAccount string) string {
	t.Helper()
	cfg := e.ConfigFor(t, namespace, serviceAccount)
	kc := clientcmdapi.NewConfig()
	kc.Clusters["kubetest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	if len(cfg.CAData) == 0 && cfg.CAFile != "" {
		kc.Clusters["kubetest"].CertificateAuthority = cfg.CAFile
	}
	kc.AuthInfos[serviceAccount] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts["kubetest"] = &clientcmdapi.Context{Cluster: "kubetest", AuthInfo: serviceAccount, Namespace: namespace}
	kc.CurrentContext = "kubetest"
	path := filepath.Join(t.TempDir(), serviceAccount+".kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatalf("kubetest: write kubeconfig: %v", err)
	}
	return path
}

// Apply applies a manifest file with kubectl, into namespace when it is
// not empty.
func (e *Env) Apply(t testing.TB, namespace, file string) {
	t.Helper()
	args := []string{"--kubeconfig", e.KubeconfigPath, "apply", "-f", file}
	if namespace != "" {
		args = append(args, "-n", namespace)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, e.Kubectl, args...).CombinedOutput(); err != nil {
		t.Fatalf("kubetest: kubectl apply %s: %v\n%s", file, err, out)
	}
}

// Restrict makes the API server refuse, in namespace, pods that do not
// meet the "restricted" Pod Security Standard.
func (e *Env) Restrict(t testing.TB, namespace string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	n, err := e.Client.CoreV1().Namespaces().Get(ctx, namespace, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	n.Labels["pod-security.kubernetes.io/enforce"] = "restricted"
	if _, err := e.Client.CoreV1().Namespaces().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("kubetest: restrict namespace %s: %v", namespace, err)
	}
}
