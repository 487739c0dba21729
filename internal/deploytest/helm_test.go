package deploytest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/fleet-dev/fleet/internal/kubetest"
)

const chartDir = "deploy/helm/fleet"

// valueSets are the values the chart is linted, rendered and dry-run with:
// the defaults, every option on, and the branches that exclude those.
var valueSets = []struct {
	name  string
	files []string
}{
	{"default", nil},
	{"all-on", []string{"ci/all-on-values.yaml"}},
	{"hpa", []string{"ci/hpa-values.yaml"}},
	{"cluster", []string{"values-cluster.yaml"}},
	{"flags", []string{"ci/flags-values.yaml"}},
}

func valueArgs(files []string) []string {
	var args []string
	for _, f := range files {
		args = append(args, "-f", filepath.Join(chartDir, f))
	}
	return args
}

func TestChartLints(t *testing.T) {
	h, root := helm(t), repoRoot(t)
	env := toolEnv(t)
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			out := run(t, root, env, nil, append([]string{h, "lint", "--strict", chartDir}, valueArgs(vs.files)...)...)
			if !strings.Contains(out, "0 chart(s) failed") {
				t.Errorf("helm lint:\n%s", out)
			}
		})
	}
}

// render runs helm template as release "fleet" in namespace and decodes the
// manifests.
func render(t testing.TB, namespace string, args ...string) []*unstructured.Unstructured {
	t.Helper()
	out := run(t, repoRoot(t), toolEnv(t), nil,
		append([]string{helm(t), "template", "fleet", chartDir, "--namespace", namespace}, args...)...)
	objs, err := decodeManifests([]byte(out))
	if err != nil {
		t.Fatalf("decode the rendered manifests: %v\n%s", err, out)
	}
	return objs
}

func decodeManifests(data []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, err
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
}

func find(objs []*unstructured.Unstructured, kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

func convert[T any](t testing.TB, o *unstructured.Unstructured) *T {
	t.Helper()
	v := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, v, true); err != nil {
		t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
	}
	return v
}

// workload is a Deployment's or a DaemonSet's pod template.
type workload struct {
	kind, name string
	pod        corev1.PodTemplateSpec
}

func workloads(t testing.TB, objs []*unstructured.Unstructured) []workload {
	var out []workload
	for _, o := range find(objs, "Deployment") {
		d := convert[appsv1.Deployment](t, o)
		out = append(out, workload{"Deployment", d.Name, d.Spec.Template})
	}
	for _, o := range find(objs, "DaemonSet") {
		d := convert[appsv1.DaemonSet](t, o)
		out = append(out, workload{"DaemonSet", d.Name, d.Spec.Template})
	}
	return out
}

func envOf(c corev1.Container) map[string]corev1.EnvVar {
	m := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		m[e.Name] = e
	}
	return m
}

// TestChartRenders checks what every rendering must hold: hardened,
// probed, bounded pods whose writable paths are volumes.
func TestChartRenders(t *testing.T) {
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			objs := render(t, "fleet", valueArgs(vs.files)...)
			ws := workloads(t, objs)
			if len(ws) < 2 {
				t.Fatalf("want the dispatcher's and the worker's workloads, got %d", len(ws))
			}
			for _, w := range ws {
				checkPod(t, w)
			}
			pdbs := find(objs, "PodDisruptionBudget")
			for _, o := range find(objs, "Deployment") {
				if vs.name == "default" && !slices.ContainsFunc(pdbs, func(p *unstructured.Unstructured) bool { return p.GetName() == o.GetName() }) {
					t.Errorf("Deployment %s has no PodDisruptionBudget", o.GetName())
				}
			}
		})
	}
}

func checkPod(t *testing.T, w workload) {
	t.Helper()
	spec := w.pod.Spec
	what := w.kind + " " + w.name
	docker := w.kind == "DaemonSet"
	psc := spec.SecurityContext
	if psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("%s: pod seccomp profile is not RuntimeDefault", what)
	}
	if !docker && (psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0) {
		t.Errorf("%s: pod does not run as a non-root user: %+v", what, psc)
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
	}
	for _, c := range spec.Containers {
		what := what + " container " + c.Name
		sc := c.SecurityContext
		switch {
		case sc == nil:
			t.Errorf("%s: no securityContext", what)
			continue
		case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
			t.Errorf("%s: root filesystem is writable", what)
		case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
			t.Errorf("%s: privilege escalation allowed", what)
		case sc.Privileged != nil && *sc.Privileged:
			t.Errorf("%s: privileged", what)
		case sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL"):
			t.Errorf("%s: capabilities not dropped", what)
		case !docker && len(sc.Capabilities.Add) > 0:
			t.Errorf("%s: adds capabilities %v", what, sc.Capabilities.Add)
		}
		if c.LivenessProbe == nil || c.ReadinessProbe == nil {
			t.Errorf("%s: missing liveness or readiness probe", what)
		}
		if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
			t.Errorf("%s: resources want CPU and memory requests and a memory limit: %+v", what, c.Resources)
		}
		for _, m := range c.VolumeMounts {
			v, ok := volumes[m.Name]
			if !ok {
				t.Errorf("%s: mount %s names no volume", what, m.Name)
				continue
			}
			if m.MountPath == "/tmp" && v.EmptyDir == nil {
				t.Errorf("%s: /tmp is not an emptyDir", what)
			}
		}
		env := envOf(c)
		switch c.Name {
		case "worker":
			if e := env["FLEET_METRICS_ADDR"]; !strings.HasPrefix(e.Value, "0.0.0.0:") {
				t.Errorf("%s: FLEET_METRICS_ADDR %q: the probes need the metrics server on the pod's address", what, e.Value)
			}
			if e := env["FLEET_ID"]; !docker && (e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.name") {
				t.Errorf("%s: FLEET_ID is not the pod's name: %+v", what, e)
			}
		case "dispatcher":
			if e := env["FLEET_HTTP_ADDR"]; !strings.HasPrefix(e.Value, "0.0.0.0:") {
				t.Errorf("%s: FLEET_HTTP_ADDR %q", what, e.Value)
			}
			_, tokens := env["FLEET_API_TOKEN_FILE"]
			_, ca := env["FLEET_TLS_CLIENT_CA"]
			_, insecure := env["FLEET_INSECURE_HTTP"]
			if !tokens && !ca && !insecure {
				t.Errorf("%s: the API has neither tokens nor client certificates, and is not marked insecure", what)
			}
		}
	}
}

// TestChartOptions checks what the options render to.
func TestChartOptions(t *testing.T) {
	t.Run("default", func(t *testing.T) {
		objs := render(t, "jobs")
		for _, kind := range []string{"ScaledObject", "HorizontalPodAutoscaler", "DaemonSet", "PersistentVolumeClaim"} {
			if n := len(find(objs, kind)); n != 0 {
				t.Errorf("%d %s by default, want none", n, kind)
			}
		}
		for _, w := range workloads(t, objs) {
			if w.name != "fleet-worker" {
				continue
			}
			c := w.pod.Spec.Containers[0]
			if ns := envOf(c)["FLEET_NAMESPACE"].Value; ns != "jobs" {
				t.Errorf("worker FLEET_NAMESPACE %q, want the release namespace", ns)
			}
			if !slices.Contains(c.Command, "worker") || envOf(c)["FLEET_EXECUTOR"].Value != "kubernetes" {
				t.Errorf("worker runs %v with executor %q", c.Command, envOf(c)["FLEET_EXECUTOR"].Value)
			}
		}
	})
	t.Run("all-on", func(t *testing.T) {
		objs := render(t, "fleet", valueArgs(valueSets[1].files)...)
		so := find(objs, "ScaledObject")
		if len(so) != 1 {
			t.Fatalf("%d ScaledObjects, want 1", len(so))
		}
		triggers, _, _ := unstructured.NestedSlice(so[0].Object, "spec", "triggers")
		if len(triggers) != 1 {
			t.Fatalf("triggers: %v", triggers)
		}
		trig := triggers[0].(map[string]any)
		meta := trig["metadata"].(map[string]any)
		// subjectPrefix acme-fleet and pool gpu-a100, as internal/queue names them.
		if trig["type"] != "nats-jetstream" || meta["stream"] != "ACME_FLEET_POOL_gpu-a100" || meta["consumer"] != "q3-default" {
			t.Errorf("trigger %v", trig)
		}
		if target, _, _ := unstructured.NestedString(so[0].Object, "spec", "scaleTargetRef", "name"); target != "fleet-all-worker" {
			t.Errorf("ScaledObject scales %q", target)
		}
		for _, o := range find(objs, "Deployment") {
			if _, has, _ := unstructured.NestedFieldNoCopy(o.Object, "spec", "replicas"); has && o.GetName() == "fleet-all-worker" {
				t.Errorf("the autoscaled worker Deployment sets replicas, which every upgrade would reset")
			}
		}
		var ds *workload
		for _, w := range workloads(t, objs) {
			if w.kind == "DaemonSet" {
				ds = &w
			}
			if w.name == "fleet-all-worker" {
				env := envOf(w.pod.Spec.Containers[0])
				if env["FLEET_SHARED_PVC"].Value != "fleet-all-worker-shared" || env["FLEET_SHARED_DIR"].Value == "" {
					t.Errorf("shared PVC env: %v %v", env["FLEET_SHARED_PVC"], env["FLEET_SHARED_DIR"])
				}
			}
		}
		if ds == nil {
			t.Fatal("no docker worker DaemonSet")
		}
		checkDockerWorker(t, ds.pod.Spec)
	})
	t.Run("hpa", func(t *testing.T) {
		objs := render(t, "fleet", valueArgs(valueSets[2].files)...)
		if n := len(find(objs, "HorizontalPodAutoscaler")); n != 1 {
			t.Errorf("%d HorizontalPodAutoscalers, want 1", n)
		}
		for _, kind := range []string{"Role", "RoleBinding"} {
			for _, o := range find(objs, kind) {
				if o.GetNamespace() != "fleet-jobs" {
					t.Errorf("%s %s in %q, want the Jobs' namespace", kind, o.GetName(), o.GetNamespace())
				}
			}
		}
		rb := convert[rbacv1.RoleBinding](t, find(objs, "RoleBinding")[0])
		if s := rb.Subjects[0]; s.Namespace != "fleet" || s.Name != "fleet-worker" {
			t.Errorf("RoleBinding subject %+v, want the worker's ServiceAccount in the release namespace", s)
		}
	})
}

// TestChartRedisModes: each Redis mode becomes the URL every component
// reads, with the passwords and TLS files mounted where their flags point.
func TestChartRedisModes(t *testing.T) {
	// redisEnv returns the Redis environment of every fleet container, and
	// the paths its pods mount secrets at.
	redisEnv := func(t *testing.T, objs []*unstructured.Unstructured) []map[string]corev1.EnvVar {
		t.Helper()
		var out []map[string]corev1.EnvVar
		for _, w := range workloads(t, objs) {
			c := w.pod.Spec.Containers[0]
			env := map[string]corev1.EnvVar{}
			for k, v := range envOf(c) {
				if strings.HasPrefix(k, "FLEET_REDIS_") {
					env[k] = v
				}
			}
			mounts := map[string]bool{}
			for _, m := range c.VolumeMounts {
				mounts[m.MountPath] = true
			}
			for k, v := range env {
				if dir := filepath.Dir(v.Value); strings.HasPrefix(v.Value, "/etc/fleet/") && !mounts[dir] {
					t.Errorf("%s: %s=%s, but nothing is mounted at %s", w.name, k, v.Value, dir)
				}
			}
			out = append(out, env)
		}
		if len(out) == 0 {
			t.Fatal("no fleet container")
		}
		return out
	}
	t.Run("sentinel", func(t *testing.T) {
		objs := render(t, "fleet", valueArgs(valueSets[1].files)...)
		for _, env := range redisEnv(t, objs) {
			want := map[string]string{
				"FLEET_REDIS_URL":                    "rediss+sentinel://redis-sentinel-0.redis:26379,redis-sentinel-1.redis:26379,redis-sentinel-2.redis:26379/fleet/1",
				"FLEET_REDIS_PASSWORD_FILE":          "/etc/fleet/redis-auth/password",
				"FLEET_REDIS_SENTINEL_PASSWORD_FILE": "/etc/fleet/redis-auth/sentinel-password",
				"FLEET_REDIS_CA":                     "/etc/fleet/redis-tls/ca.crt",
				"FLEET_REDIS_CERT":                   "/etc/fleet/redis-tls/tls.crt",
				"FLEET_REDIS_KEY":                    "/etc/fleet/redis-tls/tls.key",
			}
			for k, v := range want {
				if env[k].Value != v {
					t.Errorf("%s=%q, want %q", k, env[k].Value, v)
				}
			}
		}
	})
	t.Run("cluster", func(t *testing.T) {
		objs := render(t, "fleet", "--set", "redis.mode=cluster", "--set", "redis.cluster.addresses={redis-0:6379,redis-1:6379}",
			"--set", "redis.auth.existingSecret=fleet-redis-auth")
		for _, env := range redisEnv(t, objs) {
			if env["FLEET_REDIS_URL"].Value != "redis+cluster://redis-0:6379,redis-1:6379" ||
				env["FLEET_REDIS_PASSWORD_FILE"].Value != "/etc/fleet/redis-auth/password" || env["FLEET_REDIS_SENTINEL_PASSWORD_FILE"].Value != "" {
				t.Errorf("cluster mode: %v", env)
			}
		}
	})
	t.Run("url from a secret", func(t *testing.T) {
		objs := render(t, "fleet", "--set", "redis.existingSecret=fleet-redis")
		for _, env := range redisEnv(t, objs) {
			ref := env["FLEET_REDIS_URL"].ValueFrom
			if ref == nil || ref.SecretKeyRef == nil || ref.SecretKeyRef.Name != "fleet-redis" || ref.SecretKeyRef.Key != "url" || len(env) != 1 {
				t.Errorf("url mode from a Secret: %v", env)
			}
		}
	})
}

// checkDockerWorker: the socket, and the workspaces at the same path as on
// the node.
func checkDockerWorker(t *testing.T, spec corev1.PodSpec) {
	t.Helper()
	c := spec.Containers[0]
	env := envOf(c)
	if env["FLEET_EXECUTOR"].Value != "docker" {
		t.Errorf("docker worker executor %q", env["FLEET_EXECUTOR"].Value)
	}
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	var socket, data bool
	for _, v := range spec.Volumes {
		if v.HostPath == nil {
			continue
		}
		switch {
		case v.HostPath.Type != nil && *v.HostPath.Type == corev1.HostPathSocket:
			socket = mounts[v.Name] == v.HostPath.Path && env["FLEET_DOCKER_HOST"].Value == "unix://"+v.HostPath.Path
		case mounts[v.Name] == env["FLEET_DATA_DIR"].Value:
			data = v.HostPath.Path == mounts[v.Name]
		}
	}
	if !socket || !data {
		t.Errorf("docker worker: socket mounted and named %t, data folder at the node's path %t\n%+v\n%+v", socket, data, spec.Volumes, c.VolumeMounts)
	}
}

// TestChartRejectsBadValues: values.schema.json and the templates refuse
// what cannot work.
func TestChartRejectsBadValues(t *testing.T) {
	h, root, env := helm(t), repoRoot(t), toolEnv(t)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown key", []string{"--set", "worker.slotz=3"}, "slotz"},
		{"zero slots", []string{"--set", "worker.slots=0"}, "slots"},
		{"admission", []string{"--set", "dispatcher.admission=maybe"}, "admission"},
		{"duration", []string{"--set", "worker.grace=ten"}, "grace"},
		{"pool name", []string{"--set", "worker.pool=a.b"}, "pool"},
		{"open API", []string{"--set", "dispatcher.api.tokens.create=false"}, "needs tokens"},
		{"keda and hpa", []string{"--set", "worker.autoscaling.keda.enabled=true,worker.autoscaling.keda.natsMonitoringEndpoint=nats:8222,worker.autoscaling.hpa.enabled=true"}, "not both"},
		{"keda endpoint", []string{"--set", "worker.autoscaling.keda.enabled=true"}, "natsMonitoringEndpoint"},
		{"scale from zero", []string{"--set", "worker.autoscaling.keda.enabled=true,worker.autoscaling.keda.natsMonitoringEndpoint=nats:8222,worker.autoscaling.keda.minReplicas=0"}, "admission=queue"},
		{"shared PVC elsewhere", []string{"--set", "worker.sharedPVC.enabled=true,worker.jobNamespace=other"}, "sharedPVC"},
		{"redis mode", []string{"--set", "redis.mode=ring"}, "redis/mode"},
		{"redis url scheme", []string{"--set", "redis.url=http://redis:6379"}, "redis/url"},
		{"sentinel without master", []string{"--set", "redis.mode=sentinel,redis.sentinel.addresses={s:26379}"}, "redis.sentinel.masterName"},
		{"sentinel without addresses", []string{"--set", "redis.mode=sentinel,redis.sentinel.masterName=m"}, "redis.sentinel.addresses"},
		{"cluster without addresses", []string{"--set", "redis.mode=cluster"}, "redis.cluster.addresses"},
		{"address with a comma", []string{"--set", `redis.mode=cluster,redis.cluster.addresses={a:1\,b:2}`}, "addresses"},
		{"two pod templates", []string{"--set", "worker.podTemplate.existingConfigMap=pods,worker.podTemplate.inline.spec.nodeSelector.a=b"}, "not both"},
		{"host network", []string{"--set", "dockerWorker.dockerNetwork=host"}, "dockerNetwork"},
		{"label value with a comma", []string{"--set", `worker.labels.team=a\,b`}, "labels"},
		{"byte limit", []string{"--set", "worker.maxLogBytes=-1"}, "maxLogBytes"},
		{"adopt wait", []string{"--set", "dockerWorker.adoptWait=soon"}, "adoptWait"},
		{"trace URL", []string{"--set", "dispatcher.console.traceURL=jaeger"}, "traceURL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, err := tryRun(root, env, nil, append([]string{h, "template", "fleet", chartDir}, tc.args...)...)
			if err == nil {
				t.Fatalf("helm template %v succeeded", tc.args)
			}
			if !strings.Contains(stderr, tc.want) {
				t.Errorf("helm template %v: the error does not mention %q:\n%s", tc.args, tc.want, stderr)
			}
		})
	}
}

// TestChartWorkerRBACMatchesManifest: the worker's Role in the chart holds
// exactly the rules of deploy/kubernetes/worker-rbac.yaml, which the
// Kubernetes executor's end-to-end tests apply, and for release "fleet" the
// chart and the file name the same ServiceAccount, Role and RoleBinding.
func TestChartWorkerRBACMatchesManifest(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "kubernetes", "worker-rbac.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	file, err := decodeManifests(data)
	if err != nil {
		t.Fatal(err)
	}
	fileRoles := find(file, "Role")
	if len(fileRoles) != 1 {
		t.Fatalf("worker-rbac.yaml has %d Roles", len(fileRoles))
	}
	want := convert[rbacv1.Role](t, fileRoles[0])

	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			objs := render(t, "fleet", valueArgs(vs.files)...)
			roles := find(objs, "Role")
			if len(roles) != 1 {
				t.Fatalf("the chart renders %d Roles, want the worker's", len(roles))
			}
			got := convert[rbacv1.Role](t, roles[0])
			if !reflect.DeepEqual(got.Rules, want.Rules) {
				t.Errorf("the chart's worker Role and deploy/kubernetes/worker-rbac.yaml differ; keep them the same.\nchart: %s\nfile:  %s",
					rulesString(got.Rules), rulesString(want.Rules))
			}
			rb := convert[rbacv1.RoleBinding](t, find(objs, "RoleBinding")[0])
			if rb.RoleRef.Kind != "Role" || rb.RoleRef.Name != got.Name {
				t.Errorf("RoleBinding refers to %s %s, want Role %s", rb.RoleRef.Kind, rb.RoleRef.Name, got.Name)
			}
			var sa string
			for _, w := range workloads(t, objs) {
				if w.pod.Spec.Containers[0].Name == "worker" && w.kind == "Deployment" {
					sa = w.pod.Spec.ServiceAccountName
				}
			}
			if len(rb.Subjects) != 1 || rb.Subjects[0].Kind != "ServiceAccount" || rb.Subjects[0].Name != sa {
				t.Errorf("RoleBinding subjects %+v, want the worker Deployment's ServiceAccount %q", rb.Subjects, sa)
			}
			if vs.name != "default" {
				return
			}
			for _, kind := range []string{"ServiceAccount", "Role", "RoleBinding"} {
				var chartNames []string
				for _, o := range find(objs, kind) {
					chartNames = append(chartNames, o.GetName())
				}
				fileObjs := find(file, kind)
				if len(fileObjs) != 1 || !slices.Contains(chartNames, fileObjs[0].GetName()) {
					t.Errorf("%s: the chart (release fleet) names %v, worker-rbac.yaml %v", kind, chartNames, names(fileObjs))
				}
			}
		})
	}
}

func names(objs []*unstructured.Unstructured) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.GetName())
	}
	return out
}

func rulesString(rules []rbacv1.PolicyRule) string {
	var b strings.Builder
	for _, r := range rules {
		fmt.Fprintf(&b, "\n  groups=%q resources=%q names=%q verbs=%q", r.APIGroups, r.Resources, r.ResourceNames, r.Verbs)
	}
	return b.String()
}

// scaledObjectCRD is just enough of a CustomResourceDefinition for the API
// server to accept ScaledObjects, so that the rendered one can be dry-run. It
// validates nothing inside them; KEDA's own CRD does.
const scaledObjectCRD = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: scaledobjects.keda.sh
  labels:
    fleet.test/deploytest: "true"
spec:
  group: keda.sh
  scope: Namespaced
  names:
    kind: ScaledObject
    listKind: ScaledObjectList
    plural: scaledobjects
    singular: scaledobject
  versions:
    - name: v1alpha1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              required: [scaleTargetRef, triggers]
              x-kubernetes-preserve-unknown-fields: true
            status:
              type: object
              x-kubernetes-preserve-unknown-fields: true
`

// TestChartServerDryRun sends every rendering to the real API server of
// internal/kubetest with kubectl apply --dry-run=server: admission,
// validation and defaulting run, nothing is stored.
// TestChartClusterValues: values-cluster.yaml gives every process the whole
// seed list, the dispatcher three stream replicas, and two dispatchers.
func TestChartClusterValues(t *testing.T) {
	objs := render(t, "fleet", valueArgs([]string{"values-cluster.yaml"})...)
	seeds := 0
	for _, w := range workloads(t, objs) {
		for _, c := range w.pod.Spec.Containers {
			url := envOf(c)["FLEET_NATS_URL"].Value
			if n := len(strings.Split(url, ",")); n < 3 {
				t.Errorf("%s: FLEET_NATS_URL %q has %d servers, want 3", w.name, url, n)
			}
			seeds++
		}
	}
	if seeds < 2 {
		t.Fatalf("checked %d containers", seeds)
	}
	var found bool
	for _, o := range find(objs, "Deployment") {
		d := convert[appsv1.Deployment](t, o)
		if d.Spec.Template.Spec.Containers[0].Name != "dispatcher" {
			continue
		}
		found = true
		if d.Spec.Replicas == nil || *d.Spec.Replicas < 2 {
			t.Errorf("dispatcher replicas %v, want 2 or more", d.Spec.Replicas)
		}
		if got := envOf(d.Spec.Template.Spec.Containers[0])["FLEET_REPLICAS"].Value; got != "3" {
			t.Errorf("dispatcher FLEET_REPLICAS %q, want 3", got)
		}
	}
	if !found {
		t.Fatal("no dispatcher Deployment")
	}
}

func TestChartServerDryRun(t *testing.T) {
	h := helm(t)
	env := kubetest.Start(t)
	cache := t.TempDir() // not ~/.kube/cache
	kubectl := func(stdin []byte, args ...string) string {
		return run(t, repoRoot(t), toolEnv(t), stdin,
			append([]string{env.Kubectl, "--kubeconfig", env.KubeconfigPath, "--cache-dir", cache}, args...)...)
	}
	kubectl([]byte(scaledObjectCRD), "apply", "-f", "-")
	kubectl(nil, "wait", "--for=condition=Established", "--timeout=60s", "crd/scaledobjects.keda.sh")
	// The CRD is cluster-wide; the control plane belongs to this test binary.

	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			ns := env.NewNamespace(t)
			args := append([]string{h, "template", "fleet", chartDir, "--namespace", ns}, valueArgs(vs.files)...)
			if vs.name == "hpa" {
				jobs := env.NewNamespace(t)
				args = append(args, "--set", "worker.jobNamespace="+jobs)
			}
			manifests := run(t, repoRoot(t), toolEnv(t), nil, args...)
			objs, err := decodeManifests([]byte(manifests))
			if err != nil {
				t.Fatal(err)
			}
			out := kubectl([]byte(manifests), "apply", "--dry-run=server", "-f", "-")
			if got := strings.Count(out, "(server dry run)"); got != len(objs) {
				t.Errorf("the server took %d of %d objects:\n%s", got, len(objs), out)
			}
		})
	}
}

// TestChartSecretNamesStayNames: names of existing Secrets that YAML would
// read as something else (n, on, 0123) reach the pods as those names.
func TestChartSecretNamesStayNames(t *testing.T) {
	objs := render(t, "fleet",
		"--set-string", "nats.tls.existingSecret=n",
		"--set-string", "dispatcher.api.tls.existingSecret=on",
		"--set-string", "dispatcher.api.tokens.existingSecret=0123",
		"--set", "dockerWorker.enabled=true")
	want := map[string]bool{"n": false, "on": false, "0123": false}
	for _, w := range workloads(t, objs) {
		for _, v := range w.pod.Spec.Volumes {
			if v.Secret != nil {
				if _, ok := want[v.Secret.SecretName]; ok {
					want[v.Secret.SecretName] = true
				}
			}
		}
	}
	for name, found := range want {
		if !found {
			t.Errorf("no pod mounts Secret %q", name)
		}
	}
}
