package docker

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/distribution/reference"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/workspace"
	"github.com/fleet-dev/fleet/job"
)

// Labels on every container the executor creates, so that ownership shows
// with docker ps --filter label=fleet.worker_id=ID.
const (
	LabelManaged  = "fleet.managed" // "true"
	LabelJobID    = "fleet.job_id"
	LabelAttempt  = "fleet.attempt"
	LabelWorkerID = "fleet.worker_id"
	LabelPool     = "fleet.pool"
	// LabelWorkspace is the attempt's workspace folder on the host, which
	// Recover removes with the container.
	LabelWorkspace = "fleet.workspace"
	// LabelDataJobID is on the named volume that holds a job's data
	// directory (persist): docker volume ls --filter label=fleet.data_job_id=ID.
	LabelDataJobID = "fleet.data_job_id"
	// LabelTenant is the job's tenant, on containers and data volumes of
	// other tenants' jobs than the default one's.
	LabelTenant = "fleet.tenant"
	// LabelRunID and LabelNodeID name the run and the node a run's
	// node's attempt is of, as the seed's bijux.run_id and bijux.node_id
	// did.
	LabelRunID  = "fleet.run_id"
	LabelNodeID = "fleet.node_id"
)

// cfsPeriod is the CFS period of every container, in microseconds: the
// kernel's default.
const cfsPeriod = 100_000

// containerName names the container of one attempt: fleet-<job>-<attempt>-<suffix>.
// The job id is folded into a DNS label, as a Kubernetes object name would
// be; the random suffix keeps the name unique when an attempt number comes
// round again after a hand-back, or while a failed container is kept.
func containerName(jobID string, attempt int, suffix string) string {
	return "fleet-" + job.DNSLabel(jobID, 40) + "-" + strconv.Itoa(attempt) + "-" + suffix
}

func randomSuffix() string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// labels says who owns the container of an attempt.
func labels(t *executor.Task, workspaceRoot string) map[string]string {
	l := map[string]string{
		LabelManaged:   "true",
		LabelJobID:     t.JobID,
		LabelAttempt:   strconv.Itoa(t.Attempt),
		LabelWorkerID:  t.WorkerID,
		LabelPool:      t.Pool,
		LabelWorkspace: workspaceRoot,
	}
	if tenant := executor.TenantKey(t.Tenant); tenant != "" {
		l[LabelTenant] = tenant
	}
	if r := t.Request; r != nil && r.RunID != "" {
		l[LabelRunID], l[LabelNodeID] = r.RunID, r.NodeID
	}
	return l
}

// resources maps a request's resources onto the container's limits: the
// CPU quantity becomes a CFS quota, the memory a hard limit with no swap on
// top (a job over its memory is killed, not slowed down), GPUs NVIDIA device
// requests. pids bounds the container's processes.
//
// A CFS quota rather than NanoCPUs: the daemon refuses NanoCPUs above the
// host's CPU count, while a quota above it only means "no CPU limit here".
func resources(r *job.Resources, pids int64) container.Resources {
	cpu, mem := r.CPUMilli(), r.MemoryBytes()
	res := container.Resources{
		CPUPeriod: cfsPeriod,
		// The kernel's smallest quota is 1ms, 10 millicores.
		CPUQuota:   max(cpu*cfsPeriod/1000, 1000),
		Memory:     mem,
		MemorySwap: mem,
		PidsLimit:  &pids,
	}
	if r.GPU > 0 {
		res.DeviceRequests = []container.DeviceRequest{{Driver: "nvidia", Count: r.GPU, Capabilities: [][]string{{"gpu"}}}}
	}
	return res
}

// runAs returns the user a container runs as: the image's own when it
// names one other than root, otherwise the operator's fallback. Empty means
// the image's.
func runAs(imageUser, fallback string) string {
	switch u, _, _ := strings.Cut(imageUser, ":"); u {
	case "", "0", "root":
		return fallback
	}
	return ""
}

// spec is the container of one attempt: command, environment, labels,
// workspace mounts, limits, and the hardening every container gets.
func (e *Executor) spec(t *executor.Task, imageUser string, dir *workspace.Dir, data string) (*container.Config, *container.HostConfig) {
	req := t.Request
	cfg := &container.Config{
		Image:  req.Image,
		Env:    environ(t, data != ""),
		Labels: labels(t, dir.Root),
		User:   runAs(imageUser, e.cfg.User),
	}
	if cfg.User != "" {
		// The user is ours, not the image's: it may have no home.
		cfg.Env = slices.Insert(cfg.Env, 0, "HOME="+workspace.ContainerWork)
	}
	if len(req.Command) > 0 {
		// The command is the whole command line, as on the other
		// executors: it replaces the image's entrypoint, and its CMD.
		cfg.Entrypoint = slices.Clone(req.Command)
	}
	if req.Workdir != "" {
		cfg.WorkingDir = containerWorkdir(req.Workdir)
	}
	host := &container.HostConfig{
		Mounts: []mount.Mount{
			{Type: mount.TypeBind, Source: dir.Inputs, Target: workspace.ContainerInputs, ReadOnly: true},
			{Type: mount.TypeBind, Source: dir.Outputs, Target: workspace.ContainerOutputs},
			{Type: mount.TypeBind, Source: dir.Work, Target: workspace.ContainerWork},
		},
		NetworkMode: container.NetworkMode(e.cfg.Network),
		Privileged:  false,
		CapDrop:     []string{"ALL"},
		SecurityOpt: []string{"no-new-privileges"},
		Resources:   resources(req.Resources, e.cfg.PidsLimit),
	}
	if data != "" {
		host.Mounts = append(host.Mounts, mount.Mount{Type: mount.TypeVolume, Source: data, Target: workspace.ContainerData})
	}
	return cfg, host
}

// containerWorkdir resolves a request's workdir: relative paths are under
// /fleet/work.
func containerWorkdir(dir string) string {
	if path.IsAbs(dir) {
		return path.Clean(dir)
	}
	return path.Join(workspace.ContainerWork, dir)
}

// environ is the container's environment on top of the image's: where the
// workspace is, which attempt this is, then the request's own variables.
func environ(t *executor.Task, data bool) []string {
	env := []string{
		"FLEET_INPUTS=" + workspace.ContainerInputs,
		"FLEET_OUTPUTS=" + workspace.ContainerOutputs,
		"FLEET_WORK=" + workspace.ContainerWork,
		"FLEET_JOB_ID=" + t.JobID,
		"FLEET_ATTEMPT=" + strconv.Itoa(t.Attempt),
		"FLEET_POOL=" + t.Pool,
	}
	env = append(env, executor.RunEnv(t.Request)...)
	if data {
		env = append(env, "FLEET_DATA="+workspace.ContainerData)
	}
	keys := make([]string, 0, len(t.Request.Env))
	for k := range t.Request.Env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		env = append(env, k+"="+t.Request.Env[k])
	}
	return env
}

// checkImage says why an image may not run here: it is missing, it is not
// a reference, or no prefix of the allowlist covers it.
func checkImage(image string, allowed []string) error {
	if image == "" {
		return errors.New("an image is required: every attempt runs in a container")
	}
	named, err := reference.ParseNormalizedNamed(image)
	if err != nil {
		return fmt.Errorf("image %q is not a valid reference: %w", image, err)
	}
	if len(allowed) == 0 {
		return nil
	}
	// Both as people write it ("alpine:3") and in full
	// ("docker.io/library/alpine:3").
	forms := []string{reference.FamiliarString(named), reference.TagNameOnly(named).String()}
	for _, p := range allowed {
		for _, f := range forms {
			if hasPrefix(f, p) {
				return nil
			}
		}
	}
	return fmt.Errorf("image %s is not allowed on this worker (allowed: %s)", image, strings.Join(allowed, ", "))
}

// hasPrefix reports whether image starts with prefix at a boundary of its
// name: "ghcr.io/acme" covers "ghcr.io/acme/app" and "ghcr.io/acme:1", not
// "ghcr.io/acme-evil/app".
func hasPrefix(image, prefix string) bool {
	if prefix == "" || !strings.HasPrefix(image, prefix) {
		return false
	}
	if len(image) == len(prefix) || strings.ContainsAny(prefix[len(prefix)-1:], "/:@") {
		return true
	}
	return strings.ContainsAny(image[len(prefix):len(prefix)+1], "/:@")
}
