package kube

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/workspace"
	"github.com/fleet-dev/fleet/job"
)

// Inputs by reference reach a pod through the shared volume, as outputs
// come back: the worker fetches them into the attempt's inputs folder on
// it, with the inline inputs beside them, and the pod mounts that folder
// read-only at /fleet/inputs instead of the Secret's items. Env stays in
// the Secret. A request without inputs by reference is run as before.

// sharedWorkspace creates the attempt's folder on the shared volume: its
// outputs folder, and its inputs when the request has some by reference.
func sharedWorkspace(ctx context.Context, t *executor.Task, req *job.Request, base string) (*workspace.Dir, error) {
	var inline map[string]string
	if len(req.InputRefs) > 0 {
		inline = req.Inputs
	}
	dir, err := executor.NewWorkspace(ctx, t, base, inline)
	if err != nil {
		var f *job.Failure
		if errors.As(err, &f) {
			return nil, f
		}
		return nil, fmt.Errorf("outputs folder on the shared volume: %w", err)
	}
	return dir, nil
}

// inputsOnSharedVolume mounts the attempt's inputs folder of the shared
// volume at /fleet/inputs, read-only, and drops the inputs from the
// Secret: they are in that folder.
func (s *spec) inputsOnSharedVolume(claim, sharedDir string, dir *workspace.Dir) error {
	rel, err := filepath.Rel(sharedDir, dir.Inputs)
	if err != nil {
		return fmt.Errorf("inputs folder on the shared volume: %w", err)
	}
	pod := &s.job.Spec.Template.Spec
	for i := range pod.Volumes {
		if pod.Volumes[i].Name == volumeInputs {
			pod.Volumes[i].VolumeSource = corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim, ReadOnly: true}}
		}
	}
	for c := range pod.Containers {
		for i := range pod.Containers[c].VolumeMounts {
			if m := &pod.Containers[c].VolumeMounts[i]; m.Name == volumeInputs {
				m.SubPath, m.ReadOnly = filepath.ToSlash(rel), true
			}
		}
	}
	if s.secret != nil {
		for k := range s.secret.Data {
			if strings.HasPrefix(k, "input-") {
				delete(s.secret.Data, k)
			}
		}
		if len(s.secret.Data) == 0 {
			s.secret = nil // it held inputs only
		}
	}
	return nil
}
