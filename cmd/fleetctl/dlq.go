package main

import (
	"context"
	"flag"
	"fmt"
	"text/tabwriter"
)

func init() {
	var pool string
	commands = append(commands, &command{
		name: "dlq", args: "list [--pool P] | retry ID",
		help: "The dead-letter stream: jobs that ended failed or timed out.\n" +
			"  dlq list       lists them (-o json: their documents)\n" +
			"  dlq retry ID   submits the request of job ID again, as job ID-retry-N",
		example: "fleetctl dlq list --pool default\n" +
			"fleetctl dlq retry tour-1          # prints the new job's id, tour-1-retry-1",
		verbs: []string{"list", "retry"},
		flags: func(fs *flag.FlagSet) { fs.StringVar(&pool, "pool", "", "only this pool") },
		run: func(ctx context.Context, e *env, fs *flag.FlagSet, args []string) error {
			if len(args) == 0 {
				return exit(exitUsage, "dlq needs list or retry ID")
			}
			c, err := e.client(ctx)
			if err != nil {
				return err
			}
			switch {
			case args[0] == "list" && len(args) == 1:
				dls, err := c.DeadLetters(ctx, pool)
				if err != nil {
					return err
				}
				if e.json() {
					return writeJSON(e.stdout, dls)
				}
				tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, "JOB\tPOOL\tATTEMPTS\tWHEN\tFAILURE")
				for _, d := range dls {
					fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s/%s: %s\n", d.JobID, d.Pool, d.Attempts,
						d.Time.Local().Format("2006-01-02 15:04:05"), d.Failure.Class, d.Failure.Code, d.Failure.Message)
				}
				if len(dls) == 0 {
					fmt.Fprintln(tw, "(no dead letters)")
				}
				return tw.Flush()
			case args[0] == "retry" && len(args) == 2:
				sub, err := c.RetryDeadLetter(ctx, args[1])
				if err != nil {
					return err
				}
				if e.json() {
					return writeJSON(e.stdout, sub)
				}
				fmt.Fprintln(e.stdout, sub.JobID)
				return nil
			}
			return exit(exitUsage, "dlq needs list or retry ID")
		},
	})
}
