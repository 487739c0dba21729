package main

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fleet-dev/fleet/job"
)

func init() {
	var (
		reason     string
		weights    tenantValues
		quotas     tenantValues
		maxRunning int
		halfLife   time.Duration
	)
	commands = append(commands, &command{
		name: "pool", args: "show POOL | pause POOL [--reason R] | resume POOL | set POOL [--weight T=W] [--quota T=Q] [--max-running N] [--half-life D]",
		help: "What operators set about a pool, and how its tenants fare.\n" +
			"  pool show POOL     whether it is paused, its sharing policy (as pool set's flags,\n" +
			"                     to paste after pool set POOL), and per tenant what is queued\n" +
			"                     (by priority), delivered, runs, its share and usage\n" +
			"  pool pause POOL    its workers start no attempt until it is resumed; jobs\n" +
			"                     submitted meanwhile wait, running attempts go on\n" +
			"  pool resume POOL   its waiting jobs start as slots allow\n" +
			"  pool set POOL      how it is shared between tenants: --weight TENANT=W (0\n" +
			"                     removes it), --quota TENANT=SLOTS or TENANT=cpu=4,memory=8Gi,gpu=2\n" +
			"                     (none removes it), --max-running N (0: no bound),\n" +
			"                     --half-life D (how fast past usage is forgotten)\n" +
			"pool show's columns: QUEUED, the tenant's jobs no worker has taken yet; DELIVERED,\n" +
			"those a worker has taken and not finished: running, about to start, or handed back\n" +
			"to be taken again after a wait (a retry's delay, a not_before, a paused pool, no live\n" +
			"worker that fits them); RUNNING, its attempts that run (from Redis, 0 without it).",
		example: "fleetctl pool show gpu\n" +
			"fleetctl pool pause gpu --reason 'driver upgrade'\n" +
			"fleetctl pool resume gpu\n" +
			"fleetctl pool set gpu --weight acme=3 --quota beta=2 --max-running 40\n" +
			"fleetctl pool set gpu --quota acme=cpu=16,memory=64Gi,gpu=2 --half-life 30m",
		verbs: []string{"show", "pause", "resume", "set"},
		flags: func(fs *flag.FlagSet) {
			fs.StringVar(&reason, "reason", "", "why the pool is paused (shown by pool show)")
			fs.Var(&weights, "weight", "TENANT=W: the tenant's weight in the pool's fair share (pool set; repeatable)")
			fs.Var(&quotas, "quota", "TENANT=SLOTS or TENANT=cpu=…,memory=…,gpu=…: what the tenant may run at once (pool set; repeatable)")
			fs.IntVar(&maxRunning, "max-running", -1, "the attempts the pool runs at once, all tenants together; 0 is no bound (pool set)")
			fs.DurationVar(&halfLife, "half-life", 0, "how fast past usage is forgotten in the fair share (pool set)")
		},
		run: func(ctx context.Context, e *env, fs *flag.FlagSet, args []string) error {
			if len(args) != 2 {
				return exit(exitUsage, "pool needs show, pause, resume or set, and a pool")
			}
			verb, pool := args[0], args[1]
			var change *job.PolicyChange
			if verb == "set" {
				var err error
				if change, err = policyChange(weights, quotas, maxRunning, halfLife); err != nil {
					return exit(exitUsage, "pool set: %v", err)
				}
			}
			c, err := e.client(ctx)
			if err != nil {
				return err
			}
			var s *job.PoolState
			switch verb {
			case "show":
				s, err = c.Pool(ctx, pool)
			case "pause":
				s, err = c.PausePool(ctx, pool, reason)
			case "resume":
				s, err = c.ResumePool(ctx, pool)
			case "set":
				s, err = c.SetPoolPolicy(ctx, pool, change)
			default:
				return exit(exitUsage, "pool needs show, pause, resume or set, and a pool")
			}
			if err != nil {
				return err
			}
			if e.json() {
				return writeJSON(e.stdout, s)
			}
			writePool(e, s)
			return nil
		},
	})
}

// tenantValues are repeated TENANT=VALUE flags.
type tenantValues []string

func (v *tenantValues) String() string { return strings.Join(*v, " ") }

func (v *tenantValues) Set(s string) error {
	t, _, ok := strings.Cut(s, "=")
	if !ok || !job.ValidTenant(t) {
		return fmt.Errorf("%q: use TENANT=VALUE", s)
	}
	*v = append(*v, s)
	return nil
}

// policyChange reads pool set's flags.
func policyChange(weights, quotas tenantValues, maxRunning int, halfLife time.Duration) (*job.PolicyChange, error) {
	c := &job.PolicyChange{}
	for _, s := range weights {
		t, v, _ := strings.Cut(s, "=")
		w, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return nil, fmt.Errorf("--weight %s: %q is not a number", t, v)
		}
		if c.Weights == nil {
			c.Weights = map[string]float64{}
		}
		c.Weights[t] = w
	}
	for _, s := range quotas {
		t, v, _ := strings.Cut(s, "=")
		q, err := job.ParseQuota(v)
		if err != nil {
			return nil, fmt.Errorf("--quota %s: %w", t, err)
		}
		if c.Quotas == nil {
			c.Quotas = map[string]job.Quota{}
		}
		c.Quotas[t] = q
	}
	if maxRunning >= 0 {
		c.MaxRunning = &maxRunning
	}
	if halfLife != 0 {
		h := job.Duration(halfLife)
		c.HalfLife = &h
	}
	if c.Weights == nil && c.Quotas == nil && c.MaxRunning == nil && c.HalfLife == nil {
		return nil, fmt.Errorf("nothing to set: give --weight, --quota, --max-running or --half-life")
	}
	return c, c.Validate()
}

// policyFlags writes a policy as pool set's flags, so that what pool show
// prints can be pasted after "fleetctl pool set POOL"; "equal" when it
// sets nothing.
func policyFlags(p *job.PoolPolicy) string {
	if p.IsZero() {
		return "equal (no weight, quota or bound set)"
	}
	var flags []string
	for _, t := range slices.Sorted(maps.Keys(p.Weights)) {
		flags = append(flags, "--weight "+t+"="+strconv.FormatFloat(p.Weights[t], 'g', -1, 64))
	}
	for _, t := range slices.Sorted(maps.Keys(p.Quotas)) {
		flags = append(flags, "--quota "+t+"="+quotaFlag(p.Quotas[t]))
	}
	if p.MaxRunning > 0 {
		flags = append(flags, "--max-running "+strconv.Itoa(p.MaxRunning))
	}
	if p.HalfLife != nil {
		flags = append(flags, "--half-life "+p.HalfLife.Std().String())
	}
	return strings.Join(flags, " ")
}

// quotaFlag writes a quota as --quota takes it: a bound on slots alone as
// its number ("2"), any other as its parts ("cpu=4,memory=8Gi").
func quotaFlag(q job.Quota) string {
	if q.Slots > 0 && (q == job.Quota{Slots: q.Slots}) {
		return strconv.Itoa(q.Slots)
	}
	return q.String()
}

// writePool writes a pool's state for people.
func writePool(e *env, s *job.PoolState) {
	if !s.Paused {
		fmt.Fprintf(e.stdout, "%s: running", s.Pool)
	} else {
		fmt.Fprintf(e.stdout, "%s: paused since %s", s.Pool, s.Since.Local().Format("2006-01-02 15:04:05"))
		if s.Reason != "" {
			fmt.Fprintf(e.stdout, " (%s)", s.Reason)
		}
	}
	if s.Slots > 0 {
		fmt.Fprintf(e.stdout, ", %d slots", s.Slots)
	}
	fmt.Fprintf(e.stdout, "\nsharing: %s\n", policyFlags(s.Policy))
	if len(s.Tenants) == 0 {
		return
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tWEIGHT\tQUOTA\tQUEUED\tBY PRIORITY\tDELIVERED\tRUNNING\tSHARE\tFAIR SHARE\tUSAGE")
	for _, t := range s.Tenants {
		quota := "-"
		if t.Quota != nil {
			quota = quotaFlag(*t.Quota)
		}
		var by []string
		for p := job.HighestPriority; p <= job.LowestPriority; p++ {
			if n := t.QueuedByPri[strconv.Itoa(p)]; n > 0 {
				by = append(by, fmt.Sprintf("p%d:%d", p, n))
			}
		}
		if len(by) == 0 {
			by = []string{"-"}
		}
		fmt.Fprintf(tw, "%s\t%g\t%s\t%d\t%s\t%d\t%d\t%.0f%%\t%.0f%%\t%.0f slot-s\n", t.Tenant, t.Weight, quota, t.Queued,
			strings.Join(by, " "), t.Delivered, t.Running, 100*t.SlotShare, 100*t.FairShare, t.Usage)
	}
	tw.Flush()
}
