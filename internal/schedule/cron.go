package schedule

import (
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"time"
)

// Cron is a parsed cron expression: the values of each field it matches.
// Its methods work on wall-clock times written as UTC times; Spec reads
// them in a zone.
//
// The syntax is Vixie cron's: 5 fields (minute hour day-of-month month
// day-of-week) or 6 with seconds first; in each field *, a value, a range
// a-b, a list a,b,c, a step */n, a-b/n or a/n (a to the field's end);
// months JAN-DEC and days SUN-SAT by name, in any case; day-of-week 0 or 7
// for Sunday; ? as * in the day fields; and the macros @yearly
// (@annually), @monthly, @weekly, @daily (@midnight) and @hourly. As in
// Vixie cron, when both day fields are restricted (neither matches every
// day) a day matches if either does.
type Cron struct {
	second, minute, hour, dom, month, dow uint64
	// domAll and dowAll: the field matches every day.
	domAll, dowAll bool
}

type field struct {
	name     string
	min, max int
	names    map[string]int
}

var cronFields = [6]field{
	{name: "second", min: 0, max: 59},
	{name: "minute", min: 0, max: 59},
	{name: "hour", min: 0, max: 23},
	{name: "day-of-month", min: 1, max: 31},
	{name: "month", min: 1, max: 12, names: map[string]int{
		"jan": 1, "feb": 2, "mar": 3, "apr": 4, "may": 5, "jun": 6,
		"jul": 7, "aug": 8, "sep": 9, "oct": 10, "nov": 11, "dec": 12}},
	{name: "day-of-week", min: 0, max: 7, names: map[string]int{
		"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6}},
}

const (
	fieldDOM = 3
	fieldDOW = 5
)

var macros = map[string]string{
	"@yearly":   "0 0 0 1 1 *",
	"@annually": "0 0 0 1 1 *",
	"@monthly":  "0 0 0 1 * *",
	"@weekly":   "0 0 0 * * 0",
	"@daily":    "0 0 0 * * *",
	"@midnight": "0 0 0 * * *",
	"@hourly":   "0 0 * * * *",
}

// ParseCron parses a cron expression. Its errors name the field at fault.
func ParseCron(expr string) (*Cron, error) {
	e := strings.TrimSpace(expr)
	if strings.HasPrefix(e, "@") {
		m, ok := macros[strings.ToLower(e)]
		if !ok {
			return nil, fmt.Errorf("%q is not one of @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly (for an interval, use every)", e)
		}
		e = m
	}
	fs := strings.Fields(e)
	switch len(fs) {
	case 5:
		fs = append([]string{"0"}, fs...)
	case 6:
	default:
		return nil, fmt.Errorf("%q has %d fields: use 5 (minute hour day-of-month month day-of-week) or 6 (second first)", expr, len(fs))
	}
	var c Cron
	sets := [6]*uint64{&c.second, &c.minute, &c.hour, &c.dom, &c.month, &c.dow}
	for i, f := range fs {
		v, err := parseField(f, cronFields[i], i)
		if err != nil {
			return nil, fmt.Errorf("%s %q: %w", cronFields[i].name, f, err)
		}
		*sets[i] = v
	}
	if c.dow&(1<<7) != 0 { // 7 is Sunday too
		c.dow = c.dow&^(1<<7) | 1
	}
	c.domAll = c.dom == span(1, 31)
	c.dowAll = c.dow == span(0, 6)
	// A leap year and the ten after it hold every day a calendar can.
	if _, ok := c.nextWall(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC), 11); !ok {
		return nil, fmt.Errorf("%q never fires: no month has the days it names", expr)
	}
	return &c, nil
}

// span is the set of the values lo to hi.
func span(lo, hi int) uint64 { return (1<<(hi-lo+1) - 1) << lo }

func parseField(s string, f field, index int) (uint64, error) {
	var set uint64
	for _, part := range strings.Split(s, ",") {
		if part == "" {
			return 0, errors.New("an empty item in its list")
		}
		rng, stepText, stepped := strings.Cut(part, "/")
		step := 1
		if stepped {
			n, err := strconv.Atoi(stepText)
			if err != nil || n < 1 {
				return 0, fmt.Errorf("step %q must be a positive number", stepText)
			}
			if n > f.max-f.min {
				return 0, fmt.Errorf("step %d is over the field's range, %d-%d", n, f.min, f.max)
			}
			step = n
		}
		var lo, hi int
		switch {
		case rng == "*" || (rng == "?" && (index == fieldDOM || index == fieldDOW)):
			lo, hi = f.min, f.max
			if index == fieldDOW {
				hi = 6
			}
		case strings.Contains(rng, "-"):
			a, b, _ := strings.Cut(rng, "-")
			var err error
			if lo, err = value(a, f); err != nil {
				return 0, err
			}
			if hi, err = value(b, f); err != nil {
				return 0, err
			}
			if index == fieldDOW && hi == 0 && lo > 0 {
				hi = 7 // MON-SUN
			}
			if lo > hi {
				return 0, fmt.Errorf("range %s runs backwards", rng)
			}
		default:
			v, err := value(rng, f)
			if err != nil {
				return 0, err
			}
			lo, hi = v, v
			if stepped {
				hi = f.max
			}
		}
		for v := lo; v <= hi; v += step {
			set |= 1 << v
		}
	}
	return set, nil
}

func value(s string, f field) (int, error) {
	if v, ok := f.names[strings.ToLower(s)]; ok {
		return v, nil
	}
	v, err := strconv.Atoi(s)
	if err != nil {
		if f.names != nil {
			return 0, fmt.Errorf("%q is neither a number nor a name of a %s", s, f.name)
		}
		return 0, fmt.Errorf("%q is not a number", s)
	}
	if v < f.min || v > f.max {
		return 0, fmt.Errorf("%d is out of %d-%d", v, f.min, f.max)
	}
	return v, nil
}

func has(set uint64, v int) bool { return set&(1<<uint(v)) != 0 }

func (c *Cron) dayMatches(t time.Time) bool {
	dom, dow := has(c.dom, t.Day()), has(c.dow, int(t.Weekday()))
	if c.domAll || c.dowAll {
		return dom && dow
	}
	return dom || dow
}

// nextWall returns the first wall-clock time at or after t (a UTC time,
// whole seconds) that the expression matches, looking up to years years
// ahead.
func (c *Cron) nextWall(t time.Time, years int) (time.Time, bool) {
	limit := t.Year() + years
wrap:
	for t.Year() <= limit {
		for !has(c.month, int(t.Month())) {
			t = time.Date(t.Year(), t.Month()+1, 1, 0, 0, 0, 0, time.UTC)
			if t.Month() == time.January {
				continue wrap
			}
		}
		for !c.dayMatches(t) {
			t = time.Date(t.Year(), t.Month(), t.Day()+1, 0, 0, 0, 0, time.UTC)
			if t.Day() == 1 {
				continue wrap
			}
		}
		for !has(c.hour, t.Hour()) {
			t = t.Truncate(time.Hour).Add(time.Hour)
			if t.Hour() == 0 {
				continue wrap
			}
		}
		for !has(c.minute, t.Minute()) {
			t = t.Truncate(time.Minute).Add(time.Minute)
			if t.Minute() == 0 {
				continue wrap
			}
		}
		for !has(c.second, t.Second()) {
			t = t.Add(time.Second)
			if t.Second() == 0 {
				continue wrap
			}
		}
		return t, true
	}
	return time.Time{}, false
}

// String writes the expression back, six fields, for tests and logs.
func (c *Cron) String() string {
	sets := [6]uint64{c.second, c.minute, c.hour, c.dom, c.month, c.dow}
	out := make([]string, 6)
	for i, s := range sets {
		var vals []string
		for s != 0 {
			v := bits.TrailingZeros64(s)
			vals = append(vals, strconv.Itoa(v))
			s &^= 1 << v
		}
		out[i] = strings.Join(vals, ",")
	}
	return strings.Join(out, " ")
}
