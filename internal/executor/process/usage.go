package process

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/job"
)

// What a process job uses is read from /proc, summed over the processes of
// its process group: CPU time (utime and stime of /proc/<pid>/stat),
// resident memory (/proc/<pid>/statm), block I/O (read_bytes and
// write_bytes of /proc/<pid>/io, which the worker may read for processes of
// its own user) and the number of processes. The jobs share the worker's
// cgroup, so its cgroup files cannot tell one job from another; network
// traffic and a memory limit are unknown.

// clockTicks is the kernel's USER_HZ, the unit of the CPU times in
// /proc/<pid>/stat: 100 on every Linux architecture the fleet runs on.
const clockTicks = 100

// Usage implements executor.UsageReader.
func (e *Executor) Usage(ctx context.Context) map[executor.AttemptID]*job.Usage {
	e.mu.Lock()
	byGroup := make(map[int]executor.AttemptID, len(e.running))
	started := make(map[executor.AttemptID]time.Time, len(e.running))
	for id, p := range e.running {
		byGroup[p.pgid] = id
		started[id] = p.started
	}
	e.mu.Unlock()
	if len(byGroup) == 0 {
		return nil
	}
	type sum struct {
		cpu                time.Duration
		rss, rd, wr, procs int64
		io                 bool
	}
	sums := map[executor.AttemptID]*sum{}
	now := time.Now()
	page := int64(os.Getpagesize())
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		stat, err := os.ReadFile(filepath.Join(p, "stat"))
		if err != nil {
			continue
		}
		pgid, cpu, ok := parseStat(stat)
		if !ok {
			continue
		}
		id, mine := byGroup[pgid]
		if !mine {
			continue
		}
		s := sums[id]
		if s == nil {
			s = &sum{}
			sums[id] = s
		}
		s.procs++
		s.cpu += cpu
		if statm, err := os.ReadFile(filepath.Join(p, "statm")); err == nil {
			if f := strings.Fields(string(statm)); len(f) > 1 {
				rss, _ := strconv.ParseInt(f[1], 10, 64)
				s.rss += rss * page
			}
		}
		if rd, wr, ok := readIO(filepath.Join(p, "io")); ok {
			s.rd += rd
			s.wr += wr
			s.io = true
		}
	}
	out := make(map[executor.AttemptID]*job.Usage, len(sums))
	live := map[executor.AttemptID]bool{}
	for id, s := range sums {
		live[id] = true
		u := &job.Usage{ObservedAt: now.UTC(), MemoryBytes: &s.rss, Pids: &s.procs}
		u.CPUPercent = e.cpu.Percent(id, s.cpu, now, started[id])
		if s.io {
			u.BlockReadBytes, u.BlockWriteBytes = &s.rd, &s.wr
		}
		out[id] = u
	}
	e.cpu.Forget(live)
	return out
}

// parseStat reads the process group and the CPU time (user and system) of
// a /proc/<pid>/stat line. The command name, in parentheses, may hold
// spaces and parentheses: fields are counted from the last ")".
func parseStat(stat []byte) (pgid int, cpu time.Duration, ok bool) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(stat[i+1:]))
	// After the name: state(3) ppid(4) pgrp(5) ... utime(14) stime(15).
	if len(f) < 13 {
		return 0, 0, false
	}
	pgid, err1 := strconv.Atoi(f[2])
	ut, err2 := strconv.ParseInt(f[11], 10, 64)
	st, err3 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return 0, 0, false
	}
	return pgid, time.Duration(ut+st) * time.Second / clockTicks, true
}

// readIO reads the bytes a process read from and wrote to storage.
func readIO(path string) (rd, wr int64, ok bool) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		k, v, found := strings.Cut(sc.Text(), ": ")
		if !found {
			continue
		}
		x, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "read_bytes":
			rd, n = x, n+1
		case "write_bytes":
			wr, n = x, n+1
		}
	}
	return rd, wr, n == 2
}
