package kube

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/fleet-dev/fleet/job"
)

// A pool's pod template (--pod-template) is a PodTemplateSpec in YAML that
// every attempt's pod is built on: the fleet's own fields go on top of it.
//
// From the template, as written: nodeSelector (a request's placement may add
// keys, never change the template's), tolerations, affinity,
// imagePullSecrets, serviceAccountName, priorityClassName,
// runtimeClassName, schedulerName, topology spread, DNS, init containers,
// extra volumes, and labels and annotations (the fleet's own keys win).
//
// The fleet's own, always: the job container's name, image, command,
// working directory, resources and pull policy, its env (the template's
// container "job" may add variables, not replace the fleet's), the
// workspace volumes and mounts, restartPolicy Never, the termination grace
// period, the Job's labels.
//
// The fleet's security settings, unless the template sets them: on the
// pod, automountServiceAccountToken false, enableServiceLinks false, and
// in securityContext runAsNonRoot, runAsUser, runAsGroup and seccompProfile
// (each kept unless the template's pod securityContext sets that field);
// on the job container, in securityContext, allowPrivilegeEscalation false,
// readOnlyRootFilesystem and capabilities drop ALL (each kept unless the
// template's container "job" sets that field). A template that sets them
// takes responsibility for them; the namespace's Pod Security admission
// still applies.

// reservedVolumes are the volume names of the fleet's own.
var reservedVolumes = []string{volumeInputs, volumeOutputs, volumeWork, volumeData}

// LoadPodTemplate reads a pod template: a PodTemplateSpec in YAML (or
// JSON), or a PodTemplate object, whose template is taken. Unknown fields
// are errors, and so is anything the fleet cannot build on: containers
// other than one named "job", volumes with the fleet's names.
func LoadPodTemplate(path string) (*corev1.PodTemplateSpec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("pod template: %w", err)
	}
	t, err := parsePodTemplate(data)
	if err != nil {
		return nil, fmt.Errorf("pod template %s: %w", path, err)
	}
	return t, nil
}

func parsePodTemplate(data []byte) (*corev1.PodTemplateSpec, error) {
	var probe struct {
		Kind string `json:"kind"`
	}
	_ = yaml.Unmarshal(data, &probe)
	var t corev1.PodTemplateSpec
	if probe.Kind != "" {
		if probe.Kind != "PodTemplate" {
			return nil, fmt.Errorf("kind %s: give a PodTemplateSpec (metadata and spec) or a PodTemplate", probe.Kind)
		}
		var pt corev1.PodTemplate
		if err := yaml.UnmarshalStrict(data, &pt); err != nil {
			return nil, err
		}
		t = pt.Template
	} else if err := yaml.UnmarshalStrict(data, &t); err != nil {
		return nil, err
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, errors.New("it is empty")
	}
	var problems []string
	for _, c := range t.Spec.Containers {
		if c.Name != ContainerName {
			problems = append(problems, fmt.Sprintf("container %q: the only container a template may have is %q, whose fields the job's container starts from (a sidecar would keep the Job from ending; use an init container)", c.Name, ContainerName))
		}
	}
	for _, v := range t.Spec.Volumes {
		if slices.Contains(reservedVolumes, v.Name) {
			problems = append(problems, fmt.Sprintf("volume %q: the fleet's own volumes are named %s", v.Name, strings.Join(reservedVolumes, ", ")))
		}
	}
	if p := t.Spec.RestartPolicy; p != "" && p != corev1.RestartPolicyNever {
		problems = append(problems, fmt.Sprintf("restartPolicy %s: the fleet retries, not Kubernetes (Never)", p))
	}
	for k := range t.Spec.NodeSelector {
		if err := job.ValidateLabel(k, t.Spec.NodeSelector[k]); err != nil {
			problems = append(problems, "nodeSelector: "+err.Error())
		}
	}
	if len(problems) > 0 {
		return nil, errors.New(strings.Join(problems, "; "))
	}
	return &t, nil
}

// mergeTemplate builds the pod template of a Job on tmpl: own is the
// fleet's, whose fields win but where the package comment says otherwise.
func mergeTemplate(tmpl *corev1.PodTemplateSpec, own corev1.PodTemplateSpec) corev1.PodTemplateSpec {
	t := *tmpl.DeepCopy()
	out := own
	out.Labels = merged(t.Labels, own.Labels)
	out.Annotations = merged(t.Annotations, own.Annotations)

	spec := t.Spec
	o := own.Spec
	spec.RestartPolicy = o.RestartPolicy
	spec.TerminationGracePeriodSeconds = o.TerminationGracePeriodSeconds
	if spec.AutomountServiceAccountToken == nil {
		spec.AutomountServiceAccountToken = o.AutomountServiceAccountToken
	}
	if spec.EnableServiceLinks == nil {
		spec.EnableServiceLinks = o.EnableServiceLinks
	}
	spec.SecurityContext = podSecurity(spec.SecurityContext, o.SecurityContext)
	// The template's node selector is the pool's: a request adds to it.
	spec.NodeSelector = merged(o.NodeSelector, t.Spec.NodeSelector)
	spec.Volumes = append(slices.Clone(o.Volumes), t.Spec.Volumes...)

	ctr := o.Containers[0]
	if i := slices.IndexFunc(t.Spec.Containers, func(c corev1.Container) bool { return c.Name == ContainerName }); i >= 0 {
		base := t.Spec.Containers[i]
		var env []corev1.EnvVar
		for _, v := range base.Env {
			if !slices.ContainsFunc(ctr.Env, func(f corev1.EnvVar) bool { return f.Name == v.Name }) {
				env = append(env, v)
			}
		}
		ctr.Env = append(env, ctr.Env...)
		ctr.EnvFrom = base.EnvFrom
		ctr.VolumeMounts = append(ctr.VolumeMounts, base.VolumeMounts...)
		ctr.SecurityContext = containerSecurity(base.SecurityContext, ctr.SecurityContext)
		ctr.Ports = base.Ports
		ctr.TerminationMessagePolicy = base.TerminationMessagePolicy
	}
	spec.Containers = []corev1.Container{ctr}
	out.Spec = spec
	return out
}

// merged returns base with over on top; nil when both are empty.
func merged(base, over map[string]string) map[string]string {
	if len(base) == 0 && len(over) == 0 {
		return nil
	}
	m := maps.Clone(base)
	if m == nil {
		m = map[string]string{}
	}
	maps.Copy(m, over)
	return m
}

// podSecurity keeps each of the fleet's pod security settings that the
// template's does not set.
func podSecurity(t, own *corev1.PodSecurityContext) *corev1.PodSecurityContext {
	if t == nil {
		return own
	}
	s := t.DeepCopy()
	if s.RunAsNonRoot == nil {
		s.RunAsNonRoot = own.RunAsNonRoot
	}
	if s.RunAsUser == nil {
		s.RunAsUser = own.RunAsUser
	}
	if s.RunAsGroup == nil {
		s.RunAsGroup = own.RunAsGroup
	}
	if s.SeccompProfile == nil {
		s.SeccompProfile = own.SeccompProfile
	}
	return s
}

// containerSecurity keeps each of the fleet's security settings of the job
// container that the template's container "job" does not set.
func containerSecurity(t, own *corev1.SecurityContext) *corev1.SecurityContext {
	if t == nil {
		return own
	}
	s := t.DeepCopy()
	if s.AllowPrivilegeEscalation == nil {
		s.AllowPrivilegeEscalation = own.AllowPrivilegeEscalation
	}
	if s.ReadOnlyRootFilesystem == nil {
		s.ReadOnlyRootFilesystem = own.ReadOnlyRootFilesystem
	}
	if s.Capabilities == nil {
		s.Capabilities = own.Capabilities
	}
	return s
}
