package kube

import (
	"context"
	"fmt"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fleet-dev/fleet/job"
)

// The inventory of a Kubernetes pool is its cluster's nodes: their GPU
// models (the node label nvidia.com/gpu.product, with the GPUs each
// offers) and their labels of the placement keys. Nodes are cluster-scoped:
// reading them needs the optional ClusterRole of
// deploy/kubernetes/worker-nodes-rbac.yaml; without it the inventory holds
// only the placement keys, and admission cannot check GPU models. Every
// node counts, tainted or not: a pod that the pool's template does not let
// onto a node is unschedulable (class infrastructure after --pending-wait),
// which admission cannot foresee.

// nodeGPUs returns the GPUs all nodes offer, and whether the worker could
// read them.
func (e *Executor) nodeGPUs(ctx context.Context) (int, bool) {
	if _, err := e.Inventory(ctx); err != nil {
		return 0, false
	}
	e.invMu.Lock()
	defer e.invMu.Unlock()
	return e.invGPUs, e.invGPUs >= 0
}

// inventoryAge is how long a read of the nodes serves.
const inventoryAge = 30 * time.Second

// Inventory implements executor.InventoryReader.
func (e *Executor) Inventory(ctx context.Context) (*job.Inventory, error) {
	e.invMu.Lock()
	defer e.invMu.Unlock()
	if e.inv != nil && time.Since(e.invAt) < inventoryAge {
		return e.inv, e.invErr
	}
	inv := &job.Inventory{PlacementKeys: e.cfg.PlacementKeys}
	nodes, err := e.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	e.inv, e.invAt, e.invGPUs = inv, time.Now(), -1
	if err != nil {
		if apierrors.IsForbidden(err) {
			// Optional: said once, and not an error of the heartbeat.
			if !e.invForbidden {
				e.log.Info("the worker may not list nodes: no GPU models or node labels in its heartbeat (grant deploy/kubernetes/worker-nodes-rbac.yaml)")
			}
			e.invForbidden, e.invErr = true, nil
			return inv, nil
		}
		e.invErr = fmt.Errorf("list nodes: %w", err)
		return inv, e.invErr
	}
	e.invErr = nil
	e.invGPUs = 0
	keys := append(slices.Clone(e.cfg.PlacementKeys), job.GPUModelLabel)
	for _, n := range nodes.Items {
		e.invGPUs += int(quantityOf(n.Status.Allocatable, e.cfg.GPUResource))
		if model := n.Labels[job.GPUModelLabel]; model != "" {
			count := int(quantityOf(n.Status.Allocatable, e.cfg.GPUResource))
			if count > 0 {
				i := slices.IndexFunc(inv.GPUs, func(g job.GPUModel) bool { return g.Model == model })
				switch {
				case i >= 0:
					inv.GPUs[i].Count = max(inv.GPUs[i].Count, count)
				case len(inv.GPUs) < job.MaxInventoryGPUs:
					inv.GPUs = append(inv.GPUs, job.GPUModel{Model: model, Count: count})
				}
			}
		}
		if len(inv.Nodes) >= job.MaxInventoryNodes {
			continue
		}
		node := job.Node{Name: n.Name}
		for _, k := range keys {
			if v, ok := n.Labels[k]; ok {
				if node.Labels == nil {
					node.Labels = map[string]string{}
				}
				node.Labels[k] = v
			}
		}
		inv.Nodes = append(inv.Nodes, node)
	}
	return inv, nil
}
