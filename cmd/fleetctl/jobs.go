package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/job"
)

func init() {
	var file string
	var wait bool
	var inputs inputFiles
	commands = append(commands,
		&command{
			name: "submit", args: "-f FILE [--input NAME=@FILE] [--wait]",
			help: "Submit an execution request (-f - reads standard input).\n" +
				"Prints the job id. With --wait, follows the job and exits 0 only if it succeeds;\n" +
				"with --wait -o json, prints the result document. Each --input NAME=@FILE uploads\n" +
				"FILE to the fleet's object store first and adds it to the request's input_refs as NAME.",
			example: "fleetctl submit -f job.json                                   # prints the job id\n" +
				"echo '{\"command\": [\"sh\", \"-c\", \"echo hi\"]}' | fleetctl submit -f - --wait\n" +
				"fleetctl submit -f job.json --input data=@data.csv --wait -o json\n" +
				"fleetctl --tenant acme --nats-nkey acme.nk submit -f job.json      # global flags before or after the command",
			flags: func(fs *flag.FlagSet) {
				fs.StringVar(&file, "f", "", "request file, or - for standard input")
				fs.BoolVar(&wait, "wait", false, "follow the job until it ends")
				fs.Var(&inputs, "input", "NAME=@FILE: upload FILE and give it to the job as input NAME (repeatable)")
			},
			run: func(ctx context.Context, e *env, fs *flag.FlagSet, args []string) error {
				return submit(ctx, e, file, wait, inputs)
			},
		},
		&command{
			name: "status", args: "ID [ID...]",
			help: "Show a job's state, and its result once it has one (several ids: a table).",
			example: "fleetctl status tour-1\n" +
				"fleetctl status tour-1 tour-2 tour-3 -o json",
			run: func(ctx context.Context, e *env, fs *flag.FlagSet, args []string) error {
				switch len(args) {
				case 0:
					return exit(exitUsage, "expected a job id")
				case 1:
					return status(ctx, e, args[0])
				}
				return statusTable(ctx, e, args)
			},
		},
		&command{
			name: "watch", args: "ID",
			help: "Follow a job's lifecycle events until it ends (-o json: one event per line).",
			example: "fleetctl watch tour-1\n" +
				"fleetctl watch tour-1 -o json | jq -r .type",
			run: func(ctx context.Context, e *env, fs *flag.FlagSet, args []string) error {
				id, err := oneID(args)
				if err != nil {
					return err
				}
				c, err := e.client(ctx)
				if err != nil {
					return err
				}
				final, err := watch(ctx, e, c, id, e.stdout)
				if err != nil {
					return err
				}
				return finalExit(final)
			},
		},
		&command{
			name: "cancel", args: "ID",
			help:    "Cancel a job: a queued job never starts, a running one is stopped.",
			example: "fleetctl cancel tour-1",
			run: func(ctx context.Context, e *env, fs *flag.FlagSet, args []string) error {
				id, err := oneID(args)
				if err != nil {
					return err
				}
				c, err := e.client(ctx)
				if err != nil {
					return err
				}
				r, err := c.Cancel(ctx, id)
				if err != nil {
					return err
				}
				if e.json() {
					return writeJSON(e.stdout, r)
				}
				fmt.Fprintf(e.stdout, "%s: %s (state %s)\n", r.JobID, r.Message, r.State)
				return nil
			},
		},
	)
}

func oneID(args []string) (string, error) {
	if len(args) != 1 {
		return "", exit(exitUsage, "expected one job id, got %d arguments", len(args))
	}
	return args[0], nil
}

func submit(ctx context.Context, e *env, file string, wait bool, inputs inputFiles) error {
	if file == "" {
		return exit(exitUsage, "submit needs -f FILE (or -f - for standard input)")
	}
	var data []byte
	var err error
	if file == "-" {
		data, err = io.ReadAll(os.Stdin)
	} else {
		data, err = os.ReadFile(file)
	}
	if err != nil {
		return exit(exitUsage, "read request: %v", err)
	}
	c, err := e.client(ctx)
	if err != nil {
		return err
	}
	if data, err = withInputs(ctx, c, data, inputs); err != nil {
		return err
	}
	sub, err := c.SubmitJSON(ctx, data)
	var rej *client.RejectedError
	if errors.As(err, &rej) {
		if e.json() && !wait {
			_ = writeJSON(e.stdout, map[string]string{"job_id": rej.JobID, "state": "rejected", "error": rej.Reason})
		}
		return exit(exitUsage, "request rejected: %s%s", rej.Reason, workersHint(rej.Reason, data))
	}
	if err != nil {
		return err
	}
	if sub.Warning != "" {
		fmt.Fprintf(e.stderr, "warning: %s%s\n", sub.Warning, workersHint(sub.Warning, data))
	}
	switch {
	case sub.Duplicate && wait:
		fmt.Fprintf(e.stderr, "job %s already exists (%s): not submitted again; following it\n", sub.JobID, sub.State)
	case sub.Duplicate:
		fmt.Fprintf(e.stderr, "job %s already exists (%s): not submitted again\n", sub.JobID, sub.State)
	case wait && !e.json():
		fmt.Fprintf(e.stdout, "job %s submitted\n", sub.JobID)
	}
	if !wait {
		if e.json() {
			return writeJSON(e.stdout, sub)
		}
		fmt.Fprintln(e.stdout, sub.JobID)
		return nil
	}
	// In JSON mode the events go nowhere: stdout is for the result alone.
	events := e.stdout
	if e.json() {
		events = io.Discard
	}
	final, err := watch(ctx, e, c, sub.JobID, events)
	if err != nil {
		return err
	}
	if final.Type == job.EventRejected {
		return exit(exitUsage, "rejected: %s%s", final.Message, workersHint(final.Message, data))
	}
	res, err := c.Result(ctx, sub.JobID)
	if err != nil {
		return err
	}
	if e.json() {
		if err := writeJSON(e.stdout, res); err != nil {
			return err
		}
	} else {
		printResult(e.stdout, res)
	}
	return finalExit(final)
}

// workersHint is what to add to an admission's refusal or warning that no
// live worker of the request's pool could run it: how to see that pool's
// workers.
func workersHint(reason string, request []byte) string {
	if !strings.Contains(reason, "has no live worker") && !strings.Contains(reason, "no worker of pool") {
		return ""
	}
	var r struct {
		Pool string `json:"pool"`
	}
	_ = json.Unmarshal(request, &r)
	pool := r.Pool
	if pool == "" {
		pool = job.DefaultPool
	}
	return fmt.Sprintf(" (list the pool's live workers, and what each has, with: fleetctl workers --pool %s)", pool)
}

// watch prints a job's events until its final one, and returns that one.
func watch(ctx context.Context, e *env, c *client.Client, id string, w io.Writer) (*job.Event, error) {
	for ev, err := range c.Events(ctx, id) {
		if err != nil {
			if ctx.Err() != nil {
				return nil, exit(exitFleet, "interrupted")
			}
			return nil, err
		}
		if e.json() {
			if err := json.NewEncoder(w).Encode(ev); err != nil {
				return nil, err
			}
		} else {
			printEvent(w, ev)
		}
		if ev.Type.Final() {
			return ev, nil
		}
	}
	return nil, exit(exitFleet, "event stream ended early")
}

func finalExit(final *job.Event) error {
	switch final.Type {
	case job.EventSucceeded:
		return nil
	case job.EventRejected:
		return &exitError{code: exitUsage, err: errors.New("")}
	}
	return &exitError{code: exitJobFail, err: errors.New("")}
}

func printEvent(w io.Writer, ev *job.Event) {
	t := ev.Time.Local().Format("15:04:05.000")
	if ev.Type == job.EventLog {
		line := fmt.Sprintf("%s  %-15s %s", t, "log "+ev.Stream, ev.Line)
		if ev.Message != "" {
			line += fmt.Sprintf("\n%s  %-15s (%s)", t, "", ev.Message)
		}
		fmt.Fprintln(w, line)
		return
	}
	fmt.Fprintf(w, "%s  %s\n", t, eventText(ev))
}

// eventText says what a lifecycle event other than a log line says: its
// type, and what came with it.
func eventText(ev *job.Event) string {
	var b strings.Builder
	switch ev.Type {
	case job.EventQueued:
		fmt.Fprintf(&b, "%-15s pool %s", ev.Type, ev.Pool)
	case job.EventStarted:
		fmt.Fprintf(&b, "%-15s attempt %d on %s (%s)", ev.Type, ev.Attempt, ev.WorkerID, ev.Backend)
	case job.EventHeartbeat:
		fmt.Fprintf(&b, "%-15s attempt %d", ev.Type, ev.Attempt)
		if ev.Phase != "" {
			fmt.Fprintf(&b, " %s", ev.Phase)
		}
	default:
		fmt.Fprintf(&b, "%-15s", ev.Type)
		// A job that ends before an attempt (cancelled while queued, a
		// run's node its rule did not let run) has a failure only.
		var parts []string
		if ev.Attempt > 0 {
			parts = append(parts, fmt.Sprintf("attempt %d", ev.Attempt))
		}
		if ev.ExitCode != nil {
			parts = append(parts, fmt.Sprintf("exit %d", *ev.ExitCode))
		}
		if ev.Failure != nil {
			parts = append(parts, fmt.Sprintf("%s/%s", ev.Failure.Class, ev.Failure.Code))
		}
		if len(parts) > 0 {
			b.WriteString(" " + strings.Join(parts, ", "))
		}
	}
	if ev.Message != "" {
		fmt.Fprintf(&b, ": %s", ev.Message)
	}
	return b.String()
}

func printResult(w io.Writer, r *job.Result) {
	fmt.Fprintf(w, "\nresult: %s after %d attempt(s)", r.Status, r.Attempts)
	if r.ExitCode != nil {
		fmt.Fprintf(w, ", exit code %d", *r.ExitCode)
	}
	if r.StartedAt != nil {
		fmt.Fprintf(w, ", ran %s", r.FinishedAt.Sub(*r.StartedAt).Round(time.Millisecond))
	}
	fmt.Fprintln(w)
	if r.Failure != nil {
		fmt.Fprintf(w, "failure: %s (%s): %s\n", r.Failure.Class, r.Failure.Code, r.Failure.Message)
	}
	names := make([]string, 0, len(r.Outputs))
	for n := range r.Outputs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "output %s:\n%s", n, indent(r.Outputs[n]))
	}
	printArtifacts(w, r)
	if r.Stderr != "" && r.Status != job.StatusSucceeded {
		fmt.Fprintf(w, "stderr (tail):\n%s", indent(r.Stderr))
	}
}

func indent(s string) string {
	if s == "" {
		return ""
	}
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return "  " + strings.Join(lines, "\n  ") + "\n"
}

func status(ctx context.Context, e *env, id string) error {
	c, err := e.client(ctx)
	if err != nil {
		return err
	}
	s, err := c.Status(ctx, id)
	if err != nil {
		if errors.Is(err, client.ErrNotFound) {
			return exit(exitNotFound, "no job %s", id)
		}
		return err
	}
	// While it runs, what it uses, from its worker's heartbeat.
	var usage *job.Usage
	if s.Job.State == job.StateRunning {
		usage, _ = attemptUsage(ctx, e, s.Job.Pool, s.Job.ID, s.Job.Attempt)
	}
	if e.json() {
		return writeJSON(e.stdout, struct {
			*job.StatusReply
			Usage *job.Usage `json:"usage,omitempty"`
		}{s, usage})
	}
	j := s.Job
	fmt.Fprintf(e.stdout, "job:       %s\nstate:     %s\npool:      %s\n", j.ID, j.State, j.Pool)
	if j.Attempt > 0 {
		fmt.Fprintf(e.stdout, "attempt:   %d of %d", j.Attempt, j.MaxAttempts)
		if j.WorkerID != "" {
			fmt.Fprintf(e.stdout, " (worker %s, %s)", j.WorkerID, j.Backend)
		}
		fmt.Fprintln(e.stdout)
	}
	fmt.Fprintf(e.stdout, "submitted: %s\n", j.SubmittedAt.Local().Format(time.RFC3339))
	if j.NextAttemptAt != nil {
		fmt.Fprintf(e.stdout, "next try:  %s\n", j.NextAttemptAt.Local().Format(time.RFC3339))
	}
	if j.Failure != nil {
		fmt.Fprintf(e.stdout, "failure:   %s (%s): %s\n", j.Failure.Class, j.Failure.Code, j.Failure.Message)
	}
	if j.Adoptions > 0 {
		fmt.Fprintf(e.stdout, "adopted:   %d time(s)\n", j.Adoptions)
	}
	if usage != nil {
		cpu, mem, net, blk, pids := usageColumns(usage)
		fmt.Fprintf(e.stdout, "usage:     cpu %s, memory %s, net rx/tx %s, block r/w %s, pids %s (at %s)\n",
			cpu, mem, net, blk, pids, usage.ObservedAt.Local().Format(time.TimeOnly))
	}
	if s.Result != nil {
		printResult(e.stdout, s.Result)
	}
	return nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// statusTable shows several jobs, one line each.
func statusTable(ctx context.Context, e *env, ids []string) error {
	c, err := e.client(ctx)
	if err != nil {
		return err
	}
	var all []*client.Status
	missing := 0
	for _, id := range ids {
		s, err := c.Status(ctx, id)
		if errors.Is(err, client.ErrNotFound) {
			missing++
			s = &client.Status{Job: &job.Record{ID: id, State: "unknown"}}
		} else if err != nil {
			return err
		}
		all = append(all, s)
	}
	if e.json() {
		return writeJSON(e.stdout, all)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "JOB\tSTATE\tATTEMPTS\tEXIT\tRAN\tWORKER\tFAILURE")
	for _, s := range all {
		j, exitCode, ran, failure := s.Job, "-", "-", "-"
		if r := s.Result; r != nil {
			if r.ExitCode != nil {
				exitCode = fmt.Sprint(*r.ExitCode)
			}
			if r.StartedAt != nil {
				ran = r.FinishedAt.Sub(*r.StartedAt).Round(time.Millisecond).String()
			}
		}
		if j.Failure != nil {
			failure = fmt.Sprintf("%s/%s: %s", j.Failure.Class, j.Failure.Code, j.Failure.Message)
		}
		worker := j.WorkerID
		if worker == "" {
			worker = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", j.ID, j.State, j.Attempt, exitCode, ran, worker, failure)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if missing > 0 {
		return exit(exitNotFound, "%d of %d jobs not found", missing, len(ids))
	}
	return nil
}
