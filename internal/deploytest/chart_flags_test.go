package deploytest

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/fleet-dev/fleet/internal/fleettest"
)

// notInChart are the flags of the dispatcher and the worker that the chart
// gives no value of its own, each with the reason. Any of them can still be
// set through a component's extraEnv.
var notInChart = map[string]map[string]string{
	"dispatcher": {
		"embedded":           "the chart connects to your NATS and Redis; running them inside the dispatcher is for one machine",
		"nats-server-config": "configures the embedded NATS server only",
		"data-dir":           "holds the embedded services' data only; without --embedded the dispatcher writes nothing",
		"memory-storage":     "streams in memory lose every job on a restart: for tests and benchmarks",
		"pprof":              "a debugging aid (Go profiles on the API's address), for a session, through extraEnv",
	},
	"worker": {
		"kubeconfig":    "in a pod the worker uses its ServiceAccount (the in-cluster configuration)",
		"pprof":         "a debugging aid (Go profiles on the metrics address), for a session, through extraEnv",
		"keep-failed":   "a debugging aid: it leaves failed attempts' workspaces, containers and Jobs behind",
		"running-after": "the chart's workers run Kubernetes Jobs and Docker containers, whose attempts are recorded running before they start whatever it says (another worker adopts them by that version)",
	},
}

// chartRenders are the renderings (a values file, and --set values) that,
// together, must set every flag of the dispatcher and the worker but those
// of notInChart. The --set ones reach what one component cannot hold at
// once: each way of authenticating to NATS.
var chartRenders = []struct {
	file string
	set  string
}{
	{"", ""},
	{"ci/all-on-values.yaml", ""},
	{"ci/hpa-values.yaml", ""},
	{"values-cluster.yaml", ""},
	{"ci/flags-values.yaml", ""},
	{"", "dispatcher.natsAuth.existingSecret=fleet-nats,dispatcher.natsAuth.credsKey=creds,worker.natsAuth.existingSecret=fleet-nats,worker.natsAuth.nkeyKey=seed"},
	{"", "dispatcher.natsAuth.existingSecret=fleet-nats,dispatcher.natsAuth.user=dispatcher,dispatcher.natsAuth.passwordKey=password,worker.natsAuth.existingSecret=fleet-nats,worker.natsAuth.tokenKey=token"},
}

var usageLine = regexp.MustCompile(`^  --([a-z0-9-]+)  \[(FLEET_[A-Z0-9_]+)\]$`)

// commandFlags lists the flags of a fleet command from its -h output, as
// flag name → environment variable.
func commandFlags(t *testing.T, name string) map[string]string {
	t.Helper()
	var out bytes.Buffer
	cmd := exec.Command(fleettest.Binary(t, name), "-h")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			t.Fatalf("%s -h: %v", name, err)
		}
	}
	flags := map[string]string{}
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		if m := usageLine.FindStringSubmatch(sc.Text()); m != nil {
			flags[m[1]] = m[2]
		}
	}
	if len(flags) < 10 {
		t.Fatalf("%s -h lists %d flags; its output:\n%s", name, len(flags), out.String())
	}
	return flags
}

// extraEnvNames are the variables a values file sets through a
// component's extraEnv: those do not count as the chart's own values.
func extraEnvNames(t *testing.T, file string) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	if file == "" {
		return names
	}
	data, err := os.ReadFile(filepath.Join(repoRoot(t), chartDir, file))
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096).Decode(&v); err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("decode %s: %v", file, err)
	}
	for _, component := range []string{"dispatcher", "worker", "dockerWorker"} {
		c, _ := v[component].(map[string]any)
		extra, _ := c["extraEnv"].([]any)
		for _, e := range extra {
			if m, ok := e.(map[string]any); ok {
				name, _ := m["name"].(string)
				names[name] = true
			}
		}
	}
	return names
}

// renderedEnv returns, per command (dispatcher, worker), every FLEET_*
// variable the chart sets from its own values across chartRenders.
func renderedEnv(t *testing.T) map[string]map[string]bool {
	t.Helper()
	env := map[string]map[string]bool{"dispatcher": {}, "worker": {}}
	for _, r := range chartRenders {
		var args []string
		if r.file != "" {
			args = append(args, "-f", filepath.Join(chartDir, r.file))
		}
		if r.set != "" {
			args = append(args, "--set", r.set)
		}
		extra := extraEnvNames(t, r.file)
		for _, w := range workloads(t, render(t, "fleet", args...)) {
			for _, c := range w.pod.Spec.Containers {
				if len(c.Command) == 0 || env[c.Command[0]] == nil {
					continue
				}
				for _, e := range c.Env {
					if strings.HasPrefix(e.Name, "FLEET_") && !extra[e.Name] {
						env[c.Command[0]][e.Name] = true
					}
				}
			}
		}
	}
	return env
}

// TestChartCoversEveryFlag: every flag of the dispatcher and the worker is
// set by some value of the chart, or is in notInChart with its reason; and
// notInChart names only flags that exist and that the chart does not set.
func TestChartCoversEveryFlag(t *testing.T) {
	helm(t)
	env := renderedEnv(t)
	for _, cmd := range []string{"dispatcher", "worker"} {
		flags := commandFlags(t, cmd)
		var missing []string
		for flag, name := range flags {
			reason, excluded := notInChart[cmd][flag]
			switch {
			case env[cmd][name] && excluded:
				t.Errorf("%s --%s is in notInChart (%s), but the chart sets %s", cmd, flag, reason, name)
			case !env[cmd][name] && !excluded:
				missing = append(missing, "--"+flag+" ("+name+")")
			}
		}
		sort.Strings(missing)
		for _, m := range missing {
			t.Errorf("%s %s has no value in the chart: add one (values.yaml, values.schema.json, the template, ci/flags-values.yaml), or add it to notInChart with the reason", cmd, m)
		}
		for flag := range notInChart[cmd] {
			if _, ok := flags[flag]; !ok {
				t.Errorf("notInChart names %s --%s, which %s -h does not list", cmd, flag, cmd)
			}
		}
	}
}

// TestChartValuesReachTheirFlags renders ci/flags-values.yaml, where every
// value that sets a flag differs from its default, and checks each reaches
// its variable in its component.
func TestChartValuesReachTheirFlags(t *testing.T) {
	objs := render(t, "fleet", "-f", filepath.Join(chartDir, "ci", "flags-values.yaml"))
	pods := map[string]corev1.PodSpec{}
	for _, w := range workloads(t, objs) {
		pods[w.name] = w.pod.Spec
	}
	want := map[string]map[string]string{
		"fleet-flags-dispatcher": {
			"FLEET_CONSOLE":             "false",
			"FLEET_FEEDS":               "false",
			"FLEET_CONSOLE_READ_ONLY":   "true",
			"FLEET_TRACE_URL":           "https://jaeger.example/trace/{trace_id}",
			"FLEET_MAX_REQUEST_BYTES":   "1048576",
			"FLEET_MAX_INPUT_REF_BYTES": "17179869184",
			"FLEET_HEARTBEAT_INTERVAL":  "2s",
			"FLEET_ACK_WAIT":            "45s",
			"FLEET_SCHEDULE_LEASE":      "5s",
			"FLEET_NATS_INBOX_PREFIX":   "_INBOX.dispatcher",
			"FLEET_NATS_TOKEN_FILE":     "/etc/fleet/nats-auth/token",
		},
		"fleet-flags-worker": {
			"FLEET_POOL":                   "gpu",
			"FLEET_HANDOFF":                "true",
			"FLEET_ADOPT_WAIT":             "20m",
			"FLEET_HEARTBEAT_INTERVAL":     "2s",
			"FLEET_ACK_WAIT":               "9s",
			"FLEET_LABELS":                 "team=ml,topology.kubernetes.io/zone=eu-west-1a",
			"FLEET_PLACEMENT_KEYS":         "topology.kubernetes.io/zone,node.example.com/class",
			"FLEET_ARTIFACTS":              "false",
			"FLEET_ARCHIVE_LOGS":           "false",
			"FLEET_MAX_OUTPUT_BYTES":       "262144",
			"FLEET_MAX_ARTIFACT_BYTES":     "2147483648",
			"FLEET_MAX_JOB_ARTIFACT_BYTES": "8589934592",
			"FLEET_MAX_LOG_BYTES":          "33554432",
			"FLEET_MAX_INPUT_REF_BYTES":    "17179869184",
			"FLEET_DATA_RETENTION":         "72h",
			"FLEET_PENDING_WAIT":           "7m",
			"FLEET_IMAGE_PULL_WAIT":        "3m",
			"FLEET_CPU_LIMIT_RATIO":        "2.5",
			"FLEET_MEMORY_LIMIT_RATIO":     "1.25",
			"FLEET_POD_TEMPLATE":           "/etc/fleet/pod-template/pod-template.yaml",
			"FLEET_NATS_INBOX_PREFIX":      "_INBOX.worker.gpu",
		},
		"fleet-flags-docker-worker": {
			"FLEET_POOL":                   "docker",
			"FLEET_CPU":                    "8",
			"FLEET_MEMORY":                 "16Gi",
			"FLEET_GPUS":                   "1",
			"FLEET_DOCKER_NETWORK":         "fleet-jobs",
			"FLEET_NVIDIA_SMI":             "/usr/local/nvidia/bin/nvidia-smi",
			"FLEET_DOCKER_CONFIG":          "/etc/fleet/docker-config/config.json",
			"FLEET_HANDOFF":                "true",
			"FLEET_ADOPT_WAIT":             "30m",
			"FLEET_HEARTBEAT_INTERVAL":     "4s",
			"FLEET_ACK_WAIT":               "12s",
			"FLEET_LABELS":                 "node.example.com/class=docker",
			"FLEET_PLACEMENT_KEYS":         "node.example.com/class",
			"FLEET_ARTIFACTS":              "true",
			"FLEET_ARCHIVE_LOGS":           "false",
			"FLEET_MAX_OUTPUT_BYTES":       "131072",
			"FLEET_MAX_ARTIFACT_BYTES":     "536870912",
			"FLEET_MAX_JOB_ARTIFACT_BYTES": "1073741824",
			"FLEET_MAX_LOG_BYTES":          "16777216",
			"FLEET_MAX_INPUT_REF_BYTES":    "4294967296",
			"FLEET_DATA_RETENTION":         "48h",
			"FLEET_NATS_INBOX_PREFIX":      "_INBOX.worker.docker",
		},
	}
	for name, vars := range want {
		pod, ok := pods[name]
		if !ok {
			t.Errorf("no workload %s among %v", name, slices.Sorted(maps.Keys(pods)))
			continue
		}
		env := envOf(pod.Containers[0])
		for k, v := range vars {
			if got, ok := env[k]; !ok {
				t.Errorf("%s: %s is not set, want %q", name, k, v)
			} else if got.Value != v {
				t.Errorf("%s: %s=%q, want %q", name, k, got.Value, v)
			}
		}
	}

	// The inline pod template is a ConfigMap, mounted where the flag points.
	worker := pods["fleet-flags-worker"]
	checkMounted(t, worker, "pod-template", "/etc/fleet/pod-template", func(v corev1.Volume) bool {
		return v.ConfigMap != nil && v.ConfigMap.Name == "fleet-flags-worker-pod-template"
	})
	var cm *corev1.ConfigMap
	for _, o := range find(objs, "ConfigMap") {
		if o.GetName() == "fleet-flags-worker-pod-template" {
			cm = convert[corev1.ConfigMap](t, o)
		}
	}
	if cm == nil {
		t.Fatal("no ConfigMap fleet-flags-worker-pod-template")
	}
	var tmpl corev1.PodTemplateSpec
	if err := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(cm.Data["pod-template.yaml"]), 4096).Decode(&tmpl); err != nil {
		t.Fatalf("the ConfigMap's pod template does not decode as a PodTemplateSpec: %v\n%s", err, cm.Data["pod-template.yaml"])
	}
	if tmpl.Spec.NodeSelector["node.example.com/class"] != "gpu" || len(tmpl.Spec.Tolerations) != 1 || len(tmpl.Spec.ImagePullSecrets) != 1 {
		t.Errorf("the pod template lost what the values gave: %+v", tmpl.Spec)
	}

	// The Docker config comes from its Secret, mounted where the flag points.
	checkMounted(t, pods["fleet-flags-docker-worker"], "docker-config", "/etc/fleet/docker-config", func(v corev1.Volume) bool {
		return v.Secret != nil && v.Secret.SecretName == "fleet-registry-auth"
	})

	// A pod template from a ConfigMap of one's own: no ConfigMap made, the
	// flag at its key.
	objs = render(t, "fleet", "--set", "worker.podTemplate.existingConfigMap=gpu-pods,worker.podTemplate.key=tmpl.yaml")
	if n := len(find(objs, "ConfigMap")); n != 0 {
		t.Errorf("%d ConfigMaps made for an existing pod template", n)
	}
	for _, w := range workloads(t, objs) {
		if w.name != "fleet-worker" {
			continue
		}
		if got := envOf(w.pod.Spec.Containers[0])["FLEET_POD_TEMPLATE"].Value; got != "/etc/fleet/pod-template/tmpl.yaml" {
			t.Errorf("FLEET_POD_TEMPLATE=%q with an existing ConfigMap", got)
		}
		checkMounted(t, w.pod.Spec, "pod-template", "/etc/fleet/pod-template", func(v corev1.Volume) bool {
			return v.ConfigMap != nil && v.ConfigMap.Name == "gpu-pods"
		})
	}

	// By default, none of the new flags is set but the booleans, at the
	// commands' own defaults.
	for _, w := range workloads(t, render(t, "fleet")) {
		env := envOf(w.pod.Spec.Containers[0])
		for _, k := range []string{"FLEET_POD_TEMPLATE", "FLEET_LABELS", "FLEET_PLACEMENT_KEYS", "FLEET_MAX_LOG_BYTES", "FLEET_ADOPT_WAIT", "FLEET_TRACE_URL", "FLEET_NATS_INBOX_PREFIX"} {
			if e, ok := env[k]; ok {
				t.Errorf("%s sets %s=%q by default", w.name, k, e.Value)
			}
		}
	}
}

func checkMounted(t *testing.T, pod corev1.PodSpec, volume, path string, ok func(corev1.Volume) bool) {
	t.Helper()
	i := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == volume })
	if i < 0 || !ok(pod.Volumes[i]) {
		t.Errorf("volume %s missing or wrong: %+v", volume, pod.Volumes)
	}
	mounts := pod.Containers[0].VolumeMounts
	if !slices.ContainsFunc(mounts, func(m corev1.VolumeMount) bool { return m.Name == volume && m.MountPath == path && m.ReadOnly }) {
		t.Errorf("volume %s is not mounted read-only at %s: %+v", volume, path, mounts)
	}
}
