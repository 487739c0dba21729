package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"
	_ "time/tzdata" // zones for show, whatever the machine has

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/job"
)

// scheduleFlags are what schedule create and update may set; update
// changes only those given.
type scheduleFlags struct {
	file, template, cron, every, zone, overlap, catchUp, end string
	paused                                                   bool
}

func init() {
	var sf scheduleFlags
	commands = append(commands, &command{
		name: "schedule",
		args: "create|update|delete|pause|resume|show NAME | list",
		help: "Periodic jobs: each firing of a schedule submits its template as one job,\n" +
			"with the id NAME-<firing time in UTC, 20060102T150405Z>, run once.\n" +
			"  schedule create NAME -f SCHEDULE.json\n" +
			"  schedule create NAME --template REQUEST.json (--cron EXPR | --every D) [--zone Z]\n" +
			"                  [--overlap skip|allow|cancel_previous] [--catch-up D] [--end T] [--paused]\n" +
			"  schedule update NAME [-f SCHEDULE.json | the flags to change, --end none to drop it]\n" +
			"  schedule pause NAME | resume NAME   (a resumed schedule does not make up its pause)\n" +
			"  schedule show NAME                  the next five firings in its zone, the last ones and their jobs\n" +
			"  schedule list | delete NAME\n" +
			"cron: 5 fields (minute hour day-of-month month day-of-week) or 6 with seconds first,\n" +
			"or @hourly, @daily, @weekly, @monthly, @yearly; every: a whole number of seconds, at least 1s.",
		example: "fleetctl schedule create nightly --template report.json --cron '0 2 * * *' --zone Europe/Paris\n" +
			"fleetctl schedule create tick -f schedule.json     # {\"cron\": …, \"template\": {the request}, …}\n" +
			"fleetctl schedule update nightly --cron '30 2 * * *'\n" +
			"fleetctl schedule pause nightly\n" +
			"fleetctl schedule resume nightly\n" +
			"fleetctl schedule show nightly\n" +
			"fleetctl schedule list -o json\n" +
			"fleetctl schedule delete nightly",
		verbs: []string{"create", "update", "delete", "pause", "resume", "show", "list"},
		flags: func(fs *flag.FlagSet) {
			fs.StringVar(&sf.file, "f", "", "the schedule as a JSON document (- for standard input)")
			fs.StringVar(&sf.template, "template", "", "the request each firing submits, a JSON file (- for standard input)")
			fs.StringVar(&sf.cron, "cron", "", "a cron expression, read in --zone")
			fs.StringVar(&sf.every, "every", "", "an interval, such as 30s or 1h (fires at its multiples since the Unix epoch)")
			fs.StringVar(&sf.zone, "zone", "", "the IANA time zone of --cron, such as Europe/Paris (default UTC)")
			fs.StringVar(&sf.overlap, "overlap", "", "while the previous firing's job runs: skip (the default), allow, or cancel_previous")
			fs.StringVar(&sf.catchUp, "catch-up", "", "how late a missed firing is still made (default 1h); older ones count as missed")
			fs.StringVar(&sf.end, "end", "", "when the schedule stops firing, RFC 3339 (none: never)")
			fs.BoolVar(&sf.paused, "paused", false, "make the schedule paused; with update, --paused=false resumes it")
		},
		run: func(ctx context.Context, e *env, fs *flag.FlagSet, args []string) error {
			if len(args) == 0 {
				return exit(exitUsage, "schedule needs create, update, delete, pause, resume, show or list")
			}
			verb, rest := args[0], args[1:]
			if verb == "list" {
				if len(rest) != 0 {
					return exit(exitUsage, "schedule list takes no name")
				}
				return scheduleList(ctx, e)
			}
			if len(rest) != 1 {
				return exit(exitUsage, "schedule %s needs one schedule name", verb)
			}
			name := rest[0]
			if !job.ValidScheduleName(name) {
				return exit(exitUsage, "%q is not a schedule name: 1 to 63 characters of [A-Za-z0-9_-], starting and ending with a letter or digit", name)
			}
			set := map[string]bool{}
			fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
			c, err := e.client(ctx)
			if err != nil {
				return err
			}
			var info *client.ScheduleInfo
			var doc []byte
			switch verb {
			case "create":
				if doc, err = sf.document(name, set, nil); err != nil {
					return err
				}
				info, err = c.CreateScheduleJSON(ctx, name, doc)
				if errors.Is(err, client.ErrScheduleExists) {
					return exit(exitUsage, "schedule %s exists: change it with schedule update, or delete it first", name)
				}
			case "update":
				var cur *client.ScheduleInfo
				if sf.file == "" {
					if cur, err = c.Schedule(ctx, name); err != nil {
						return err
					}
				}
				if doc, err = sf.document(name, set, cur); err != nil {
					return err
				}
				info, err = c.UpdateScheduleJSON(ctx, name, doc)
			case "delete":
				info, err = c.DeleteSchedule(ctx, name)
			case "pause":
				info, err = c.PauseSchedule(ctx, name)
			case "resume":
				info, err = c.ResumeSchedule(ctx, name)
			case "show":
				info, err = c.Schedule(ctx, name)
			default:
				return exit(exitUsage, "schedule needs create, update, delete, pause, resume, show or list, not %q", verb)
			}
			var rej *client.RejectedError
			if errors.As(err, &rej) {
				if sf.file != "" && looksLikeRequest(doc) {
					what := sf.file
					if what == "-" {
						what = "standard input"
					}
					return exit(exitUsage, "%s: %s holds a job request, not a schedule: give a request with --template %s and --cron or --every "+
						"(-f takes a whole schedule, with the request as its \"template\")", rej.Reason, what, sf.file)
				}
				return exit(exitUsage, "%s", rej.Reason)
			}
			if err != nil {
				return err
			}
			if e.json() {
				return writeJSON(e.stdout, info)
			}
			if verb == "delete" {
				fmt.Fprintf(e.stdout, "%s: deleted; the jobs it made are left as they are\n", name)
				return nil
			}
			printSchedule(e.stdout, info)
			return nil
		},
	})
}

// document is the schedule to send: -f's file as is, or the flags given
// over cur (update) or nothing (create).
func (sf *scheduleFlags) document(name string, set map[string]bool, cur *client.ScheduleInfo) ([]byte, error) {
	if sf.file != "" {
		for _, f := range []string{"template", "cron", "every", "zone", "overlap", "catch-up", "end", "paused"} {
			if set[f] {
				return nil, exit(exitUsage, "-f gives the whole schedule: --%s goes in the file", f)
			}
		}
		data, err := readFile(sf.file)
		if err != nil {
			return nil, exit(exitUsage, "read the schedule: %v", err)
		}
		return data, nil
	}
	doc := map[string]any{}
	if cur != nil {
		// The schedule as it is, without its template: an update without
		// --template keeps the template and its env values.
		s := *cur.Schedule
		s.Template = nil
		data, _ := json.Marshal(&s)
		_ = json.Unmarshal(data, &doc)
		delete(doc, "template")
	} else if !set["template"] {
		return nil, exit(exitUsage, "schedule create needs -f SCHEDULE.json, or --template REQUEST.json with --cron or --every")
	}
	doc["name"] = name
	if set["template"] {
		data, err := readFile(sf.template)
		if err != nil {
			return nil, exit(exitUsage, "read the template: %v", err)
		}
		doc["template"] = json.RawMessage(data)
	}
	if set["cron"] && set["every"] {
		return nil, exit(exitUsage, "give --cron or --every, not both")
	}
	if set["cron"] {
		doc["cron"] = sf.cron
		delete(doc, "every")
	}
	if set["every"] {
		doc["every"] = sf.every
		delete(doc, "cron")
	}
	for flagName, field := range map[string]string{"zone": "time_zone", "overlap": "overlap", "catch-up": "catch_up_window"} {
		if set[flagName] {
			doc[field] = map[string]string{"zone": sf.zone, "overlap": sf.overlap, "catch-up": sf.catchUp}[flagName]
		}
	}
	if set["end"] {
		if strings.EqualFold(sf.end, "none") || sf.end == "" {
			delete(doc, "end")
		} else {
			doc["end"] = sf.end
		}
	}
	if set["paused"] {
		doc["paused"] = sf.paused
	}
	return json.Marshal(doc)
}

// looksLikeRequest reports whether a document given as a schedule is a job
// request instead: it has a command or an image, and no template.
func looksLikeRequest(doc []byte) bool {
	var top map[string]json.RawMessage
	if json.Unmarshal(doc, &top) != nil {
		return false
	}
	_, command := top["command"]
	_, image := top["image"]
	_, template := top["template"]
	return (command || image) && !template
}

func readFile(name string) ([]byte, error) {
	if name == "-" {
		return io.ReadAll(os.Stdin)
	}
	return os.ReadFile(name)
}

// when formats a time in the schedule's zone.
func when(t time.Time) string { return t.Format("2006-01-02 15:04:05 MST") }

// zoneOf is a schedule's zone; UTC if this machine does not know it.
func zoneOf(s *job.Schedule) *time.Location {
	if l, err := time.LoadLocation(s.TimeZone); err == nil && s.TimeZone != "" {
		return l
	}
	return time.UTC
}

func printSchedule(w io.Writer, info *client.ScheduleInfo) {
	s := info.Schedule
	loc := zoneOf(s)
	fmt.Fprintf(w, "%s (tenant %s): %s\n", s.Name, s.Tenant, info.Status)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "  fires\t%s in %s\n", specOf(s), loc)
	overlap := s.Overlap
	if overlap == "" {
		overlap = job.OverlapSkip
	}
	window := job.Duration(job.DefaultCatchUpWindow)
	if s.CatchUpWindow != nil {
		window = *s.CatchUpWindow
	}
	fmt.Fprintf(tw, "  overlap\t%s; catch-up window %s\n", overlap, window)
	if s.End != nil {
		fmt.Fprintf(tw, "  ends\t%s\n", when(s.End.In(loc)))
	}
	if t := s.Template; t != nil {
		pool := t.Pool
		if pool == "" {
			pool = job.DefaultPool
		}
		what := strings.Join(t.Command, " ")
		if t.Image != "" {
			what = t.Image + " " + what
		}
		fmt.Fprintf(tw, "  job\tpool %s: %s\n", pool, strings.TrimSpace(what))
	}
	st := info.State
	fmt.Fprintf(tw, "  fired\t%d made, %d skipped (overlap), %d missed, %d rejected\n", st.Made, st.Skipped, st.Missed, st.Rejected)
	for i, n := range info.Next {
		label := ""
		if i == 0 {
			label = "next"
		}
		fmt.Fprintf(tw, "  %s\t%s\n", label, when(n.In(loc)))
	}
	for i := len(st.Recent) - 1; i >= 0; i-- {
		f := st.Recent[i]
		label := ""
		if i == len(st.Recent)-1 {
			label = "last"
		}
		line := fmt.Sprintf("%s  %s", when(f.At.In(loc)), f.Outcome)
		switch f.Outcome {
		case job.FiringMade:
			line += "  " + f.JobID
			if f.State != "" {
				line += "  " + string(f.State)
			}
			if f.Cancelled != "" {
				line += "  (cancelled " + f.Cancelled + ")"
			}
		case job.FiringSkipped:
			line += "  (" + f.JobID + " still running)"
		case job.FiringMissed:
			line += fmt.Sprintf("  (%d, older than the catch-up window)", f.Count)
		case job.FiringRejected:
			line += "  " + f.Error
		}
		fmt.Fprintf(tw, "  %s\t%s\n", label, line)
	}
	_ = tw.Flush()
}

func specOf(s *job.Schedule) string {
	if s.Every != nil {
		return "every " + s.Every.String()
	}
	return "cron " + s.Cron
}

func scheduleList(ctx context.Context, e *env) error {
	c, err := e.client(ctx)
	if err != nil {
		return err
	}
	list, err := c.Schedules(ctx)
	if err != nil {
		return err
	}
	if e.json() {
		return writeJSON(e.stdout, list)
	}
	if len(list.Schedules) == 0 {
		fmt.Fprintf(e.stdout, "tenant %s has no schedule\n", e.tenant)
		return nil
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATUS\tFIRES\tZONE\tNEXT\tMADE\tSKIPPED\tMISSED")
	for _, info := range list.Schedules {
		s := info.Schedule
		zone := s.TimeZone
		if zone == "" {
			zone = "UTC"
		}
		next := "-"
		if len(info.Next) > 0 {
			next = when(info.Next[0].In(zoneOf(s)))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\n", s.Name, info.Status, specOf(s), zone, next,
			info.State.Made, info.State.Skipped, info.State.Missed)
	}
	return tw.Flush()
}
