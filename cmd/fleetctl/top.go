package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fleet-dev/fleet/job"
)

// Live usage comes from the workers' heartbeats, which the dispatcher's
// HTTP API serves (/v1/workers): each running attempt with what its backend
// reports it uses.

func init() {
	var pool, sortBy string
	commands = append(commands, &command{
		name: "top", args: "[--pool P] [--sort cpu|memory|age]",
		help: "List the running attempts with what each uses now (CPU, memory, network and block I/O, processes),\n" +
			"from the workers' heartbeats (-o json: an array of attempts with their worker and usage).",
		example: "fleetctl top\n" +
			"fleetctl top --pool gpu --sort memory",
		flags: func(fs *flag.FlagSet) {
			fs.StringVar(&pool, "pool", "", "only this pool")
			fs.StringVar(&sortBy, "sort", "cpu", "order: cpu, memory or age")
		},
		run: func(ctx context.Context, e *env, fs *flag.FlagSet, args []string) error {
			if !slices.Contains([]string{"cpu", "memory", "age"}, sortBy) {
				return exit(exitUsage, "--sort %q: use cpu, memory or age", sortBy)
			}
			var hbs []*job.Heartbeat
			if err := e.get(ctx, "/v1/workers", pool, &hbs); err != nil {
				return err
			}
			rows := running(hbs)
			sortRows(rows, sortBy)
			if e.json() {
				return writeJSON(e.stdout, rows)
			}
			return printTop(e.stdout, rows)
		},
	})
}

// topRow is one running attempt.
type topRow struct {
	JobID     string     `json:"job_id"`
	Attempt   int        `json:"attempt"`
	Pool      string     `json:"pool"`
	WorkerID  string     `json:"worker_id"`
	Backend   string     `json:"backend"`
	StartedAt time.Time  `json:"started_at"`
	CPUMilli  int64      `json:"cpu_milli"`
	Memory    int64      `json:"memory_bytes"`
	Usage     *job.Usage `json:"usage,omitempty"`
}

func running(hbs []*job.Heartbeat) []topRow {
	var rows []topRow
	for _, h := range hbs {
		for _, r := range h.Running {
			rows = append(rows, topRow{JobID: r.JobID, Attempt: r.Attempt, Pool: h.Pool, WorkerID: h.WorkerID, Backend: h.Backend,
				StartedAt: r.StartedAt, CPUMilli: r.CPUMilli, Memory: r.MemoryBytes, Usage: r.Usage})
		}
	}
	return rows
}

func sortRows(rows []topRow, by string) {
	key := func(r topRow) float64 {
		switch u := r.Usage; {
		case by == "age":
			return -float64(r.StartedAt.UnixNano())
		case u == nil:
			return -1
		case by == "memory" && u.MemoryBytes != nil:
			return float64(*u.MemoryBytes)
		case by == "cpu" && u.CPUPercent != nil:
			return *u.CPUPercent
		}
		return -1
	}
	slices.SortStableFunc(rows, func(a, b topRow) int {
		ka, kb := key(a), key(b)
		switch {
		case ka > kb:
			return -1
		case ka < kb:
			return 1
		}
		return strings.Compare(a.JobID, b.JobID)
	})
}

func printTop(w io.Writer, rows []topRow) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "JOB\tATTEMPT\tWORKER\tRUNNING\tCPU\tMEMORY\tNET RX/TX\tBLOCK R/W\tPIDS")
	for _, r := range rows {
		cpu, mem, net, blk, pids := usageColumns(r.Usage)
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.JobID, r.Attempt, r.WorkerID,
			time.Since(r.StartedAt).Round(time.Second), cpu, mem, net, blk, pids)
	}
	if len(rows) == 0 {
		fmt.Fprintln(tw, "(nothing runs)")
	}
	return tw.Flush()
}

// usageColumns writes a usage for people; "?" where it is unknown.
func usageColumns(u *job.Usage) (cpu, mem, net, blk, pids string) {
	cpu, mem, net, blk, pids = "?", "?", "?", "?", "?"
	if u == nil {
		return
	}
	if u.CPUPercent != nil {
		cpu = fmt.Sprintf("%.1f%%", *u.CPUPercent)
	}
	if u.MemoryBytes != nil {
		mem = bytesOf(*u.MemoryBytes)
		if u.MemoryLimitBytes != nil {
			mem += "/" + bytesOf(*u.MemoryLimitBytes)
		}
	}
	if u.NetRxBytes != nil && u.NetTxBytes != nil {
		net = bytesOf(*u.NetRxBytes) + "/" + bytesOf(*u.NetTxBytes)
	}
	if u.BlockReadBytes != nil && u.BlockWriteBytes != nil {
		blk = bytesOf(*u.BlockReadBytes) + "/" + bytesOf(*u.BlockWriteBytes)
	}
	if u.Pids != nil {
		pids = fmt.Sprint(*u.Pids)
	}
	return
}

// bytesOf writes a size in binary units, one decimal, as the table does.
func bytesOf(b int64) string { return job.FormatSize(b, "") }

// attemptUsage finds what a running attempt uses in its pool's heartbeats;
// nil when the API cannot be reached or no worker reports it.
func attemptUsage(ctx context.Context, e *env, pool, jobID string, attempt int) (*job.Usage, string) {
	var hbs []*job.Heartbeat
	if err := e.get(ctx, "/v1/workers", pool, &hbs); err != nil {
		return nil, ""
	}
	for _, h := range hbs {
		for _, r := range h.Running {
			if r.JobID == jobID && r.Attempt == attempt {
				return r.Usage, h.WorkerID
			}
		}
	}
	return nil, ""
}
