package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fleet-dev/fleet/internal/capacity/monitor"
	"github.com/fleet-dev/fleet/job"
)

func init() {
	var pool string
	poolFlag := func(fs *flag.FlagSet) { fs.StringVar(&pool, "pool", "", "only this pool") }
	commands = append(commands,
		&command{
			name: "capacity", args: "[--pool P]",
			help: "Show each pool's slots, CPU, memory and GPUs, summed over its live workers\n" +
				"(-o json: an array of pool documents with the heartbeat's field names).",
			example: "fleetctl capacity\n" +
				"fleetctl capacity --pool gpu -o json",
			flags: poolFlag,
			run: func(ctx context.Context, e *env, fs *flag.FlagSet, args []string) error {
				var o monitor.Overview
				if err := e.get(ctx, "/v1/capacity", pool, &o); err != nil {
					return err
				}
				if e.json() {
					return writeJSON(e.stdout, o.Pools)
				}
				tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, "POOL\tWORKERS\tSLOTS USED/TOTAL\tCPU RESERVED/TOTAL\tMEMORY RESERVED/TOTAL\tGPUS")
				for _, p := range o.Pools {
					if p.Paused {
						p.Pool += " (paused)"
					}
					fmt.Fprintf(tw, "%s\t%d\t%d/%d\t%s\t%s\t%d/%d\n", p.Pool, p.Workers, p.Slots.Used, p.Slots.Total,
						amount(p.CPUMilli, job.FormatCPU), amount(p.MemoryBytes, job.FormatMemory), p.GPUs.Reserved, p.GPUs.Total)
				}
				if len(o.Pools) == 0 {
					fmt.Fprintln(tw, "(no live workers)")
				}
				return tw.Flush()
			},
		},
		&command{
			name: "workers", args: "[--pool P]",
			help: "List the live workers (-o json: an array of their capacity heartbeats).",
			example: "fleetctl workers --pool default\n" +
				"fleetctl --http-addr dispatcher:8080 --api-token-file api.token workers -o json",
			flags: poolFlag,
			run: func(ctx context.Context, e *env, fs *flag.FlagSet, args []string) error {
				var hbs []*job.Heartbeat
				if err := e.get(ctx, "/v1/workers", pool, &hbs); err != nil {
					return err
				}
				if e.json() {
					return writeJSON(e.stdout, hbs)
				}
				tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, "WORKER\tPOOL\tBACKEND\tHEALTH\tSLOTS USED/TOTAL\tCPU\tMEMORY\tRUNNING\tSEEN")
				for _, h := range hbs {
					var running []string
					for _, r := range h.Running {
						running = append(running, fmt.Sprintf("%s#%d", r.JobID, r.Attempt))
					}
					run := strings.Join(running, ",")
					if len(run) > 40 {
						run = run[:37] + "..."
					}
					if run == "" {
						run = "-"
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d/%d\t%s\t%s\t%s\t%s ago\n", h.WorkerID, h.Pool, h.Backend, h.Health,
						h.Slots.Used, h.Slots.Total, amount(h.CPUMilli, job.FormatCPU), amount(h.MemoryBytes, job.FormatMemory),
						run, time.Since(h.ObservedAt).Round(100*time.Millisecond))
				}
				if len(hbs) == 0 {
					fmt.Fprintln(tw, "(no live workers)")
				}
				return tw.Flush()
			},
		},
	)
}

func amount(a job.Amount, format func(int64) string) string {
	if a.Total == nil {
		return format(a.Reserved) + "/?"
	}
	return format(a.Reserved) + "/" + format(*a.Total)
}

// get reads a document from the dispatcher's HTTP API.
func (e *env) get(ctx context.Context, path, pool string, v any) error {
	url := e.httpAddr
	if !strings.Contains(url, "://") {
		url = "http://" + url
	}
	url += path
	if pool != "" {
		url += "?pool=" + pool
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return exit(exitUsage, "%v", err)
	}
	e.authorize(req)
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		return exit(exitFleet, "dispatcher at %s: %v", e.httpAddr, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 32<<20))
	if err != nil {
		return exit(exitFleet, "dispatcher at %s: %v", e.httpAddr, err)
	}
	if resp.StatusCode != http.StatusOK {
		var apiErr struct{ Error string }
		_ = json.Unmarshal(body, &apiErr)
		return exit(exitFleet, "dispatcher at %s: %s: %s", e.httpAddr, resp.Status, apiErr.Error)
	}
	return json.Unmarshal(body, v)
}

// authorize adds the API token, when there is one.
func (e *env) authorize(req *http.Request) {
	if e.token != "" {
		req.Header.Set("Authorization", "Bearer "+e.token)
	}
}
