package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/fleet-dev/fleet/job"
)

func init() {
	var reason string
	commands = append(commands, &command{
		name: "pool", args: "show POOL | pause POOL [--reason R] | resume POOL",
		help: "What operators set about a pool.\n" +
			"  pool show POOL     whether it is paused, since when and why\n" +
			"  pool pause POOL    its workers start no attempt until it is resumed; jobs\n" +
			"                     submitted meanwhile wait, running attempts go on\n" +
			"  pool resume POOL   its waiting jobs start as slots allow",
		flags: func(fs *flag.FlagSet) {
			fs.StringVar(&reason, "reason", "", "why the pool is paused (shown by pool show)")
		},
		run: func(ctx context.Context, e *env, fs *flag.FlagSet, args []string) error {
			if len(args) != 2 {
				return exit(exitUsage, "pool needs show, pause or resume, and a pool")
			}
			c, err := e.client(ctx)
			if err != nil {
				return err
			}
			var s *job.PoolState
			switch verb, pool := args[0], args[1]; verb {
			case "show":
				s, err = c.Pool(ctx, pool)
			case "pause":
				s, err = c.PausePool(ctx, pool, reason)
			case "resume":
				s, err = c.ResumePool(ctx, pool)
			default:
				return exit(exitUsage, "pool needs show, pause or resume, and a pool")
			}
			if err != nil {
				return err
			}
			if e.json() {
				return writeJSON(e.stdout, s)
			}
			if !s.Paused {
				fmt.Fprintf(e.stdout, "%s: running\n", s.Pool)
				return nil
			}
			fmt.Fprintf(e.stdout, "%s: paused since %s", s.Pool, s.Since.Local().Format("2006-01-02 15:04:05"))
			if s.Reason != "" {
				fmt.Fprintf(e.stdout, " (%s)", s.Reason)
			}
			fmt.Fprintln(e.stdout)
			return nil
		},
	})
}
