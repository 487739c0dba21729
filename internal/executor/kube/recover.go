package kube

import (
	"context"
)

// Recover deletes the Jobs, with their pods and Secrets, and the outputs
// folders that an earlier life of the worker left behind.
//
// A worker that adopts calls RecoverAdoptable instead, which keeps the Jobs
// whose attempts their jobs' records still say run: the worker that gets
// such a job's message, this one or another, adopts the Job.
func (e *Executor) Recover(ctx context.Context, workerID string) error {
	return e.recover(ctx, workerID, nil)
}
