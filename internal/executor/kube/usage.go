package kube

import (
	"context"
	"encoding/json"
	"slices"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/job"
)

// What a running attempt uses comes from the metrics API
// (metrics.k8s.io, served by metrics-server) where the cluster serves it:
// the job container's CPU, as a rate over the API's window, and its working
// set of memory; the limit is the pod's. Network and block I/O and
// processes are not in that API. Where it is not served, usage is unknown,
// and the worker asks again every metricsRecheck.

// metricsRecheck is how long the worker believes the metrics API is not
// served before it asks again.
const metricsRecheck = 5 * time.Minute

// podMetricsList is the part of metrics.k8s.io/v1beta1 PodMetricsList the
// executor reads.
type podMetricsList struct {
	Items []struct {
		Metadata   metav1.ObjectMeta `json:"metadata"`
		Timestamp  metav1.Time       `json:"timestamp"`
		Containers []struct {
			Name  string              `json:"name"`
			Usage corev1.ResourceList `json:"usage"`
		} `json:"containers"`
	} `json:"items"`
}

// Usage implements executor.UsageReader.
func (e *Executor) Usage(ctx context.Context) map[executor.AttemptID]*job.Usage {
	e.mu.Lock()
	running := make(map[string]*attempt, len(e.running))
	for name, a := range e.running {
		running[name] = a
	}
	missing := e.metricsMissing
	e.mu.Unlock()
	if len(running) == 0 || (!missing.IsZero() && time.Since(missing) < metricsRecheck) {
		return nil
	}
	rc, ok := e.client.CoreV1().RESTClient().(*rest.RESTClient)
	if !ok || rc == nil {
		return nil // a fake client
	}
	sel := labels.SelectorFromSet(labels.Set{LabelManagedBy: "fleet"}).String()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	data, err := rc.Get().AbsPath("/apis/metrics.k8s.io/v1beta1/namespaces", e.cfg.Namespace, "pods").
		Param("labelSelector", sel).DoRaw(ctx)
	e.mu.Lock()
	e.metricsErr = err
	e.mu.Unlock()
	if err != nil {
		if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) || apierrors.IsServiceUnavailable(err) {
			e.mu.Lock()
			first := e.metricsMissing.IsZero()
			e.metricsMissing = time.Now()
			e.mu.Unlock()
			if first {
				e.log.Info("the cluster serves no metrics API the worker may read: the usage of attempts is unknown", "err", err)
			}
		} else {
			e.log.Debug("cannot read the metrics API", "err", err)
		}
		return nil
	}
	var list podMetricsList
	if err := json.Unmarshal(data, &list); err != nil {
		e.log.Debug("unreadable answer of the metrics API", "err", err)
		return nil
	}
	out := map[executor.AttemptID]*job.Usage{}
	for _, p := range list.Items {
		a := running[p.Metadata.Labels[batchv1.JobNameLabel]]
		if a == nil {
			continue
		}
		i := slices.IndexFunc(p.Containers, func(c struct {
			Name  string              `json:"name"`
			Usage corev1.ResourceList `json:"usage"`
		}) bool {
			return c.Name == ContainerName
		})
		if i < 0 {
			continue
		}
		u := &job.Usage{ObservedAt: p.Timestamp.UTC()}
		if u.ObservedAt.IsZero() {
			u.ObservedAt = time.Now().UTC()
		}
		if q, ok := p.Containers[i].Usage[corev1.ResourceCPU]; ok {
			v := float64(q.MilliValue()) / 10
			u.CPUPercent = &v
		}
		if q, ok := p.Containers[i].Usage[corev1.ResourceMemory]; ok {
			v := q.Value()
			u.MemoryBytes = &v
		}
		lim := scale(a.req.Resources.MemoryBytes(), e.cfg.MemoryLimitRatio)
		u.MemoryLimitBytes = &lim
		out[executor.AttemptID{Tenant: executor.TenantKey(a.t.Tenant), JobID: a.t.JobID, Attempt: a.t.Attempt}] = u
	}
	return out
}

// quantityOf reads a quantity of a resource list, 0 without it.
func quantityOf(l corev1.ResourceList, name corev1.ResourceName) int64 {
	q, ok := l[name]
	if !ok {
		return 0
	}
	return q.Value()
}
