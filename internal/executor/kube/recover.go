package kube

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/fleet-dev/fleet/internal/workspace"
)

// Recover deletes the Jobs, with their pods and Secrets, and the outputs
// folders that an earlier life of the worker left behind.
//
// It deletes them rather than adopting them. Each was an attempt whose
// message the earlier process took from JetStream and never acknowledged,
// so its job comes back by redelivery, as a new attempt, to this worker or
// another. This process holds no message to report an adopted Job against,
// and the adopted Job would race the redelivered attempt; deleting keeps one
// attempt of a job running at a time, at the cost of the work the old one
// had done.
func (e *Executor) Recover(ctx context.Context, workerID string) error {
	ns := e.cfg.Namespace
	selector := labels.SelectorFromSet(ownerLabels(workerID)).String()
	jobs, err := e.client.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return fmt.Errorf("list the Jobs of worker %s in namespace %s: %w", workerID, ns, err)
	}
	var errs []error
	bg := metav1.DeletePropagationBackground
	for _, j := range jobs.Items {
		err := e.client.BatchV1().Jobs(ns).Delete(ctx, j.Name, metav1.DeleteOptions{PropagationPolicy: &bg})
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete Job %s/%s: %w", ns, j.Name, err))
		}
	}
	// Secrets that no Job came to own; the others go with their Jobs.
	// deletecollection, unlike list, never reads a Secret's data.
	err = e.client.CoreV1().Secrets(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		errs = append(errs, fmt.Errorf("delete the Secrets of worker %s in namespace %s: %w", workerID, ns, err))
	}
	if e.cfg.SharedDir != "" {
		dir := filepath.Join(e.cfg.SharedDir, labelValue(workerID))
		entries, err := os.ReadDir(dir)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("outputs folders: %w", err))
		}
		for _, entry := range entries {
			d := &workspace.Dir{Root: filepath.Join(dir, entry.Name())}
			if err := d.Remove(); err != nil {
				errs = append(errs, fmt.Errorf("outputs folder: %w", err))
			}
		}
	}
	if len(jobs.Items) > 0 {
		e.log.Info("deleted the Jobs of an earlier life of the worker", "worker_id", workerID, "jobs", len(jobs.Items))
	}
	return errors.Join(errs...)
}
