package kube

import (
	"context"
	"fmt"
	"math"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/job"
)

// Capacity reports what the namespace's ResourceQuotas let pods request:
// the tightest of requests.cpu, cpu, and limits.cpu divided by the CPU
// limit ratio, and the same for memory and GPUs. Without a quota the totals
// are unknown (nil), and the worker's slots alone bound its work; GPUs are
// then those of the cluster's nodes, when the worker may list them (see
// Inventory), else none. Workers
// that share a namespace each report its whole quota. It also counts the
// worker's pods by state.
func (e *Executor) Capacity(ctx context.Context) (*executor.Capacity, error) {
	quotas, err := e.client.CoreV1().ResourceQuotas(e.cfg.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("resource quotas of namespace %s: %w", e.cfg.Namespace, err)
	}
	c := &executor.Capacity{Health: job.HealthHealthy}
	milli, value := (*resource.Quantity).MilliValue, (*resource.Quantity).Value
	var gpus *int64
	for _, q := range quotas.Items {
		if !applies(&q) {
			continue
		}
		hard := q.Status.Hard
		if len(hard) == 0 {
			hard = q.Spec.Hard
		}
		c.CPUMilli = tightest(c.CPUMilli,
			amount(hard, corev1.ResourceRequestsCPU, milli, 1),
			amount(hard, corev1.ResourceCPU, milli, 1),
			amount(hard, corev1.ResourceLimitsCPU, milli, e.cfg.CPULimitRatio))
		c.MemoryBytes = tightest(c.MemoryBytes,
			amount(hard, corev1.ResourceRequestsMemory, value, 1),
			amount(hard, corev1.ResourceMemory, value, 1),
			amount(hard, corev1.ResourceLimitsMemory, value, e.cfg.MemoryLimitRatio))
		gpus = tightest(gpus, amount(hard, "requests."+e.cfg.GPUResource, value, 1))
	}
	if gpus != nil {
		c.GPUs = int(*gpus)
	} else if n, ok := e.nodeGPUs(ctx); ok {
		// No quota bounds GPUs: the nodes' are the bound, when the worker
		// may read them.
		c.GPUs = n
	}
	if !e.jobsSynced() || !e.podsSynced() {
		c.Health, c.Reason = job.HealthDegraded, "not watching the namespace's Jobs and pods yet"
		if last := e.watchErr.Load(); last != nil {
			c.Reason += ": " + (*last).Error()
		}
		return c, nil
	}
	c.Containers = e.podCounts()
	return c, nil
}

// applies reports whether quota q counts the executor's pods, which have
// requests and an active deadline.
func applies(q *corev1.ResourceQuota) bool {
	for _, s := range q.Spec.Scopes {
		if s != corev1.ResourceQuotaScopeTerminating && s != corev1.ResourceQuotaScopeNotBestEffort {
			return false
		}
	}
	return true
}

// amount returns the quantity of name in l, in the unit of value, divided
// by ratio; nil when l does not have it.
func amount(l corev1.ResourceList, name corev1.ResourceName, value func(*resource.Quantity) int64, ratio float64) *int64 {
	q, ok := l[name]
	if !ok {
		return nil
	}
	v := int64(math.Floor(float64(value(&q)) / ratio))
	return &v
}

func tightest(cur *int64, vs ...*int64) *int64 {
	for _, v := range vs {
		if v != nil && (cur == nil || *v < *cur) {
			cur = v
		}
	}
	return cur
}

// podCounts counts the worker's pods by state.
func (e *Executor) podCounts() *job.ContainerCounts {
	pods, err := e.pods.List(labels.Everything())
	if err != nil {
		return nil
	}
	n := &job.ContainerCounts{}
	for _, p := range pods {
		switch p.Status.Phase {
		case corev1.PodRunning:
			n.Running++
		case corev1.PodSucceeded, corev1.PodFailed:
			n.Exited++
		default:
			if observe(p).stuck != notStuck {
				n.Unhealthy++
			} else {
				n.Starting++
			}
		}
	}
	return n
}
