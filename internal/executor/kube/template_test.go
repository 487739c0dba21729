package kube

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/fleet-dev/fleet/job"
)

func loadTemplate(t *testing.T, yaml string) (*corev1.PodTemplateSpec, error) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "template.yaml")
	if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return LoadPodTemplate(p)
}

// TestPodTemplateMerge: the template's placement and identity fields reach
// the Job; the fleet's own fields win; its security settings stay unless
// the template sets them.
func TestPodTemplateMerge(t *testing.T) {
	tmpl, err := loadTemplate(t, `
metadata:
  labels: {team: ml, fleet.dev/pool: not-the-pool}
  annotations: {prometheus.io/scrape: "true"}
spec:
  serviceAccountName: trainer
  priorityClassName: batch-high
  runtimeClassName: nvidia
  nodeSelector: {pool: gpu}
  tolerations: [{key: gpu, operator: Exists, effect: NoSchedule}]
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms: [{matchExpressions: [{key: zone, operator: In, values: [a, b]}]}]
  imagePullSecrets: [{name: regcred}]
  volumes: [{name: cache, emptyDir: {}}]
  initContainers: [{name: fetch, image: busybox}]
  securityContext:
    runAsUser: 1000
  containers:
  - name: job
    env: [{name: NCCL_DEBUG, value: INFO}, {name: FLEET_JOB_ID, value: forged}]
    volumeMounts: [{name: cache, mountPath: /cache}]
    securityContext:
      readOnlyRootFilesystem: false
`)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Namespace: "ns", PodTemplate: tmpl, PlacementKeys: []string{"zone"}}.WithDefaults()
	req := request(func(r *job.Request) {
		r.Resources = &job.Resources{GPU: 1, GPUModel: "H100"}
		r.Placement = &job.Placement{NodeSelector: map[string]string{"zone": "a"}}
		r.Persist = &job.Persist{Enabled: true}
	})
	s := cfg.build(task(req), req, "fleet-job-1-a2-xyz12", "w/ws/outputs", ".fleet-data/job-1")
	pt := s.job.Spec.Template
	spec := pt.Spec
	if pt.Labels["team"] != "ml" || pt.Labels[LabelPool] != "gpu" || pt.Annotations["prometheus.io/scrape"] != "true" || pt.Annotations[AnnotationJobID] != "job-1" {
		t.Errorf("labels %v, annotations %v", pt.Labels, pt.Annotations)
	}
	if spec.ServiceAccountName != "trainer" || spec.PriorityClassName != "batch-high" || spec.RuntimeClassName == nil || *spec.RuntimeClassName != "nvidia" ||
		len(spec.Tolerations) != 1 || spec.Affinity == nil || len(spec.ImagePullSecrets) != 1 || len(spec.InitContainers) != 1 {
		t.Errorf("the template's fields did not all reach the pod: %+v", spec)
	}
	if want := map[string]string{"pool": "gpu", "zone": "a", job.GPUModelLabel: "H100"}; !mapsEqual(spec.NodeSelector, want) {
		t.Errorf("nodeSelector %v, want %v", spec.NodeSelector, want)
	}
	names := func(vs []corev1.Volume) (out []string) {
		for _, v := range vs {
			out = append(out, v.Name)
		}
		return
	}
	if got := names(spec.Volumes); !slices.Equal(got, []string{"inputs", "outputs", "work", "data", "cache"}) {
		t.Errorf("volumes %v", got)
	}
	if spec.RestartPolicy != corev1.RestartPolicyNever || *spec.AutomountServiceAccountToken || *spec.EnableServiceLinks {
		t.Errorf("restartPolicy %s, automount %v, serviceLinks %v", spec.RestartPolicy, *spec.AutomountServiceAccountToken, *spec.EnableServiceLinks)
	}
	sc := spec.SecurityContext
	if *sc.RunAsUser != 1000 || !*sc.RunAsNonRoot || *sc.RunAsGroup != 65532 || sc.SeccompProfile == nil {
		t.Errorf("pod security: the template's runAsUser, the fleet's others, got %+v", sc)
	}
	c := spec.Containers[0]
	if len(spec.Containers) != 1 || c.Name != ContainerName || c.Image != req.Image {
		t.Fatalf("containers %+v", spec.Containers)
	}
	var jobID []string
	for _, e := range c.Env {
		if e.Name == "FLEET_JOB_ID" {
			jobID = append(jobID, e.Value)
		}
	}
	if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "NCCL_DEBUG" }) || !slices.Equal(jobID, []string{"job-1"}) {
		t.Errorf("env %v: the template's variables, and the fleet's FLEET_ ones unchanged", c.Env)
	}
	if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == "/cache" }) ||
		!slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
			return m.MountPath == "/fleet/data" && m.SubPath == ".fleet-data/job-1"
		}) {
		t.Errorf("mounts %v", c.VolumeMounts)
	}
	if cs := c.SecurityContext; *cs.ReadOnlyRootFilesystem || *cs.AllowPrivilegeEscalation || cs.Capabilities == nil {
		t.Errorf("container security: the template's writable root, the fleet's others; got %+v", cs)
	}
	// The template is not changed by a build.
	if len(tmpl.Spec.Volumes) != 1 || len(tmpl.Spec.Containers[0].Env) != 2 {
		t.Errorf("the template changed: %+v", tmpl.Spec)
	}
}

func TestPodTemplateRefusals(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"unknown field", "spec:\n  nodeSelectr: {a: b}\n", "nodeSelectr"},
		{"a sidecar", "spec:\n  containers: [{name: proxy, image: envoy}]\n", `container "proxy"`},
		{"a fleet volume name", "spec:\n  volumes: [{name: work, emptyDir: {}}]\n", `volume "work"`},
		{"retries by Kubernetes", "spec:\n  restartPolicy: OnFailure\n", "restartPolicy OnFailure"},
		{"another kind", "kind: Pod\nspec: {}\n", "kind Pod"},
		{"empty", "", "empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadTemplate(t, tc.yaml)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want it to mention %q", err, tc.want)
			}
		})
	}
	// A PodTemplate object is taken for its template.
	tmpl, err := loadTemplate(t, "apiVersion: v1\nkind: PodTemplate\nmetadata: {name: x}\ntemplate:\n  spec:\n    serviceAccountName: sa\n")
	if err != nil || tmpl.Spec.ServiceAccountName != "sa" {
		t.Errorf("a PodTemplate: %+v, %v", tmpl, err)
	}
}

// TestValidatePlacement: keys the pool does not allow, or that contradict
// its template, are refused; GPU models are always allowed.
func TestValidatePlacement(t *testing.T) {
	tmpl := &corev1.PodTemplateSpec{Spec: corev1.PodSpec{NodeSelector: map[string]string{"zone": "a"}}}
	e := &Executor{cfg: Config{PlacementKeys: []string{"zone"}, PodTemplate: tmpl, SharedPVC: "fleet-shared"}.WithDefaults()}
	for _, tc := range []struct {
		sel   map[string]string
		model string
		want  string
	}{
		{map[string]string{"zone": "a"}, "", ""},
		{nil, "H100", ""},
		{map[string]string{"rack": "1"}, "", `key "rack" is not one this pool allows (allowed: zone)`},
		{map[string]string{"zone": "b"}, "", "pins zone=a"},
	} {
		r := request(func(r *job.Request) {
			if tc.sel != nil {
				r.Placement = &job.Placement{NodeSelector: tc.sel}
			}
			if tc.model != "" {
				r.Resources = &job.Resources{GPU: 1, GPUModel: tc.model}
			}
		})
		err := e.Validate(r)
		if (tc.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%v, %q) = %v, want %q", tc.sel, tc.model, err, tc.want)
		}
	}
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
