package kube

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/job"
)

func TestJobName(t *testing.T) {
	long := strings.Repeat("Job_ID.", 19)[:128]
	for _, tc := range []struct {
		id      string
		attempt int
		prefix  string
	}{
		{"01jq8x5s1c7v1y9m3n0p2r4t6w", 1, "fleet-01jq8x5s1c7v1y9m3n0p2r4t6w-a1-"},
		{"Build.Node_7", 3, "fleet-build-node-7-a3-"},
		{long, 100, "fleet-job-id-job-id-job-id-job-id-job-id-job-i-a100-"},
		{"---", 2, "fleet-x-a2-"},
	} {
		name := jobName(tc.id, tc.attempt)
		if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
			t.Errorf("jobName(%q) = %q, not a DNS label: %v", tc.id, name, errs)
		}
		if !strings.HasPrefix(name, tc.prefix) || len(name) != len(tc.prefix)+5 {
			t.Errorf("jobName(%q, %d) = %q, want %q and 5 random characters", tc.id, tc.attempt, name, tc.prefix)
		}
	}
	if a, b := jobName("same", 1), jobName("same", 1); a == b {
		t.Errorf("two Jobs of the same attempt are both named %q", a)
	}
}

func TestLabelValue(t *testing.T) {
	long := strings.Repeat("w", 100)
	for _, tc := range []struct{ in, prefix string }{
		{"worker-1", "worker-1"},
		{"host.example_1", "host.example_1"},
		{"_worker", "worker-"},
		{"worker:1", "worker-1-"},
		{long, strings.Repeat("w", 54) + "-"},
		{long + "x", strings.Repeat("w", 54) + "-"},
	} {
		got := labelValue(tc.in)
		if errs := validation.IsValidLabelValue(got); len(errs) > 0 {
			t.Errorf("labelValue(%q) = %q, not a label value: %v", tc.in, got, errs)
		}
		if got == tc.in {
			continue
		}
		// A sanitized prefix and 8 hexadecimal digits of a hash.
		if !strings.HasPrefix(got, tc.prefix) || len(got) != len(tc.prefix)+8 {
			t.Errorf("labelValue(%q) = %q, want %q and a hash", tc.in, got, tc.prefix)
		}
	}
	if labelValue(long) == labelValue(long+"x") {
		t.Errorf("two long ids have the same label value %q", labelValue(long))
	}
}

// request returns a valid, normalized request; change it before use.
func request(change func(*job.Request)) *job.Request {
	r := &job.Request{Image: "registry.example/tools:1", Command: []string{"sh", "-c", "echo hi"}}
	if change != nil {
		change(r)
	}
	r.Normalize()
	return r
}

func task(r *job.Request) *executor.Task {
	return &executor.Task{JobID: "job-1", Attempt: 2, WorkerID: "worker-1", Pool: "gpu", Request: r}
}

func TestBuild(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cfg     Config
		req     *job.Request
		subPath string
		check   func(t *testing.T, s *spec)
	}{{
		name: "defaults, as in the seed",
		req:  request(nil),
		check: func(t *testing.T, s *spec) {
			j := s.job
			spec := j.Spec
			pod := spec.Template.Spec
			c := pod.Containers[0]
			equal(t, "backoffLimit", *spec.BackoffLimit, 0)
			equal(t, "activeDeadlineSeconds", *spec.ActiveDeadlineSeconds, 60)
			equal(t, "ttlSecondsAfterFinished", *spec.TTLSecondsAfterFinished, 600)
			equal(t, "restartPolicy", pod.RestartPolicy, corev1.RestartPolicyNever)
			equal(t, "terminationGracePeriodSeconds", *pod.TerminationGracePeriodSeconds, 10)
			equal(t, "automountServiceAccountToken", *pod.AutomountServiceAccountToken, false)
			equal(t, "container", c.Name, ContainerName)
			equal(t, "image", c.Image, "registry.example/tools:1")
			equal(t, "command", strings.Join(c.Command, " "), "sh -c echo hi")
			equal(t, "workingDir", c.WorkingDir, "/fleet/work")
			equal(t, "imagePullPolicy", c.ImagePullPolicy, corev1.PullIfNotPresent)
			equal(t, "requests", resources(c.Resources.Requests), "cpu=1 memory=256Mi")
			equal(t, "limits", resources(c.Resources.Limits), "cpu=2 memory=384Mi")
			if s.secret != nil {
				t.Errorf("a Secret for a request without env or inputs")
			}
			equal(t, "inputs volume", volume(pod, volumeInputs), "emptyDir")
			equal(t, "outputs volume", volume(pod, volumeOutputs), "emptyDir")
			equal(t, "work volume", volume(pod, volumeWork), "emptyDir")
			equal(t, "mounts", mounts(c), "inputs:/fleet/inputs:ro outputs:/fleet/outputs work:/fleet/work")
			equal(t, "env", env(c), "FLEET_INPUTS=/fleet/inputs FLEET_OUTPUTS=/fleet/outputs FLEET_WORK=/fleet/work "+
				"FLEET_JOB_ID=job-1 FLEET_ATTEMPT=2 FLEET_POOL=gpu HOME=/fleet/work TMPDIR=/fleet/work")
		},
	}, {
		name: "labels and ids",
		req:  request(func(r *job.Request) { r.Labels = map[string]string{"team": "search", "example.com/tier": "gold"} }),
		check: func(t *testing.T, s *spec) {
			want := "app.kubernetes.io/managed-by=fleet app.kubernetes.io/name=fleet example.com/tier=gold " +
				"fleet.dev/attempt=2 fleet.dev/job-id=job-1 fleet.dev/pool=gpu fleet.dev/worker-id=worker-1 team=search"
			equal(t, "Job labels", pairs(s.job.Labels), want)
			equal(t, "pod labels", pairs(s.job.Spec.Template.Labels), want)
			equal(t, "Job annotations", pairs(s.job.Annotations), "fleet.dev/job-id=job-1 fleet.dev/worker-id=worker-1")
			equal(t, "pod annotations", pairs(s.job.Spec.Template.Annotations), "fleet.dev/job-id=job-1 fleet.dev/worker-id=worker-1 kwok=yes")
		},
		cfg: Config{PodAnnotations: map[string]string{"kwok": "yes"}},
	}, {
		name: "a run's node: its run and node in labels and the environment, as the seed's bijux.run_id and bijux.node_id",
		req:  request(func(r *job.Request) { r.RunID, r.NodeID = "nightly:2026", "train" }),
		check: func(t *testing.T, s *spec) {
			labels := pairs(s.job.Spec.Template.Labels)
			if !strings.Contains(labels, "fleet.dev/node-id=train") || !strings.Contains(labels, "fleet.dev/run-id=nightly-2026-") {
				t.Errorf("pod labels %s: want the run (made a label value) and the node", labels)
			}
			if e := env(s.job.Spec.Template.Spec.Containers[0]); !strings.Contains(e, "FLEET_RUN_ID=nightly:2026 FLEET_NODE_ID=train") {
				t.Errorf("env %s: want FLEET_RUN_ID and FLEET_NODE_ID", e)
			}
		},
	}, {
		name: "resources, GPUs and a deadline rounded up",
		req: request(func(r *job.Request) {
			r.Resources = &job.Resources{CPU: "500m", Memory: "1Gi", GPU: 2}
			d := job.Duration(1500 * time.Millisecond)
			r.Timeout = &d
		}),
		check: func(t *testing.T, s *spec) {
			c := s.job.Spec.Template.Spec.Containers[0]
			equal(t, "requests", resources(c.Resources.Requests), "cpu=500m memory=1Gi nvidia.com/gpu=2")
			equal(t, "limits", resources(c.Resources.Limits), "cpu=1 memory=1536Mi nvidia.com/gpu=2")
			equal(t, "activeDeadlineSeconds", *s.job.Spec.ActiveDeadlineSeconds, 2)
		},
	}, {
		name: "a deadline of at least a second, configured ratios and GPU resource",
		cfg:  Config{CPULimitRatio: 1, MemoryLimitRatio: 1.25, GPUResource: "amd.com/gpu"},
		req: request(func(r *job.Request) {
			r.Resources = &job.Resources{CPU: "250m", Memory: "100Mi", GPU: 1}
			d := job.Duration(100 * time.Millisecond)
			r.Timeout = &d
		}),
		check: func(t *testing.T, s *spec) {
			c := s.job.Spec.Template.Spec.Containers[0]
			equal(t, "limits", resources(c.Resources.Limits), "amd.com/gpu=1 cpu=250m memory=125Mi")
			equal(t, "activeDeadlineSeconds", *s.job.Spec.ActiveDeadlineSeconds, 1)
		},
	}, {
		name: "env and inputs travel in a Secret",
		req: request(func(r *job.Request) {
			r.Env = map[string]string{"TOKEN": "s3cr3t-value", "HOME": "/home/me"}
			r.Inputs = map[string]string{"params.json": `{"n":1}`, "dir/data.txt": "private-input"}
		}),
		check: func(t *testing.T, s *spec) {
			if s.secret == nil {
				t.Fatal("no Secret")
			}
			equal(t, "Secret name", s.secret.Name, s.job.Name)
			equal(t, "Secret labels", pairs(s.secret.Labels), pairs(s.job.Labels))
			equal(t, "Secret data", secretData(s.secret), `env-0=/home/me env-1=s3cr3t-value input-0=private-input input-1={"n":1}`)
			pod := s.job.Spec.Template.Spec
			c := pod.Containers[0]
			equal(t, "env", env(c), "FLEET_INPUTS=/fleet/inputs FLEET_OUTPUTS=/fleet/outputs FLEET_WORK=/fleet/work "+
				"FLEET_JOB_ID=job-1 FLEET_ATTEMPT=2 FLEET_POOL=gpu TMPDIR=/fleet/work HOME<-env-0 TOKEN<-env-1")
			equal(t, "inputs volume", volume(pod, volumeInputs), "secret "+s.job.Name+" input-0:dir/data.txt input-1:params.json")
			raw, _ := json.Marshal(s.job)
			for _, secret := range []string{"s3cr3t-value", "private-input"} {
				if strings.Contains(string(raw), secret) {
					t.Errorf("the Job's spec holds %q", secret)
				}
			}
		},
	}, {
		name:    "outputs on the shared volume",
		cfg:     Config{SharedPVC: "fleet-shared"},
		req:     request(func(r *job.Request) { r.Outputs = []string{"out.txt"} }),
		subPath: "worker-1/job-1-2-abcd/outputs",
		check: func(t *testing.T, s *spec) {
			pod := s.job.Spec.Template.Spec
			equal(t, "outputs volume", volume(pod, volumeOutputs), "pvc fleet-shared")
			equal(t, "mounts", mounts(pod.Containers[0]), "inputs:/fleet/inputs:ro outputs:/fleet/outputs@worker-1/job-1-2-abcd/outputs work:/fleet/work")
		},
	}, {
		name: "workdir, pull policy",
		req:  request(func(r *job.Request) { r.Workdir = "src/app"; r.PullPolicy = job.PullAlways }),
		check: func(t *testing.T, s *spec) {
			c := s.job.Spec.Template.Spec.Containers[0]
			equal(t, "workingDir", c.WorkingDir, "/fleet/work/src/app")
			equal(t, "imagePullPolicy", c.ImagePullPolicy, corev1.PullAlways)
		},
	}, {
		name: "absolute workdir, never pull",
		req:  request(func(r *job.Request) { r.Workdir = "/app/"; r.PullPolicy = job.PullNever }),
		check: func(t *testing.T, s *spec) {
			c := s.job.Spec.Template.Spec.Containers[0]
			equal(t, "workingDir", c.WorkingDir, "/app")
			equal(t, "imagePullPolicy", c.ImagePullPolicy, corev1.PullNever)
		},
	}, {
		name: "non-root, no privilege escalation, read-only root",
		req:  request(nil),
		check: func(t *testing.T, s *spec) {
			pod := s.job.Spec.Template.Spec
			sc, csc := pod.SecurityContext, pod.Containers[0].SecurityContext
			equal(t, "runAsNonRoot", *sc.RunAsNonRoot, true)
			equal(t, "runAsUser", *sc.RunAsUser, 65532)
			equal(t, "seccomp", sc.SeccompProfile.Type, corev1.SeccompProfileTypeRuntimeDefault)
			equal(t, "allowPrivilegeEscalation", *csc.AllowPrivilegeEscalation, false)
			equal(t, "readOnlyRootFilesystem", *csc.ReadOnlyRootFilesystem, true)
			equal(t, "capabilities", csc.Capabilities.Drop[0], "ALL")
		},
	}, {
		name: "a writable root filesystem when configured",
		cfg:  Config{WritableRootFilesystem: true, RunAsUser: 1000},
		req:  request(nil),
		check: func(t *testing.T, s *spec) {
			pod := s.job.Spec.Template.Spec
			equal(t, "readOnlyRootFilesystem", *pod.Containers[0].SecurityContext.ReadOnlyRootFilesystem, false)
			equal(t, "runAsUser", *pod.SecurityContext.RunAsUser, 1000)
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg.WithDefaults()
			s := cfg.build(task(tc.req), tc.req, "fleet-job-1-a2-xyz12", tc.subPath, "")
			equal(t, "Job name", s.job.Name, "fleet-job-1-a2-xyz12")
			tc.check(t, s)
		})
	}
}

func equal[T comparable](t *testing.T, what string, got, want T) {
	t.Helper()
	if got != want {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}

func resources(l corev1.ResourceList) string {
	var s []string
	for k, v := range l {
		s = append(s, string(k)+"="+v.String())
	}
	return sorted(s)
}

func pairs(m map[string]string) string {
	var s []string
	for k, v := range m {
		s = append(s, k+"="+v)
	}
	return sorted(s)
}

func secretData(sec *corev1.Secret) string {
	var s []string
	for k, v := range sec.Data {
		s = append(s, k+"="+string(v))
	}
	return sorted(s)
}

func env(c corev1.Container) string {
	var s []string
	for _, e := range c.Env {
		if e.ValueFrom != nil {
			s = append(s, e.Name+"<-"+e.ValueFrom.SecretKeyRef.Key)
			continue
		}
		s = append(s, e.Name+"="+e.Value)
	}
	return strings.Join(s, " ")
}

func mounts(c corev1.Container) string {
	var s []string
	for _, m := range c.VolumeMounts {
		v := m.Name + ":" + m.MountPath
		if m.SubPath != "" {
			v += "@" + m.SubPath
		}
		if m.ReadOnly {
			v += ":ro"
		}
		s = append(s, v)
	}
	return strings.Join(s, " ")
}

func volume(pod corev1.PodSpec, name string) string {
	for _, v := range pod.Volumes {
		if v.Name != name {
			continue
		}
		switch {
		case v.EmptyDir != nil:
			return "emptyDir"
		case v.PersistentVolumeClaim != nil:
			return "pvc " + v.PersistentVolumeClaim.ClaimName
		case v.Secret != nil:
			s := "secret " + v.Secret.SecretName
			for _, it := range v.Secret.Items {
				s += " " + it.Key + ":" + it.Path
			}
			return s
		}
		return "other"
	}
	return "none"
}

func sorted(s []string) string {
	slices.Sort(s)
	return strings.Join(s, " ")
}
