package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/job"
)

func init() {
	var o eventsOptions
	commands = append(commands, &command{
		name: "events", args: "[--consumer NAME] [--since T | --from SEQ] [--pool P] [--follow]",
		help: "Print how the tenant's jobs ended, from its durable feed: each job's final version\n" +
			"and each rejection, one line each (-o json: the job record, one per line).\n" +
			"Without --follow, stops once it has printed what the feed holds.\n" +
			"With --consumer NAME, reads through the tenant's durable consumer NAME, and acknowledges\n" +
			"each entry once printed: run again, it goes on after the last one printed, and misses none\n" +
			"(an entry whose acknowledgement a failing NATS server lost is printed again)\n" +
			"(--since, --from and --pool only say where a consumer made now starts). Without it, a\n" +
			"consumer of its own, deleted at exit. --since takes a time (RFC 3339) or a duration ago.",
		example: "fleetctl events --since 1h                         # how jobs ended in the last hour\n" +
			"fleetctl events --follow --consumer billing        # resumes where billing left off\n" +
			"fleetctl events --from 1200 --pool gpu -o json | jq -r .result.status",
		flags: func(fs *flag.FlagSet) {
			fs.StringVar(&o.consumer, "consumer", "", "the durable consumer to read through (made if there is none)")
			fs.StringVar(&o.since, "since", "", "start at this time (RFC 3339), or this long ago (1h)")
			fs.Uint64Var(&o.from, "from", 0, "start at this sequence of the feed")
			fs.StringVar(&o.pool, "pool", "", "only this pool's jobs")
			fs.BoolVar(&o.follow, "follow", false, "go on printing as jobs end")
		},
		run: func(ctx context.Context, e *env, fs *flag.FlagSet, args []string) error {
			if len(args) > 0 {
				return exit(exitUsage, "events takes no arguments, got %q", args)
			}
			return events(ctx, e, o, time.Now())
		},
	})
}

type eventsOptions struct {
	consumer, since, pool string
	from                  uint64
	follow                bool
}

// request is the feed request of a consumer made for o, read at now.
func (o eventsOptions) request(now time.Time) (*job.FeedRequest, error) {
	r := &job.FeedRequest{Pool: o.pool, StartSeq: o.from}
	if o.since != "" {
		if o.from > 0 {
			return nil, errors.New("give --since or --from, not both")
		}
		t, err := time.Parse(time.RFC3339Nano, o.since)
		if err != nil {
			d, derr := time.ParseDuration(o.since)
			if derr != nil || d < 0 {
				return nil, fmt.Errorf("--since %q: a time (2026-12-07T10:00:00Z) or a duration ago (90m)", o.since)
			}
			t = now.Add(-d)
		}
		r.StartTime = &t
	}
	if o.consumer == "" {
		// A consumer of this command's own, which the fleet deletes
		// when the command is gone without deleting it.
		r.Inactive = job.Duration(5 * time.Minute)
	}
	return r, r.Validate()
}

func events(ctx context.Context, e *env, o eventsOptions, now time.Time) error {
	r, err := o.request(now)
	if err != nil {
		return exit(exitUsage, "%v", err)
	}
	name := o.consumer
	if name == "" {
		var b [6]byte
		_, _ = rand.Read(b[:])
		name = "fleetctl-" + hex.EncodeToString(b[:])
	} else if !job.ValidConsumerName(name) {
		return exit(exitUsage, "--consumer %q: 1 to 64 characters of [A-Za-z0-9_-]", name)
	}
	c, err := e.client(ctx)
	if err != nil {
		return err
	}
	// The acknowledgements sent, before the connection closes.
	defer func() { _ = e.nc.Flush() }()
	if o.consumer == "" {
		defer func() {
			dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = c.DeleteFeedConsumer(dctx, name)
		}()
	}
	var opts []client.FeedOption
	if !o.follow {
		opts = append(opts, client.UntilCaughtUp())
	}
	for entry, err := range c.Feed(ctx, name, r, opts...) {
		if err != nil {
			var rej *client.RejectedError
			switch {
			case ctx.Err() != nil:
				return nil // interrupted
			case errors.As(err, &rej):
				return exit(exitUsage, "the feed: %s", rej.Reason)
			}
			return err
		}
		if e.json() {
			// The record as stored: one document a line.
			_, err = fmt.Fprintf(e.stdout, "%s\n", bytes.TrimSpace(entry.Data))
		} else {
			err = printEntry(e.stdout, entry)
		}
		if err != nil {
			return err // not printed: not acknowledged
		}
		// Acknowledged without waiting, each in turn: a follower keeps up
		// with the fleet. What is on its way when the command ends is sent
		// before it exits; one lost with a server is printed again.
		if err := entry.AckNoWait(); err != nil {
			return err
		}
	}
	return nil
}

// printEntry prints a feed entry on one line: its sequence, when it was
// stored, the job's pool and id, and how it ended.
func printEntry(w io.Writer, entry *client.FeedEntry) error {
	rec := entry.Record
	var b strings.Builder
	switch {
	case rec.Result != nil:
		r := rec.Result
		b.WriteString(string(r.Status))
		if r.ExitCode != nil {
			b.WriteString(", exit code " + strconv.Itoa(*r.ExitCode))
		}
		fmt.Fprintf(&b, ", %d attempt(s)", r.Attempts)
		if r.Failure != nil {
			fmt.Fprintf(&b, ", %s (%s): %s", r.Failure.Class, r.Failure.Code, firstLine(r.Failure.Message))
		}
	default:
		b.WriteString(string(rec.State))
		if rec.Failure != nil {
			fmt.Fprintf(&b, ": %s", firstLine(rec.Failure.Message))
		}
	}
	_, err := fmt.Fprintf(w, "%8d  %s  %-12s %-24s %s\n", entry.Seq, entry.Time.Local().Format("2006-01-02 15:04:05.000"),
		rec.Pool, rec.ID, b.String())
	return err
}
