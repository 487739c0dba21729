package docker

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/volume"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/workspace"
	"github.com/fleet-dev/fleet/job"
)

// A job that asks for a data directory (persist) gets a named volume,
// fleet-data-<job>-<hash>, labelled with its job id, mounted at /fleet/data
// in every attempt's container. The volume is backed by a folder of
// DataDir (the local driver's bind option), made writable by any user, so
// that a container running as a user of its own can write to it; like the
// workspaces, DataDir must have the same path on the worker and the Docker
// host. The volume lives on one Docker host: an attempt that another host
// runs starts with an empty one.

// dataName names a job's data volume: a DNS label from the job id and a
// hash of all of it, so that distinct ids stay distinct.
func dataName(tenant, jobID string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(executor.JobPath(tenant, jobID)))
	return fmt.Sprintf("fleet-data-%s-%08x", job.DNSLabel(jobID, 40), h.Sum32())
}

// dataVolume makes the job's data volume, if it has none yet, and returns
// its name.
func (e *Executor) dataVolume(ctx context.Context, tenant, jobID string) (string, error) {
	name := dataName(tenant, jobID)
	dir := filepath.Join(e.cfg.DataDir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("data directory: %w", err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		return "", fmt.Errorf("data directory: %w", err)
	}
	_, err := e.api.VolumeCreate(context.WithoutCancel(ctx), volume.CreateOptions{
		Name: name, Driver: "local",
		DriverOpts: map[string]string{"type": "none", "o": "bind", "device": dir},
		Labels:     dataLabels(tenant, jobID),
	})
	if err != nil {
		return "", fmt.Errorf("create data volume %s: %w", name, err)
	}
	return name, nil
}

// RemoveData implements executor.DataKeeper: it removes the job's data
// volume and its folder.
func (e *Executor) RemoveData(ctx context.Context, tenant, jobID string) error {
	name := dataName(tenant, jobID)
	if err := e.api.VolumeRemove(ctx, name, false); err != nil && !cerrdefs.IsNotFound(err) {
		return fmt.Errorf("remove data volume %s: %w", name, err)
	}
	if err := (&workspace.Dir{Root: filepath.Join(e.cfg.DataDir, name)}).Remove(); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove data directory of %s: %w", name, err)
	}
	return nil
}

// Data implements executor.DataKeeper: the data volumes on the Docker host
// whose folders are in this executor's DataDir.
func (e *Executor) Data(ctx context.Context) ([]executor.DataDir, error) {
	list, err := e.api.VolumeList(ctx, volume.ListOptions{Filters: filters.NewArgs(filters.Arg("label", LabelDataJobID))})
	if err != nil {
		return nil, fmt.Errorf("list data volumes: %w", err)
	}
	var out []executor.DataDir
	for _, v := range list.Volumes {
		d := executor.DataDir{Tenant: v.Labels[LabelTenant], JobID: v.Labels[LabelDataJobID]}
		// Another worker's on the same host is for that worker to sweep:
		// its folder is in its own DataDir.
		if d.JobID == "" || v.Name != dataName(d.Tenant, d.JobID) || filepath.Dir(v.Options["device"]) != e.cfg.DataDir {
			continue
		}
		d.Created, _ = time.Parse(time.RFC3339, v.CreatedAt)
		out = append(out, d)
	}
	return out, nil
}

func dataLabels(tenant, jobID string) map[string]string {
	l := map[string]string{LabelManaged: "true", LabelDataJobID: jobID}
	if t := executor.TenantKey(tenant); t != "" {
		l[LabelTenant] = t
	}
	return l
}
