package docker

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"time"

	"github.com/docker/docker/api/types/container"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/job"
)

// track notes a container an attempt runs in, for Usage.
func (e *Executor) track(id executor.AttemptID, c *live) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.running[id] = c
}

func (e *Executor) untrack(id executor.AttemptID) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.running, id)
}

// usageConcurrency bounds the stats calls made at once.
const usageConcurrency = 8

// Usage implements executor.UsageReader from the daemon's stats of each
// running attempt's container (one reading each, not a stream): CPU since
// the previous reading, memory in use (without the page cache) and the
// limit, network and block I/O since the container started, processes.
func (e *Executor) Usage(ctx context.Context) map[executor.AttemptID]*job.Usage {
	e.mu.Lock()
	running := make(map[executor.AttemptID]*live, len(e.running))
	for id, c := range e.running {
		running[id] = c
	}
	e.mu.Unlock()

	out := make(map[executor.AttemptID]*job.Usage, len(running))
	live := make(map[executor.AttemptID]bool, len(running))
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, usageConcurrency)
	for id, c := range running {
		live[id] = true
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			u := e.stats(ctx, id, c)
			if u != nil {
				mu.Lock()
				out[id] = u
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	e.cpu.Forget(live)
	return out
}

// stats reads one container's usage; nil when the daemon does not say.
func (e *Executor) stats(ctx context.Context, id executor.AttemptID, c *live) *job.Usage {
	rd, err := e.api.ContainerStatsOneShot(ctx, c.id)
	if err != nil {
		e.log.Debug("no stats of the container", "container", c.name, "err", err)
		return nil
	}
	defer rd.Body.Close()
	var s container.StatsResponse
	if err := json.NewDecoder(rd.Body).Decode(&s); err != nil {
		e.log.Debug("unreadable stats of the container", "container", c.name, "err", err)
		return nil
	}
	at := s.Read
	if at.IsZero() {
		at = time.Now()
	}
	if s.PidsStats.Current == 0 && s.MemoryStats.Usage == 0 && s.CPUStats.CPUUsage.TotalUsage == 0 {
		return nil // not running (any more): the daemon reports zeros
	}
	u := &job.Usage{ObservedAt: at.UTC()}
	u.CPUPercent = e.cpu.Percent(id, time.Duration(s.CPUStats.CPUUsage.TotalUsage), at, c.started)
	mem := s.MemoryStats.Usage
	// Like docker stats: the page cache can be given back, it is not the
	// job's (cgroup v2 calls it inactive_file, v1 total_inactive_file).
	for _, k := range []string{"inactive_file", "total_inactive_file"} {
		if v, ok := s.MemoryStats.Stats[k]; ok && v < mem {
			mem -= v
			break
		}
	}
	u.MemoryBytes = i64(mem)
	if s.MemoryStats.Limit > 0 {
		u.MemoryLimitBytes = i64(s.MemoryStats.Limit)
	}
	if s.Networks != nil {
		var rx, tx uint64
		for _, n := range s.Networks {
			rx += n.RxBytes
			tx += n.TxBytes
		}
		u.NetRxBytes, u.NetTxBytes = i64(rx), i64(tx)
	}
	var rd2, wr uint64
	for _, b := range s.BlkioStats.IoServiceBytesRecursive {
		switch strings.ToLower(b.Op) {
		case "read":
			rd2 += b.Value
		case "write":
			wr += b.Value
		}
	}
	u.BlockReadBytes, u.BlockWriteBytes = i64(rd2), i64(wr)
	u.Pids = i64(s.PidsStats.Current)
	return u
}

func i64(v uint64) *int64 {
	n := int64(min(v, 1<<62))
	return &n
}
