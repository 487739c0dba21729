package docker

import (
	"context"
	"strings"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/system"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/hostinfo"
	"github.com/fleet-dev/fleet/job"
)

// Capacity reports what the Docker host holds: its CPUs and memory, the
// GPUs of the configuration, the fleet's containers on it by state (those
// of every worker sharing the host), and the host itself. A daemon that
// does not answer makes the backend unhealthy, with the reason; Capacity
// itself does not fail.
func (e *Executor) Capacity(ctx context.Context) (*executor.Capacity, error) {
	info, err := e.api.Info(ctx)
	if err != nil {
		return &executor.Capacity{GPUs: e.gpuTotal(), Health: job.HealthUnhealthy, Reason: "Docker daemon: " + err.Error()}, nil
	}
	cpu, mem := int64(info.NCPU)*1000, info.MemTotal
	c := &executor.Capacity{CPUMilli: &cpu, MemoryBytes: &mem, GPUs: e.gpuTotal(), Health: job.HealthHealthy, Host: e.host(info)}
	list, err := e.api.ContainerList(ctx, container.ListOptions{All: true,
		Filters: filters.NewArgs(filters.Arg("label", LabelManaged+"=true"))})
	if err != nil {
		c.Health, c.Reason = job.HealthDegraded, "Docker daemon cannot list containers: "+err.Error()
		return c, nil
	}
	c.Containers = countContainers(list)
	return c, nil
}

// countContainers counts containers by state; an unhealthy one counts as
// running and unhealthy.
func countContainers(list []container.Summary) *job.ContainerCounts {
	var n job.ContainerCounts
	for _, c := range list {
		switch c.State {
		case container.StateRunning, container.StatePaused:
			n.Running++
			if strings.Contains(c.Status, "(unhealthy)") {
				n.Unhealthy++
			}
		case container.StateCreated, container.StateRestarting:
			n.Starting++
		case container.StateExited, container.StateDead, container.StateRemoving:
			n.Exited++
		}
	}
	return &n
}

// host describes the Docker host. Its load and memory in use come from
// /proc when the daemon is local (on its socket), which they are for a
// worker in a container too: neither is namespaced.
func (e *Executor) host(info system.Info) *job.Host {
	h := &job.Host{
		Hostname: info.Name, OS: info.OperatingSystem, Arch: info.Architecture,
		KernelVersion: info.KernelVersion, BackendVersion: "docker " + info.ServerVersion,
		Cores: info.NCPU, MemoryTotalBytes: info.MemTotal,
	}
	if !strings.HasPrefix(e.api.DaemonHost(), "unix://") {
		return h
	}
	h.Load1, h.Load5, h.Load15, _ = hostinfo.LoadAvg()
	if _, avail, ok := hostinfo.Memory(); ok && avail <= h.MemoryTotalBytes {
		h.MemoryUsedBytes = h.MemoryTotalBytes - avail
	}
	return h
}
