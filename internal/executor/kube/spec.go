package kube

import (
	"fmt"
	"hash/fnv"
	"maps"
	"math"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/workspace"
	"github.com/fleet-dev/fleet/job"
)

// Labels on every Job, pod and Secret the executor creates. Label values
// must be at most 63 characters of [A-Za-z0-9_.-]: ids that are not are
// sanitized (see labelValue), and the real ids are kept in annotations.
const (
	LabelName      = "app.kubernetes.io/name"       // "fleet"
	LabelManagedBy = "app.kubernetes.io/managed-by" // "fleet"
	LabelJobID     = "fleet.dev/job-id"
	LabelAttempt   = "fleet.dev/attempt"
	LabelWorkerID  = "fleet.dev/worker-id"
	LabelPool      = "fleet.dev/pool"
	// LabelRunID and LabelNodeID name the run and the node a run's
	// node's Job is of, as the seed's bijux.run_id and bijux.node_id did.
	LabelRunID  = "fleet.dev/run-id"
	LabelNodeID = "fleet.dev/node-id"

	AnnotationJobID = "fleet.dev/job-id"
	// AnnotationTenant is the job's tenant, on Jobs and pods of other
	// tenants' jobs than the default one's.
	AnnotationTenant   = "fleet.dev/tenant"
	AnnotationWorkerID = "fleet.dev/worker-id"
)

// ContainerName names the one container of an attempt's pod.
const ContainerName = "job"

// Volume names in the pod.
const (
	volumeInputs  = "inputs"
	volumeOutputs = "outputs"
	volumeWork    = "work"
	volumeData    = "data"
)

// spec is what one attempt submits: a Job, and a Secret holding the
// request's environment and inputs (nil when it has neither).
type spec struct {
	job    *batchv1.Job
	secret *corev1.Secret
}

// jobName names an attempt's Job (and its Secret): a DNS label of at most
// 63 characters, as the seed makes it, with a random suffix so that a new
// Job never collides with an old one still being deleted.
func jobName(jobID string, attempt int) string {
	return fmt.Sprintf("fleet-%s-a%d-%s", job.DNSLabel(jobID, 40), attempt, rand.String(5))
}

// labelValue returns s when it is a valid label value; otherwise a sanitized
// prefix of s and a hash of all of it, so that distinct ids stay distinct.
func labelValue(s string) string {
	if len(validation.IsValidLabelValue(s)) == 0 {
		return s
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(s))
	return fmt.Sprintf("%s-%08x", job.DNSLabel(s, 54), h.Sum32())
}

// ownerLabels are the labels by which a worker finds its objects.
func ownerLabels(workerID string) map[string]string {
	return map[string]string{
		LabelManagedBy: "fleet",
		LabelWorkerID:  labelValue(workerID),
	}
}

// build maps one attempt onto a Job, as the seed does: requests from the
// request, limits by the configured ratios, the timeout as
// activeDeadlineSeconds, no retries by Kubernetes, and the workspace
// contract. subPath is the attempt's outputs folder on the shared volume,
// empty without one. The request must be valid and normalized.
func (c *Config) build(t *executor.Task, req *job.Request, name, subPath, dataPath string) *spec {
	labels := maps.Clone(req.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	maps.Copy(labels, ownerLabels(t.WorkerID))
	labels[LabelName] = "fleet"
	labels[LabelJobID] = labelValue(t.JobID)
	labels[LabelAttempt] = strconv.Itoa(t.Attempt)
	labels[LabelPool] = labelValue(t.Pool)
	if req.RunID != "" {
		labels[LabelRunID], labels[LabelNodeID] = labelValue(req.RunID), labelValue(req.NodeID)
	}
	ids := map[string]string{AnnotationJobID: t.JobID, AnnotationWorkerID: t.WorkerID}
	if tenant := executor.TenantKey(t.Tenant); tenant != "" {
		ids[AnnotationTenant] = tenant
	}
	podAnnotations := make(map[string]string, len(c.PodAnnotations)+len(ids))
	maps.Copy(podAnnotations, c.PodAnnotations)
	maps.Copy(podAnnotations, ids)

	s := &spec{}
	env := []corev1.EnvVar{
		{Name: "FLEET_INPUTS", Value: workspace.ContainerInputs},
		{Name: "FLEET_OUTPUTS", Value: workspace.ContainerOutputs},
		{Name: "FLEET_WORK", Value: workspace.ContainerWork},
		{Name: "FLEET_JOB_ID", Value: t.JobID},
		{Name: "FLEET_ATTEMPT", Value: strconv.Itoa(t.Attempt)},
		{Name: "FLEET_POOL", Value: t.Pool},
	}
	for _, kv := range executor.RunEnv(req) {
		k, v, _ := strings.Cut(kv, "=")
		env = append(env, corev1.EnvVar{Name: k, Value: v})
	}
	if dataPath != "" {
		env = append(env, corev1.EnvVar{Name: "FLEET_DATA", Value: workspace.ContainerData})
	}
	// The root filesystem is read-only: HOME and TMPDIR point at the work
	// folder, as the process executor sets them, unless the request does.
	for _, v := range []string{"HOME", "TMPDIR"} {
		if _, ok := req.Env[v]; !ok {
			env = append(env, corev1.EnvVar{Name: v, Value: workspace.ContainerWork})
		}
	}
	inputs := corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}
	if len(req.Env) > 0 || len(req.Inputs) > 0 {
		// Environment values may be secrets, so they travel in a Secret,
		// never in the Job's spec. Keys are indexes: env names and file
		// paths are not all valid Secret keys.
		s.secret = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: ids},
			Type:       corev1.SecretTypeOpaque,
			Immutable:  new(true),
			Data:       make(map[string][]byte, len(req.Env)+len(req.Inputs)),
		}
		for i, k := range slices.Sorted(maps.Keys(req.Env)) {
			key := "env-" + strconv.Itoa(i)
			s.secret.Data[key] = []byte(req.Env[k])
			env = append(env, corev1.EnvVar{Name: k, ValueFrom: &corev1.EnvVarSource{
				SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: name}, Key: key},
			}})
		}
		if len(req.Inputs) > 0 {
			src := &corev1.SecretVolumeSource{SecretName: name, DefaultMode: new(int32(0o444))}
			for i, p := range slices.Sorted(maps.Keys(req.Inputs)) {
				key := "input-" + strconv.Itoa(i)
				s.secret.Data[key] = []byte(req.Inputs[p])
				src.Items = append(src.Items, corev1.KeyToPath{Key: key, Path: p})
			}
			inputs = corev1.VolumeSource{Secret: src}
		}
	}

	outputs := corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}
	outputsMount := corev1.VolumeMount{Name: volumeOutputs, MountPath: workspace.ContainerOutputs}
	if subPath != "" {
		outputs = corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: c.SharedPVC}}
		outputsMount.SubPath = subPath
	}

	container := corev1.Container{
		Name:            ContainerName,
		Image:           req.Image,
		Command:         req.Command,
		WorkingDir:      workingDir(req.Workdir),
		Env:             env,
		Resources:       c.resources(req.Resources),
		ImagePullPolicy: pullPolicy(req.PullPolicy),
		VolumeMounts: []corev1.VolumeMount{
			{Name: volumeInputs, MountPath: workspace.ContainerInputs, ReadOnly: true},
			outputsMount,
			{Name: volumeWork, MountPath: workspace.ContainerWork},
		},
		SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: new(false),
			ReadOnlyRootFilesystem:   new(!c.WritableRootFilesystem),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		},
	}

	volumes := []corev1.Volume{
		{Name: volumeInputs, VolumeSource: inputs},
		{Name: volumeOutputs, VolumeSource: outputs},
		{Name: volumeWork, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	}
	if dataPath != "" {
		volumes = append(volumes, corev1.Volume{Name: volumeData,
			VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: c.SharedPVC}}})
		container.VolumeMounts = append(container.VolumeMounts,
			corev1.VolumeMount{Name: volumeData, MountPath: workspace.ContainerData, SubPath: dataPath})
	}

	s.job = &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: ids},
		Spec: batchv1.JobSpec{
			// The fleet retries, not Kubernetes.
			BackoffLimit:            new(int32(0)),
			ActiveDeadlineSeconds:   new(deadlineSeconds(req.Timeout.Std())),
			TTLSecondsAfterFinished: new(int32(c.TTLAfterFinished.Seconds())),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: podAnnotations},
				Spec: corev1.PodSpec{
					RestartPolicy:                 corev1.RestartPolicyNever,
					TerminationGracePeriodSeconds: new(int64(math.Ceil(c.Grace.Seconds()))),
					// The job has no business with the API server.
					AutomountServiceAccountToken: new(false),
					EnableServiceLinks:           new(false),
					// No fsGroup: the kubelet would chown the whole shared
					// volume at every mount. The worker makes the outputs
					// folder writable by anyone instead.
					SecurityContext: &corev1.PodSecurityContext{
						RunAsNonRoot:   new(true),
						RunAsUser:      new(c.RunAsUser),
						RunAsGroup:     new(c.RunAsUser),
						SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
					},
					Containers:   []corev1.Container{container},
					Volumes:      volumes,
					NodeSelector: nodeSelector(req),
				},
			},
		},
	}
	if c.PodTemplate != nil {
		s.job.Spec.Template = mergeTemplate(c.PodTemplate, s.job.Spec.Template)
	}
	return s
}

// nodeSelector is what a request asks of its node: its placement's node
// selector, and the GPU model's label.
func nodeSelector(req *job.Request) map[string]string {
	var sel map[string]string
	if req.Placement != nil && len(req.Placement.NodeSelector) > 0 {
		sel = maps.Clone(req.Placement.NodeSelector)
	}
	if m := req.Resources.GPUModel; m != "" {
		if sel == nil {
			sel = map[string]string{}
		}
		sel[job.GPUModelLabel] = m
	}
	return sel
}

// resources maps the request's resources onto requests and limits: limits
// are the requests times the configured ratios, except GPUs, whose request
// and limit must be equal.
func (c *Config) resources(r *job.Resources) corev1.ResourceRequirements {
	cpu, mem := r.CPUMilli(), r.MemoryBytes()
	req := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewMilliQuantity(cpu, resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(mem, resource.BinarySI),
	}
	lim := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewMilliQuantity(scale(cpu, c.CPULimitRatio), resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(scale(mem, c.MemoryLimitRatio), resource.BinarySI),
	}
	if r.GPU > 0 {
		n := *resource.NewQuantity(int64(r.GPU), resource.DecimalSI)
		req[c.GPUResource], lim[c.GPUResource] = n, n
	}
	return corev1.ResourceRequirements{Requests: req, Limits: lim}
}

func scale(v int64, ratio float64) int64 { return int64(math.Ceil(float64(v) * ratio)) }

// deadlineSeconds is the timeout in whole seconds, rounded up, at least 1.
func deadlineSeconds(d time.Duration) int64 {
	return max(1, int64(math.Ceil(d.Seconds())))
}

// workingDir resolves the request's workdir: relative paths under the work
// folder, as in every executor.
func workingDir(wd string) string {
	if path.IsAbs(wd) {
		return path.Clean(wd)
	}
	return path.Join(workspace.ContainerWork, wd)
}

func pullPolicy(p job.PullPolicy) corev1.PullPolicy {
	switch p {
	case job.PullAlways:
		return corev1.PullAlways
	case job.PullNever:
		return corev1.PullNever
	}
	return corev1.PullIfNotPresent
}
