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
func (e *Executor) dataDir(tenant, jobID string) (string, error) {
	if !job.ValidID(jobID) || (tenant != "" && !job.ValidTenant(tenant)) {
		return "", fmt.Errorf("job id %q cannot name a data folder", jobID)
	}
	dir := filepath.Join(e.cfg.DataDir, filepath.FromSlash(executor.JobPath(tenant, jobID)))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("data directory: %w", err)
	}
	return dir, nil
}

// RemoveData implements executor.DataKeeper.
func (e *Executor) RemoveData(ctx context.Context, tenant, jobID string) error {
	if !job.ValidID(jobID) || (tenant != "" && !job.ValidTenant(tenant)) {
		return nil
	}
	err := (&workspace.Dir{Root: filepath.Join(e.cfg.DataDir, filepath.FromSlash(executor.JobPath(tenant, jobID)))}).Remove()
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove the data directory of %s: %w", jobID, err)
	}
	return nil
}

// Data implements executor.DataKeeper: the folders of DataDir, each with
// the time it last changed (a folder's creation time is not kept).
func (e *Executor) Data(ctx context.Context) ([]executor.DataDir, error) {
	out, err := tenantDataDirs(e.cfg.DataDir, "")
	if err != nil {
		return nil, fmt.Errorf("data folder: %w", err)
	}
	tenants, _ := os.ReadDir(filepath.Join(e.cfg.DataDir, executor.TenantsDir))
	for _, t := range tenants {
		if t.IsDir() && job.ValidTenant(t.Name()) {
			more, _ := tenantDataDirs(filepath.Join(e.cfg.DataDir, executor.TenantsDir, t.Name()), t.Name())
			out = append(out, more...)
		}
	}
	return out, nil
}

// tenantDataDirs lists the jobs' folders of one tenant's folder.
func tenantDataDirs(dir, tenant string) ([]executor.DataDir, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
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
		out = append(out, executor.DataDir{Tenant: tenant, JobID: d.Name(), Created: fi.ModTime()})
	}
	return out, nil
}
