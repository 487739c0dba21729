package executor

import (
	"context"

	"github.com/fleet-dev/fleet/internal/workspace"
	"github.com/fleet-dev/fleet/job"
)

// Artifacts moves an attempt's files between its workspace and the fleet's
// object store (package artifact): the worker gives one to every attempt
// (Task.Artifacts). Executors use it through NewWorkspace and
// CollectOutputs, in the workspace they already make, so that every
// executor stores and fetches the same way, while the workspace exists.
type Artifacts interface {
	// FetchInputs writes the request's inputs by reference into dir, each
	// whole and checked, or fails with a *job.Failure.
	FetchInputs(ctx context.Context, dir string) error
	// StoreOutput stores an output that does not fit in the result.
	workspace.Store
}

// NewWorkspace creates the workspace of t under base, with inline as its
// inline inputs (the request's, or none when the backend passes them
// another way) and the request's inputs by reference, fetched through
// t.Artifacts, all read-only. A reference that cannot be fetched fails as
// a *job.Failure: rejected when the object is missing or changed,
// infrastructure when the store cannot be read.
func NewWorkspace(ctx context.Context, t *Task, base string, inline map[string]string) (*workspace.Dir, error) {
	var fill func(string) error
	if len(t.Request.InputRefs) > 0 {
		if t.Artifacts == nil {
			return nil, job.Failf(job.ClassInfrastructure, job.CodeInputNotFetched,
				"the request has inputs by reference, and this worker has no object store to fetch them from")
		}
		fill = func(dir string) error { return t.Artifacts.FetchInputs(ctx, dir) }
	}
	if r := t.Request; job.ValidRunID(r.RunID) && job.ValidNodeID(r.NodeID) {
		// A run's node: in the run's and the node's folders.
		return workspace.CreateForNode(base, r.RunID, r.NodeID, t.Attempt, inline, fill)
	}
	return workspace.CreateWith(base, t.JobID, t.Attempt, inline, fill)
}

// CollectOutputs reads t's declared outputs from dir: small text outputs
// inline, the others stored through t.Artifacts as artifacts. Without
// t.Artifacts, every output must fit inline, as before the object store.
func CollectOutputs(ctx context.Context, t *Task, dir *workspace.Dir, l workspace.Limits) (map[string]string, map[string]job.Artifact, *job.Failure) {
	if t.Artifacts == nil {
		out, f := dir.Collect(t.Request.Outputs, l)
		return out, nil, f
	}
	return dir.CollectTo(ctx, t.Request.Outputs, l, t.Artifacts)
}
