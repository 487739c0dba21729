package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/job"
)

func init() {
	var file string
	var wait bool
	commands = append(commands, &command{
		name: "run",
		args: "submit -f FILE [--wait] | show|watch|cancel|retry RUN | list",
		help: "Submit and follow runs: graphs of jobs submitted at once.\n" +
			"Each node of a run is a job, RUN:NODE (RUN:NODE:K when a retry runs it again in\n" +
			"round K), queued once the nodes it comes after have ended as its when rule asks.\n" +
			"  run submit -f FILE   submit a run (-f - reads standard input): prints its id and\n" +
			"                       node count; a refused run, each problem, by node and field,\n" +
			"                       and exits 2. --wait follows the run to its end and exits 0\n" +
			"                       only if it succeeds (-o json: the end's summary)\n" +
			"  run show RUN         its state, round, and each node's state, job, and the nodes it\n" +
			"                       waits for or the code it failed with (-o json: the run's view)\n" +
			"  run watch RUN        its nodes' events as they come (a job queued, started, ended)\n" +
			"                       and its end; exits 0 only if it succeeds (-o json: one per line)\n" +
			"  run list             the tenant's runs still kept, oldest first\n" +
			"  run cancel RUN       every node that has not ended ends cancelled, and the run with them\n" +
			"  run retry RUN        a run that ended without succeeding runs again, as its next round,\n" +
			"                       the nodes that failed or were cancelled and every node after them;\n" +
			"                       the others keep their jobs and outputs",
		example: "fleetctl run submit -f run.json                 # prints: run ID submitted: N nodes\n" +
			"fleetctl run submit -f run.json --wait -o json   # the end's summary, each node's state and job\n" +
			"fleetctl run show nightly-etl\n" +
			"fleetctl run watch nightly-etl\n" +
			"fleetctl run list\n" +
			"fleetctl run cancel nightly-etl\n" +
			"fleetctl run retry nightly-etl",
		verbs: []string{"submit", "show", "watch", "list", "cancel", "retry"},
		flags: func(fs *flag.FlagSet) {
			fs.StringVar(&file, "f", "", "the run, a JSON file, or - for standard input (run submit)")
			fs.BoolVar(&wait, "wait", false, "follow the run until it ends (run submit)")
		},
		run: func(ctx context.Context, e *env, fs *flag.FlagSet, args []string) error {
			if len(args) == 0 {
				return exit(exitUsage, "run needs submit, show, watch, list, cancel or retry")
			}
			verb, rest := args[0], args[1:]
			if verb != "submit" && (file != "" || wait) {
				return exit(exitUsage, "-f and --wait are run submit's; to follow a run, use fleetctl run watch RUN")
			}
			switch verb {
			case "submit":
				if len(rest) != 0 {
					return exit(exitUsage, "run submit takes the run with -f FILE, not %q", rest[0])
				}
				return runSubmit(ctx, e, file, wait)
			case "list":
				if len(rest) != 0 {
					return exit(exitUsage, "run list takes no run")
				}
				return runList(ctx, e)
			case "show", "watch", "cancel", "retry":
			default:
				return exit(exitUsage, "run needs submit, show, watch, list, cancel or retry, not %q", verb)
			}
			if len(rest) != 1 {
				return exit(exitUsage, "run %s needs one run id, got %d arguments", verb, len(rest))
			}
			id := rest[0]
			if r, _, _, ok := job.ParseRunJobID(id); ok {
				return exit(exitUsage, "%s is the job of a node of run %s: fleetctl status %s shows the job, fleetctl run %s %s the run",
					id, r, id, verb, r)
			}
			if !job.ValidRunID(id) {
				return exit(exitUsage, "%q is not a run id: 1 to 63 characters of [A-Za-z0-9_-]", id)
			}
			c, err := e.client(ctx)
			if err != nil {
				return err
			}
			switch verb {
			case "show":
				err = runShow(ctx, e, c, id)
			case "watch":
				err = runWatch(ctx, e, c, id)
			case "cancel":
				err = runCancel(ctx, e, c, id)
			case "retry":
				err = runRetry(ctx, e, c, id)
			}
			if errors.Is(err, client.ErrNotFound) {
				return exit(exitNotFound, "tenant %s has no run %s: fleetctl run list lists its runs (--tenant acts as another)", e.tenant, id)
			}
			return err
		},
	})
}

// again is the command line that does what is said of a run, with the
// tenant it acts as when that is not the default: what a message tells
// its reader to type.
func (e *env) again(verb, id string) string {
	if e.tenant != job.DefaultTenant {
		return fmt.Sprintf("fleetctl --tenant %s run %s %s", e.tenant, verb, id)
	}
	return fmt.Sprintf("fleetctl run %s %s", verb, id)
}

func runSubmit(ctx context.Context, e *env, file string, wait bool) error {
	if file == "" {
		return exit(exitUsage, "run submit needs -f FILE (or -f - for standard input)")
	}
	data, err := readFile(file)
	if err != nil {
		return exit(exitUsage, "read the run: %v", err)
	}
	c, err := e.client(ctx)
	if err != nil {
		return err
	}
	sub, err := c.SubmitRunJSON(ctx, data)
	var refused *client.RunRefusedError
	if errors.As(err, &refused) {
		if e.json() {
			_ = writeJSON(e.stdout, sub)
		}
		return exit(exitUsage, "%s", refusal(refused, file, data))
	}
	if err != nil {
		return err
	}
	switch {
	case sub.Duplicate && wait:
		fmt.Fprintf(e.stderr, "run %s already exists (%s): not submitted again; following it\n", sub.RunID, sub.State)
	case sub.Duplicate:
		fmt.Fprintf(e.stderr, "run %s already exists (%s): not submitted again\n", sub.RunID, sub.State)
	}
	switch {
	case e.json() && !wait:
		return writeJSON(e.stdout, sub)
	case e.json():
	case sub.Duplicate:
		fmt.Fprintf(e.stdout, "run %s: %d nodes\n", sub.RunID, sub.Nodes)
	default:
		fmt.Fprintf(e.stdout, "run %s submitted: %d nodes\n", sub.RunID, sub.Nodes)
	}
	if !wait {
		return nil
	}
	// In JSON mode the events go nowhere: stdout is for the end alone.
	events := e.stdout
	if e.json() {
		events = io.Discard
	}
	end, err := followRun(ctx, e, c, sub.RunID, events, nil)
	if err != nil {
		return err
	}
	if e.json() {
		if err := writeJSON(e.stdout, end); err != nil {
			return err
		}
	} else {
		printRunEnd(e, end)
	}
	return runExit(end.State)
}

// refusal says why a run was refused: each problem on a line of its own,
// and what to do about the ones a word helps with.
func refusal(r *client.RunRefusedError, file string, data []byte) string {
	if len(r.Problems) == 0 {
		return "run refused: " + r.Reason
	}
	var b strings.Builder
	fmt.Fprintf(&b, "run refused, %d problem(s); fix them and submit it again:", len(r.Problems))
	pools := map[string]bool{}
	for _, p := range r.Problems {
		b.WriteString("\n  " + p)
		if m := noWorker.FindStringSubmatch(p); m != nil {
			pools[m[1]] = true
		}
	}
	for _, p := range slices.Sorted(maps.Keys(pools)) {
		fmt.Fprintf(&b, "\nlist pool %s's live workers, and what each has, with: fleetctl workers --pool %s", p, p)
	}
	if looksLikeRequest(data) {
		what := file
		if what == "-" {
			what = "standard input"
		}
		fmt.Fprintf(&b, "\n%s holds a job request, not a run: submit it with fleetctl submit -f %s, or make it a node of a run: "+
			`{"nodes": [{"id": "a", "job": {the request}}]}`, what, file)
	}
	return b.String()
}

// noWorker finds the pool in an admission's refusal of a node that no
// live worker of its pool could run.
var noWorker = regexp.MustCompile(`(?:no worker of )?pool "([A-Za-z0-9_-]+)" (?:has no live worker|could ever run it)`)

func runExit(s job.RunState) error {
	if s == job.RunSucceeded {
		return nil
	}
	return &exitError{code: exitJobFail, err: errors.New("")}
}

// followRun prints the events of a run's nodes to w as they come, until the
// run's round ends, and returns its end; now, when given, is handed how
// the run stands as the watch begins.
func followRun(ctx context.Context, e *env, c *client.Client, id string, w io.Writer, now func(*job.RunView)) (*job.RunEnd, error) {
	for ev, err := range c.WatchRun(ctx, id) {
		if err != nil {
			if ctx.Err() != nil {
				return nil, exit(exitFleet, "interrupted")
			}
			return nil, err
		}
		if ev.Now != nil {
			if now != nil {
				now(ev.Now)
			}
			continue
		}
		if ev.End != nil {
			if e.json() {
				if err := json.NewEncoder(w).Encode(runLine{End: ev.End}); err != nil {
					return nil, err
				}
			}
			return ev.End, nil
		}
		for _, je := range job.EventsOf(ev.Record) {
			if je.Type == job.EventHeartbeat && je.Phase == "" {
				continue
			}
			if e.json() {
				if err := json.NewEncoder(w).Encode(runLine{Node: ev.Node, Event: je}); err != nil {
					return nil, err
				}
				continue
			}
			fmt.Fprintf(w, "%s  %-12s %s\n", je.Time.Local().Format("15:04:05.000"), ev.Node, eventText(je))
		}
	}
	return nil, fmt.Errorf("watch run %s: it ended without the run's end", id)
}

// runLine is a line of run watch -o json: a node's event, or the run's end.
type runLine struct {
	Node  string      `json:"node,omitempty"`
	Event *job.Event  `json:"event,omitempty"`
	End   *job.RunEnd `json:"end,omitempty"`
}

// printRunEnd writes how a run's round ended: its state, each node's, and
// what to do about a run that did not succeed.
func printRunEnd(e *env, end *job.RunEnd) {
	fmt.Fprintf(e.stdout, "\nrun %s %s in round %d", end.RunID, end.State, end.Round)
	if !end.FinishedAt.IsZero() {
		fmt.Fprintf(e.stdout, ", %s after its submission", end.FinishedAt.Sub(end.SubmittedAt).Round(time.Millisecond))
	}
	fmt.Fprintln(e.stdout)
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tSTATE\tJOB\tCODE")
	for _, n := range end.Nodes {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", n.ID, n.State, n.JobID, orDash(string(n.Code)))
	}
	tw.Flush()
	if end.State != job.RunSucceeded {
		fmt.Fprintf(e.stdout, "to run again what did not succeed: %s\n", e.again("retry", end.RunID))
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func runShow(ctx context.Context, e *env, c *client.Client, id string) error {
	v, err := c.Run(ctx, id)
	if err != nil {
		return err
	}
	if e.json() {
		return writeJSON(e.stdout, v)
	}
	fmt.Fprintf(e.stdout, "run:       %s\nstate:     %s (round %d)\n", v.RunID, v.State, v.Round)
	if v.CancelRequested && !v.State.Final() {
		fmt.Fprintln(e.stdout, "cancel:    requested; the nodes that have not ended are being cancelled")
	}
	fmt.Fprintf(e.stdout, "submitted: %s\n", v.SubmittedAt.Local().Format(time.RFC3339))
	if v.FinishedAt != nil {
		fmt.Fprintf(e.stdout, "finished:  %s\n", v.FinishedAt.Local().Format(time.RFC3339))
	}
	if len(v.Labels) > 0 {
		var labels []string
		for _, k := range slices.Sorted(maps.Keys(v.Labels)) {
			labels = append(labels, k+"="+v.Labels[k])
		}
		fmt.Fprintf(e.stdout, "labels:    %s\n", strings.Join(labels, " "))
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\nNODE\tSTATE\tJOB\tWAITING FOR / CODE")
	for _, n := range v.Nodes {
		detail := string(n.Code)
		if len(n.WaitingFor) > 0 {
			detail = strings.Join(n.WaitingFor, " ")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", n.ID, n.State, n.JobID, orDash(detail))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if v.State == job.RunFailed || v.State == job.RunCancelled {
		fmt.Fprintf(e.stdout, "to run again what did not succeed: %s\n", e.again("retry", v.RunID))
	}
	return nil
}

func runWatch(ctx context.Context, e *env, c *client.Client, id string) error {
	// The watch replays nothing: it says first how the run stands.
	end, err := followRun(ctx, e, c, id, e.stdout, func(v *job.RunView) {
		if e.json() || v.State.Final() {
			return
		}
		ended := 0
		for _, n := range v.Nodes {
			if n.State.Final() {
				ended++
			}
		}
		fmt.Fprintf(e.stdout, "run %s is running (round %d): %d of %d nodes ended\n", v.RunID, v.Round, ended, len(v.Nodes))
	})
	if err != nil {
		return err
	}
	if !e.json() {
		printRunEnd(e, end)
	}
	return runExit(end.State)
}

func runList(ctx context.Context, e *env) error {
	c, err := e.client(ctx)
	if err != nil {
		return err
	}
	ids, err := c.Runs(ctx)
	if err != nil {
		return err
	}
	if e.json() {
		if ids == nil {
			ids = []string{}
		}
		return writeJSON(e.stdout, job.RunList{Runs: ids})
	}
	if len(ids) == 0 {
		fmt.Fprintf(e.stderr, "tenant %s has no runs\n", e.tenant)
	}
	for _, id := range ids {
		fmt.Fprintln(e.stdout, id)
	}
	return nil
}

func runCancel(ctx context.Context, e *env, c *client.Client, id string) error {
	r, err := c.CancelRun(ctx, id)
	if err != nil {
		return err
	}
	if e.json() {
		return writeJSON(e.stdout, r)
	}
	fmt.Fprintf(e.stdout, "run %s: %s (round %d)\n", r.RunID, r.Message, r.Round)
	if r.Cancelled {
		return nil
	}
	// Nothing was cancelled: say what may be done instead.
	if v, err := c.Run(ctx, id); err == nil {
		switch {
		case v.State == job.RunFailed || v.State == job.RunCancelled:
			fmt.Fprintf(e.stdout, "to run again what did not succeed: %s\n", e.again("retry", id))
		case !v.State.Final():
			fmt.Fprintf(e.stdout, "to follow it to its end: %s\n", e.again("watch", id))
		}
	}
	return nil
}

func runRetry(ctx context.Context, e *env, c *client.Client, id string) error {
	r, err := c.RetryRun(ctx, id)
	if err != nil {
		return err
	}
	if e.json() {
		if err := writeJSON(e.stdout, r); err != nil {
			return err
		}
	}
	if len(r.Retried) > 0 {
		if !e.json() {
			fmt.Fprintf(e.stdout, "run %s: round %d runs %d node(s) again: %s\nto follow it: %s\n", r.RunID, r.Round,
				len(r.Retried), strings.Join(r.Retried, ", "), e.again("watch", id))
		}
		return nil
	}
	// Nothing runs again: a run that has not ended is the caller's to
	// cancel or wait for; one that succeeded needs nothing.
	v, err := c.Run(ctx, id)
	if err != nil {
		return err
	}
	if !v.State.Final() {
		return exit(exitUsage, "run %s has not ended: round %d is running; cancel it first (%s) or wait for its end (%s), then retry it",
			id, v.Round, e.again("cancel", id), e.again("watch", id))
	}
	if !e.json() {
		fmt.Fprintf(e.stdout, "run %s: %s\n", r.RunID, r.Message)
	}
	return nil
}
