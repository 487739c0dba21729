package process

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/workspace"
	"github.com/fleet-dev/fleet/job"
)

// A job that asks for a data directory (persist) gets the folder
// DataDir/<job id>: job ids are valid file names. It is on the worker's
// host: an attempt that another worker runs starts with an empty one.

// dataDir makes the job's data folder, if it has none yet, and returns it.
func (e *Executor) dataDir(jobID string) (string, error) {
	if !job.ValidID(jobID) {
		return "", fmt.Errorf("job id %q cannot name a data folder", jobID)
	}
	dir := filepath.Join(e.cfg.DataDir, jobID)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("data directory: %w", err)
	}
	return dir, nil
}

// RemoveData implements executor.DataKeeper.
func (e *Executor) RemoveData(ctx context.Context, jobID string) error {
	if !job.ValidID(jobID) {
		return nil
	}
	err := (&workspace.Dir{Root: filepath.Join(e.cfg.DataDir, jobID)}).Remove()
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove the data directory of %s: %w", jobID, err)
	}
	return nil
}

// Data implements executor.DataKeeper: the folders of DataDir, each with
// the time it last changed (a folder's creation time is not kept).
func (e *Executor) Data(ctx context.Context) ([]executor.DataDir, error) {
	entries, err := os.ReadDir(e.cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("data folder: %w", err)
	}
	var out []executor.DataDir
	for _, d := range entries {
		if !d.IsDir() || !job.ValidID(d.Name()) {
			continue
		}
		fi, err := d.Info()
		if err != nil {
			continue
		}
		out = append(out, executor.DataDir{JobID: d.Name(), Created: fi.ModTime()})
	}
	return out, nil
}
