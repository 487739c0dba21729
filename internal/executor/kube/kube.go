// Package kube runs each attempt as a Kubernetes Job in one namespace, as
// the Rust seed maps one execution request onto one Job and the Job's fate
// onto an event.
//
// A Job has one pod and is never retried by Kubernetes (backoffLimit 0,
// restartPolicy Never): the fleet retries. Its pod asks for the request's
// CPU, memory and GPUs, with limits at configured multiples of the
// requests, and runs as a non-root user without privilege escalation, with
// a read-only root filesystem. The timeout becomes activeDeadlineSeconds.
//
// The workspace contract: the request's inputs are mounted read-only at
// /fleet/inputs from a per-attempt Secret, which also carries the request's
// environment (its values may be secrets, so they never appear in the Job);
// /fleet/work is an emptyDir; /fleet/outputs is a per-attempt folder on a
// shared ReadWriteMany volume that the worker mounts too, from which it
// reads the declared outputs after the run. The Secret is owned by the Job
// and goes with it.
//
// The executor watches, through one informer per kind, the Jobs and pods
// labelled with its worker's id; each attempt waits on the notifications
// of its own Job and pod. It follows the container's log while it runs.
// An attempt ends when its pod does (the Job's own condition comes a
// second or more later, and is waited for only when it is what decides);
// its Job, pod and Secret are deleted after the result (cleanup.go). The
// spans of an attempt's steps are listed in steps.go.
package kube

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	batchlisters "k8s.io/client-go/listers/batch/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/workspace"
	"github.com/fleet-dev/fleet/job"
)

// Config configures the executor.
type Config struct {
	// Client talks to the API server. Required; see NewClient.
	Client kubernetes.Interface
	// Namespace is where attempts run. Required.
	Namespace string
	// WorkerID is the id of the worker that uses the executor. Its Jobs
	// carry it as a label, and the executor watches only those. Required.
	WorkerID string

	// CPULimitRatio sets the CPU limit to this multiple of the request.
	// Defaults to 2, as in the seed.
	CPULimitRatio float64
	// MemoryLimitRatio sets the memory limit to this multiple of the
	// request. Defaults to 1.5, as in the seed.
	MemoryLimitRatio float64
	// GPUResource is the extended resource a request's GPUs are asked as.
	// Defaults to nvidia.com/gpu.
	GPUResource corev1.ResourceName

	// ImagePullWait bounds how long a pod may fail to pull its image before
	// the attempt fails with class image. Defaults to 2 minutes.
	ImagePullWait time.Duration
	// PendingWait bounds how long a pod may stay unschedulable, or unable
	// to create its container, before the attempt fails with class
	// infrastructure. Defaults to 5 minutes.
	PendingWait time.Duration
	// DeadlineSlack is how long past its timeout a Job may still run before
	// the worker deletes it itself, should Kubernetes not have ended it.
	// Defaults to 30 seconds.
	DeadlineSlack time.Duration
	// Grace is the pods' termination grace period, between SIGTERM and
	// SIGKILL. Defaults to 10 seconds.
	Grace time.Duration
	// TTLAfterFinished is how long Kubernetes keeps a finished Job and its
	// pod that no worker deleted: the worker deletes an attempt's Job once
	// its result is published (Cleanup), so this bounds what a worker that
	// died before that, and never came back, leaves; and how long a Job
	// that ended while no worker watched can still be adopted and settled
	// from its status. Defaults to 10 minutes.
	TTLAfterFinished time.Duration

	// SharedPVC names a ReadWriteMany PersistentVolumeClaim in Namespace
	// that the worker mounts at SharedDir. Each pod mounts its attempt's
	// folder on it at /fleet/outputs. Without it, requests that declare
	// outputs are rejected: there is no way to collect them.
	SharedPVC string
	// SharedDir is where the worker mounts SharedPVC. Required with it.
	SharedDir string
	// Outputs bounds what is read back from the outputs folder.
	Outputs workspace.Limits
	// TailBytes is how much of the log a result keeps.
	TailBytes int

	// RunAsUser is the user and group id the pods run as. Defaults to
	// 65532, the "nonroot" user of distroless images.
	RunAsUser int64
	// WritableRootFilesystem gives pods a writable root filesystem. By
	// default it is read-only: jobs write to /fleet/work, where HOME and
	// TMPDIR point.
	WritableRootFilesystem bool
	// PodAnnotations are added to every pod.
	PodAnnotations map[string]string
	// PodTemplate is the pool's pod template, which every attempt's pod is
	// built on (see LoadPodTemplate and template.go for what it may set).
	PodTemplate *corev1.PodTemplateSpec
	// PlacementKeys are the node label keys requests may select with
	// placement.node_selector; nvidia.com/gpu.product (resources.gpu_model)
	// is always allowed. A request naming another key is refused.
	PlacementKeys []string

	// SyncTimeout bounds the wait for the first list of the worker's Jobs
	// and pods. Defaults to 30 seconds.
	SyncTimeout time.Duration
	Logger      *slog.Logger
}

// Defaults of Config, and of the worker's flags.
const (
	DefaultCPULimitRatio    = 2.0
	DefaultMemoryLimitRatio = 1.5
	DefaultImagePullWait    = 2 * time.Minute
	DefaultPendingWait      = 5 * time.Minute
	DefaultTTLAfterFinished = 10 * time.Minute
)

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.CPULimitRatio = cmp.Or(c.CPULimitRatio, DefaultCPULimitRatio)
	c.MemoryLimitRatio = cmp.Or(c.MemoryLimitRatio, DefaultMemoryLimitRatio)
	c.GPUResource = cmp.Or(c.GPUResource, "nvidia.com/gpu")
	c.ImagePullWait = cmp.Or(c.ImagePullWait, DefaultImagePullWait)
	c.PendingWait = cmp.Or(c.PendingWait, DefaultPendingWait)
	c.DeadlineSlack = cmp.Or(c.DeadlineSlack, 30*time.Second)
	c.Grace = cmp.Or(c.Grace, executor.DefaultGrace)
	c.TTLAfterFinished = cmp.Or(c.TTLAfterFinished, DefaultTTLAfterFinished)
	c.RunAsUser = cmp.Or(c.RunAsUser, 65532)
	c.SyncTimeout = cmp.Or(c.SyncTimeout, 30*time.Second)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	var problems []string
	if c.Client == nil {
		problems = append(problems, "a Kubernetes client is required")
	}
	if errs := validation.IsDNS1123Label(c.Namespace); len(errs) > 0 {
		problems = append(problems, fmt.Sprintf("namespace %q: %s", c.Namespace, strings.Join(errs, ", ")))
	}
	if c.WorkerID == "" {
		problems = append(problems, "a worker id is required")
	}
	if c.CPULimitRatio < 1 || c.MemoryLimitRatio < 1 {
		problems = append(problems, fmt.Sprintf("limit ratios must be at least 1 (cpu %g, memory %g)", c.CPULimitRatio, c.MemoryLimitRatio))
	}
	if c.SharedPVC != "" && c.SharedDir == "" {
		problems = append(problems, "a shared volume claim needs the folder where the worker mounts it")
	}
	if c.SharedPVC != "" {
		if fi, err := os.Stat(c.SharedDir); err != nil || !fi.IsDir() {
			problems = append(problems, fmt.Sprintf("shared folder %q is not a folder the worker can use", c.SharedDir))
		}
	}
	if c.RunAsUser < 1 {
		problems = append(problems, fmt.Sprintf("run-as user %d must not be root", c.RunAsUser))
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// Executor runs attempts as Kubernetes Jobs.
type Executor struct {
	cfg    Config
	client kubernetes.Interface
	log    *slog.Logger

	factory    informers.SharedInformerFactory
	jobs       batchlisters.JobNamespaceLister
	pods       corelisters.PodNamespaceLister
	jobsSynced cache.InformerSynced
	podsSynced cache.InformerSynced
	// watchErr is the informers' last list or watch error, to explain a
	// failed sync (a missing Role, a wrong namespace).
	watchErr atomic.Pointer[error]
	stop     chan struct{}
	closed   sync.Once

	mu       sync.Mutex
	watchers map[string]*watcher // by Job name
	running  map[string]*attempt // by Job name, for Usage

	// inventory is the nodes' inventory, read at most every inventoryAge.
	invMu  sync.Mutex
	inv    *job.Inventory
	invAt  time.Time
	invErr error
	// invForbidden: the worker may not list nodes.
	invForbidden bool
	// invGPUs is the GPUs of every node together; -1 when unknown.
	invGPUs int
	// metricsAt is when the metrics API was last found not served; it is
	// asked again after metricsRecheck.
	metricsMissing time.Time
	// metricsErr is how the last read of the metrics API ended.
	metricsErr error
}

var (
	_ executor.Executor        = (*Executor)(nil)
	_ executor.Validator       = (*Executor)(nil)
	_ executor.Recoverer       = (*Executor)(nil)
	_ executor.CapacityReader  = (*Executor)(nil)
	_ executor.Adopter         = (*Executor)(nil)
	_ executor.DataKeeper      = (*Executor)(nil)
	_ executor.UsageReader     = (*Executor)(nil)
	_ executor.InventoryReader = (*Executor)(nil)
	_ executor.Cleaner         = (*Executor)(nil)
)

// New returns an Executor and starts watching the worker's Jobs and pods.
// Close stops it.
func New(cfg Config) (*Executor, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("kubernetes executor: %w", err)
	}
	e := &Executor{
		cfg:      cfg,
		client:   cfg.Client,
		log:      cfg.Logger.With("component", "kube", "namespace", cfg.Namespace),
		stop:     make(chan struct{}),
		watchers: map[string]*watcher{},
		running:  map[string]*attempt{},
	}
	if err := e.startInformers(); err != nil {
		return nil, fmt.Errorf("kubernetes executor: %w", err)
	}
	return e, nil
}

// Close stops watching.
func (e *Executor) Close() error {
	e.closed.Do(func() {
		close(e.stop)
		e.factory.Shutdown()
	})
	return nil
}

// Validate refuses, before anything reaches the API server, requests that
// cannot run as a Job of this executor.
func (e *Executor) Validate(r *job.Request) error {
	var problems []string
	if strings.TrimSpace(r.Image) == "" {
		problems = append(problems, "an image is required")
	}
	if len(r.Outputs) > 0 && e.cfg.SharedPVC == "" {
		problems = append(problems, "it declares outputs, but the workers of this pool have no shared volume to collect them from (the worker's --shared-pvc is unset)")
	}
	if len(r.InputRefs) > 0 && e.cfg.SharedPVC == "" {
		problems = append(problems, "it has inputs by reference, but the workers of this pool have no shared volume to pass them through (the worker's --shared-pvc is unset)")
	}
	if res := r.Resources; res != nil {
		if res.CPU != "" && res.CPUMilli() <= 0 {
			problems = append(problems, "resources.cpu must be more than zero")
		}
		if res.Memory != "" && res.MemoryBytes() <= 0 {
			problems = append(problems, "resources.memory must be more than zero")
		}
	}
	if r.Persists() && e.cfg.SharedPVC == "" {
		problems = append(problems, "it asks for a data directory (persist), but the workers of this pool have no shared volume to keep it on (the worker's --shared-pvc is unset)")
	}
	if r.Placement != nil {
		for _, k := range slices.Sorted(maps.Keys(r.Placement.NodeSelector)) {
			v := r.Placement.NodeSelector[k]
			if k != job.GPUModelLabel && !slices.Contains(e.cfg.PlacementKeys, k) {
				problems = append(problems, fmt.Sprintf("placement.node_selector: key %q is not one this pool allows (allowed: %s)", k, orNone(e.cfg.PlacementKeys)))
			} else if t := e.cfg.PodTemplate; t != nil && t.Spec.NodeSelector[k] != "" && t.Spec.NodeSelector[k] != v {
				problems = append(problems, fmt.Sprintf("placement.node_selector: %s=%s, but the pool's pod template pins %s=%s", k, v, k, t.Spec.NodeSelector[k]))
			}
		}
	}
	if m := r.Resources; m != nil && m.GPUModel != "" {
		if t := e.cfg.PodTemplate; t != nil && t.Spec.NodeSelector[job.GPUModelLabel] != "" && t.Spec.NodeSelector[job.GPUModelLabel] != m.GPUModel {
			problems = append(problems, fmt.Sprintf("resources.gpu_model %s, but the pool's pod template pins %s=%s", m.GPUModel, job.GPUModelLabel, t.Spec.NodeSelector[job.GPUModelLabel]))
		}
	}
	if r.Timeout != nil && *r.Timeout <= 0 {
		problems = append(problems, "the timeout must be more than zero: it becomes the Job's activeDeadlineSeconds")
	}
	for _, k := range slices.Sorted(maps.Keys(r.Labels)) {
		if reservedLabel(k) {
			problems = append(problems, fmt.Sprintf("label %q is reserved for the fleet and Kubernetes", k))
		}
	}
	size := 0
	for k, v := range r.Env {
		size += len(k) + len(v)
	}
	for k, v := range r.Inputs {
		size += len(k) + len(v)
	}
	if size > maxSecretData {
		problems = append(problems, fmt.Sprintf("env and inputs are %d bytes together, more than a Kubernetes Secret holds", size))
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

// maxSecretData bounds what a request puts in its Secret: a Secret holds
// 1 MiB, its keys and metadata included.
const maxSecretData = 1<<20 - 16<<10

// reservedLabel reports whether a request may not set label key: the
// executor's own labels, and those the Job controller sets on pods.
func reservedLabel(key string) bool {
	switch key {
	case LabelName, LabelManagedBy, "job-name", "controller-uid":
		return true
	}
	return strings.HasPrefix(key, "fleet.dev/") || strings.HasPrefix(key, "batch.kubernetes.io/")
}
