// Package schedule computes when a schedule fires: cron expressions read
// in a time zone, intervals, and, at a given moment, which firings are due,
// which may still be made up and which were missed.
//
// Cron times are wall-clock times of the schedule's zone, and each fires
// once, daylight-saving changes included: a time the clock skips when it
// is set forward fires when the clock would have shown it with the offset
// it had before (02:30 on a night the clock jumps from 02:00 to 03:00
// fires at 03:30), a time it shows twice when it is set back fires the
// first time only, and a firing that falls on another of the same instant
// is one firing.
package schedule

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	// The zones travel with the binary: a scratch image has no
	// /usr/share/zoneinfo.
	_ "time/tzdata"

	"github.com/fleet-dev/fleet/job"
)

// Bounds of a schedule's fields.
const (
	// MinEvery is the shortest interval.
	MinEvery = time.Second
	// MinCatchUpWindow and MaxCatchUpWindow bound the catch-up window.
	MinCatchUpWindow = time.Second
	MaxCatchUpWindow = 7 * 24 * time.Hour
	// MaxCatchUp is how many firings one pass makes up at most; older
	// ones in the window count as missed.
	MaxCatchUp = 100
)

// Spec is a schedule compiled: when it fires.
type Spec struct {
	cron  *Cron
	every int64 // seconds
	loc   *time.Location
	end   *time.Time
}

// Location is the zone the schedule is read in.
func (s *Spec) Location() *time.Location { return s.loc }

// Validate checks every field of a schedule (its template as a request
// would be, with a firing's id and labels) and returns it compiled; the
// error lists each problem, prefixed by its field.
func Validate(s *job.Schedule, l job.Limits) (*Spec, error) {
	var problems []string
	add := func(field, format string, args ...any) {
		problems = append(problems, field+": "+fmt.Sprintf(format, args...))
	}
	if !job.ValidScheduleName(s.Name) {
		add("name", "%q must be 1 to 63 characters of [A-Za-z0-9_-], starting and ending with a letter or digit", clip(s.Name, 70))
	}
	if s.Tenant != "" && !job.ValidTenant(s.Tenant) {
		add("tenant", "%q must be 1 to 64 characters of [A-Za-z0-9_-]", clip(s.Tenant, 70))
	}
	spec := &Spec{loc: time.UTC, end: s.End}
	switch {
	case s.Cron == "" && s.Every == nil:
		add("cron", "give cron or every: when the schedule fires")
	case s.Cron != "" && s.Every != nil:
		add("every", "give cron or every, not both")
	case s.Cron != "":
		c, err := ParseCron(s.Cron)
		if err != nil {
			add("cron", "%v", err)
		}
		spec.cron = c
	default:
		switch d := s.Every.Std(); {
		case d < MinEvery:
			add("every", "%s is under the minimum of %s", d, MinEvery)
		case d%time.Second != 0:
			add("every", "%s is not a whole number of seconds", d)
		default:
			spec.every = int64(d / time.Second)
		}
	}
	switch s.TimeZone {
	case "", "UTC":
	case "Local":
		add("time_zone", "Local is whichever zone a dispatcher's machine is in: name an IANA zone such as Europe/Paris")
	default:
		loc, err := time.LoadLocation(s.TimeZone)
		if err != nil {
			add("time_zone", "%q is not an IANA time zone (such as Europe/Paris or America/New_York)", clip(s.TimeZone, 70))
		} else {
			spec.loc = loc
		}
	}
	if s.Overlap != "" && !s.Overlap.Valid() {
		add("overlap", "%q must be allow, skip or cancel_previous", clip(string(s.Overlap), 40))
	}
	if w := s.CatchUpWindow; w != nil && (w.Std() < MinCatchUpWindow || w.Std() > MaxCatchUpWindow) {
		add("catch_up_window", "%s must be from %s to %s", w, MinCatchUpWindow, MaxCatchUpWindow)
	}
	switch t := s.Template; {
	case t == nil:
		add("template", "missing: give the request each firing submits")
	default:
		if t.ID != "" {
			add("template.id", "must be empty: each firing's job has the id <schedule>-<time>, such as %s", job.FiringID(nameOr(s.Name), time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)))
		}
		if t.NotBefore != nil {
			add("template.not_before", "must be empty: a firing's job is queued when it fires")
		}
		for k := range t.Labels {
			if strings.HasPrefix(k, "schedule.fleet.dev/") {
				add("template.labels", "%s: the schedule.fleet.dev/ labels are the fleet's, set on each firing's job", k)
			}
		}
		// The template as one firing's job (of a valid name: a bad one is
		// said once, above).
		sample := *s
		sample.Name = nameOr(s.Name)
		r := Firing(&sample, time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
		if err := r.Validate(l); err != nil {
			var ve *job.ValidationError
			if errors.As(err, &ve) {
				for _, p := range ve.Problems {
					problems = append(problems, "template."+p)
				}
			} else {
				add("template", "%v", err)
			}
		}
	}
	if len(problems) > 0 {
		return nil, &ValidationError{Problems: problems}
	}
	return spec, nil
}

// ValidationError lists every problem found in a schedule, each prefixed
// by the field it concerns.
type ValidationError struct {
	Problems []string
}

func (e *ValidationError) Error() string {
	return "invalid schedule: " + strings.Join(e.Problems, "; ")
}

func nameOr(n string) string {
	if job.ValidScheduleName(n) {
		return n
	}
	return "nightly"
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// Firing returns the request of a schedule's firing at t: a copy of the
// template with the firing's id and labels.
func Firing(s *job.Schedule, t time.Time) *job.Request {
	r := s.Template.Clone()
	r.ID = job.FiringID(s.Name, t)
	labels := make(map[string]string, len(r.Labels)+2)
	for k, v := range r.Labels {
		labels[k] = v
	}
	labels[job.LabelSchedule] = s.Name
	labels[job.LabelFiring] = t.UTC().Format(job.FiringLayout)
	r.Labels = labels
	return r
}

// Next returns the first firing after t; false when there is none (the
// schedule ended).
func (s *Spec) Next(t time.Time) (time.Time, bool) {
	var n time.Time
	if s.every > 0 {
		k := floorDiv(t.Unix(), s.every)
		n = time.Unix((k+1)*s.every, 0)
	} else {
		var ok bool
		if n, ok = s.cronNext(t); !ok {
			return time.Time{}, false
		}
	}
	if s.end != nil && n.After(*s.end) {
		return time.Time{}, false
	}
	return n.In(s.loc), true
}

// NextN returns up to n firings after t.
func (s *Spec) NextN(t time.Time, n int) []time.Time {
	var out []time.Time
	for len(out) < n {
		next, ok := s.Next(t)
		if !ok {
			break
		}
		out = append(out, next)
		t = next
	}
	return out
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

const day = 24 * 60 * 60

// cronNext returns the first instant after t at which the zone's clock
// shows a time the expression matches. Wall-clock times are read as
// resolve does, and so are not in the order of their instants around a
// change of offset: the search starts early enough to see every wall time
// that may resolve after t, and goes on until no later one can resolve
// before the best found.
func (s *Spec) cronNext(t time.Time) (time.Time, bool) {
	a := t.Unix() // an instant i > t is one with i > a: firings are whole seconds
	lo, _ := offsets(a, s.loc)
	w := a + int64(lo) + 1
	var best int64
	found := false
	for {
		m, ok := s.cron.nextWall(time.Unix(w, 0).UTC(), 10)
		if !ok {
			break
		}
		mw := m.Unix()
		if found {
			if _, hi := offsets(best, s.loc); mw-int64(hi) > best {
				break
			}
		}
		if i := resolve(mw, s.loc); i > a && (!found || i < best) {
			best, found = i, true
		}
		w = mw + 1
	}
	if !found {
		return time.Time{}, false
	}
	return time.Unix(best, 0), true
}

// offsets returns the smallest and largest offsets (seconds east of UTC)
// of loc within a day of instant u.
func offsets(u int64, loc *time.Location) (lo, hi int) {
	for i, p := range [...]int64{u - day, u, u + day} {
		_, off := time.Unix(p, 0).In(loc).Zone()
		if i == 0 || off < lo {
			lo = off
		}
		if i == 0 || off > hi {
			hi = off
		}
	}
	return lo, hi
}

// resolve returns the instant at which a clock in loc shows wall time w
// (seconds, read as UTC): the earlier one when the clock shows it twice
// (set back), and, when it never does (set forward past it), the instant
// it would be with the offset in force before the change.
func resolve(w int64, loc *time.Location) int64 {
	if loc == time.UTC {
		return w
	}
	var best int64
	found := false
	for _, probe := range [...]int64{w - day, w, w + day} {
		_, off := time.Unix(probe, 0).In(loc).Zone()
		i := w - int64(off)
		if _, o := time.Unix(i, 0).In(loc).Zone(); o == off && (!found || i < best) {
			best, found = i, true
		}
	}
	if found {
		return best
	}
	_, before := time.Unix(w-day, 0).In(loc).Zone()
	return w - int64(before)
}

// Due is what a schedule has to do at a moment.
type Due struct {
	// Fire are the firings to make, oldest first.
	Fire []time.Time
	// Missed counts the firings too late to make: older than the catch-up
	// window, or over MaxCatchUp; LastMissed is the latest of them.
	Missed     int64
	LastMissed time.Time
	// Next is the first firing after now; zero when there is none.
	Next time.Time
}

// maxCounted bounds how many missed firings of a cron expression are
// counted one by one; past it, the count is a lower bound.
const maxCounted = 100_000

// Due returns the firings after from and at or before now: those within
// window of now to make (at most max, the latest), the older ones missed.
func (s *Spec) Due(from, now time.Time, window time.Duration, max int) Due {
	var d Due
	max = cmp.Or(max, 1)
	cut := now.Add(-window)
	t := from
	if s.every > 0 {
		// Missed firings: (from, cut), counted without listing them.
		first, ok := s.Next(from)
		if ok && first.Before(cut) {
			last := time.Unix(floorDiv(cut.Add(-time.Nanosecond).Unix(), s.every)*s.every, 0)
			if s.end != nil && last.After(*s.end) {
				last = time.Unix(floorDiv(s.end.Unix(), s.every)*s.every, 0)
			}
			d.Missed = (last.Unix()-first.Unix())/s.every + 1
			d.LastMissed, t = last.In(s.loc), last
		}
	} else {
		for n := 0; ; n++ {
			next, ok := s.Next(t)
			if !ok || !next.Before(cut) {
				break
			}
			d.Missed++
			d.LastMissed, t = next, next
			if n == maxCounted {
				t = cut.Add(-time.Nanosecond)
				break
			}
		}
	}
	for {
		next, ok := s.Next(t)
		if !ok || next.After(now) {
			break
		}
		d.Fire = append(d.Fire, next)
		t = next
		if len(d.Fire) >= 2*max {
			d.Missed += int64(len(d.Fire) - max)
			d.LastMissed = d.Fire[len(d.Fire)-max-1]
			d.Fire = slices.Clone(d.Fire[len(d.Fire)-max:])
		}
	}
	if len(d.Fire) > max {
		d.Missed += int64(len(d.Fire) - max)
		d.LastMissed = d.Fire[len(d.Fire)-max-1]
		d.Fire = d.Fire[len(d.Fire)-max:]
	}
	if t.Before(now) {
		t = now
	}
	d.Next, _ = s.Next(t)
	return d
}
