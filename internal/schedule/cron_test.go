package schedule

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestParseCronReadsEveryFormOfField(t *testing.T) {
	cases := []struct {
		expr string
		want string // six fields, each the values matched
	}{
		{"* * * * *", "0 " + seq(0, 59) + " " + seq(0, 23) + " " + seq(1, 31) + " " + seq(1, 12) + " " + seq(0, 6)},
		{"30 2 * * *", "0 30 2 " + seq(1, 31) + " " + seq(1, 12) + " " + seq(0, 6)},
		{"*/15 9-17 * * mon-FRI", "0 0,15,30,45 " + seq(9, 17) + " " + seq(1, 31) + " " + seq(1, 12) + " 1,2,3,4,5"},
		{"*/10 * * * * *", "0,10,20,30,40,50 " + seq(0, 59) + " " + seq(0, 23) + " " + seq(1, 31) + " " + seq(1, 12) + " " + seq(0, 6)},
		{"5/20 1 1,15 JAN-MAR,dec 7", "0 5,25,45 1 1,15 1,2,3,12 0"},
		{"0 0 ? * SAT-SUN", "0 0 0 " + seq(1, 31) + " " + seq(1, 12) + " 0,6"},
		{"0 0 * * 5-7", "0 0 0 " + seq(1, 31) + " " + seq(1, 12) + " 0,5,6"},
		{"1-10/3 0 0 1 * *", "1,4,7,10 0 0 1 " + seq(1, 12) + " " + seq(0, 6)},
		{"@hourly", "0 0 " + seq(0, 23) + " " + seq(1, 31) + " " + seq(1, 12) + " " + seq(0, 6)},
		{"@Daily", "0 0 0 " + seq(1, 31) + " " + seq(1, 12) + " " + seq(0, 6)},
		{"@weekly", "0 0 0 " + seq(1, 31) + " " + seq(1, 12) + " 0"},
		{"@monthly", "0 0 0 1 " + seq(1, 12) + " " + seq(0, 6)},
		{"@yearly", "0 0 0 1 1 " + seq(0, 6)},
		{"  0   12  *  *  *  ", "0 0 12 " + seq(1, 31) + " " + seq(1, 12) + " " + seq(0, 6)},
	}
	for _, c := range cases {
		got, err := ParseCron(c.expr)
		if err != nil {
			t.Errorf("%q: %v", c.expr, err)
			continue
		}
		if got.String() != c.want {
			t.Errorf("%q:\n got %s\nwant %s", c.expr, got, c.want)
		}
	}
}

func seq(lo, hi int) string {
	var b strings.Builder
	for v := lo; v <= hi; v++ {
		if v > lo {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(v))
	}
	return b.String()
}

func TestParseCronNamesTheFieldAtFault(t *testing.T) {
	cases := []struct{ expr, want string }{
		{"", `has 0 fields`},
		{"* * * *", `has 4 fields: use 5`},
		{"* * * * * * *", `has 7 fields`},
		{"61 * * * *", `minute "61": 61 is out of 0-59`},
		{"* 24 * * *", `hour "24": 24 is out of 0-23`},
		{"* * 0 * *", `day-of-month "0": 0 is out of 1-31`},
		{"* * * 13 *", `month "13": 13 is out of 1-12`},
		{"* * * * 8", `day-of-week "8": 8 is out of 0-7`},
		{"60 * * * * *", `second "60": 60 is out of 0-59`},
		{"*/0 * * * *", `minute "*/0": step "0" must be a positive number`},
		{"*/x * * * *", `step "x" must be a positive number`},
		{"*/60 * * * *", `minute "*/60": step 60 is over the field's range, 0-59`},
		{"0 0 1/31 * *", `day-of-month "1/31": step 31 is over the field's range, 1-31`},
		{"5-1 * * * *", `minute "5-1": range 5-1 runs backwards`},
		{"1,,2 * * * *", `an empty item in its list`},
		{"* * * foo *", `month "foo": "foo" is neither a number nor a name of a month`},
		{"* * * * funday", `"funday" is neither a number nor a name of a day-of-week`},
		{"a * * * *", `minute "a": "a" is not a number`},
		{"? * * * *", `minute "?": "?" is not a number`},
		{"@every 5s", `is not one of @yearly`},
		{"@often", `is not one of @yearly`},
		{"0 0 30 2 *", `never fires`},
		{"0 0 31 4,6,9,11 *", `never fires`},
	}
	for _, c := range cases {
		_, err := ParseCron(c.expr)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want one with %q", c.expr, err, c.want)
		}
	}
}

// nextN lists the next n firings of expr in zone after the given time.
func nextN(t *testing.T, expr, zone string, after time.Time, n int) []time.Time {
	t.Helper()
	c, err := ParseCron(expr)
	if err != nil {
		t.Fatal(err)
	}
	loc, err := time.LoadLocation(zone)
	if err != nil {
		t.Fatal(err)
	}
	s := &Spec{cron: c, loc: loc}
	return s.NextN(after, n)
}

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t.UTC()
}

func equalTimes(t *testing.T, what string, got []time.Time, want ...string) {
	t.Helper()
	var g []string
	for _, x := range got {
		g = append(g, x.UTC().Format(time.RFC3339))
	}
	if strings.Join(g, " ") != strings.Join(want, " ") {
		t.Errorf("%s:\n got %v\nwant %v", what, g, want)
	}
}

func TestCronNextInUTC(t *testing.T) {
	equalTimes(t, "daily at 03:00", nextN(t, "0 3 * * *", "UTC", utc("2026-01-01T03:00:00Z"), 2),
		"2026-01-02T03:00:00Z", "2026-01-03T03:00:00Z")
	equalTimes(t, "every 20 s", nextN(t, "*/20 * * * * *", "UTC", utc("2026-01-01T00:00:30Z"), 3),
		"2026-01-01T00:00:40Z", "2026-01-01T00:01:00Z", "2026-01-01T00:01:20Z")
	// After a time with a fraction of a second, the next whole one.
	equalTimes(t, "every second", nextN(t, "* * * * * *", "UTC", utc("2026-01-01T00:00:00Z").Add(400*time.Millisecond), 2),
		"2026-01-01T00:00:01Z", "2026-01-01T00:00:02Z")
	equalTimes(t, "at the end of a year", nextN(t, "0 0 1 1 *", "UTC", utc("2026-06-15T12:00:00Z"), 2),
		"2027-01-01T00:00:00Z", "2028-01-01T00:00:00Z")
	equalTimes(t, "Feb 29", nextN(t, "0 0 29 2 *", "UTC", utc("2025-03-01T00:00:00Z"), 2),
		"2028-02-29T00:00:00Z", "2032-02-29T00:00:00Z")
	// Both day fields restricted: either matches (the 13th, or a Friday).
	equalTimes(t, "13th or Friday", nextN(t, "0 0 13 * FRI", "UTC", utc("2026-02-01T00:00:00Z"), 4),
		"2026-02-06T00:00:00Z", "2026-02-13T00:00:00Z", "2026-02-20T00:00:00Z", "2026-02-27T00:00:00Z")
	// One of them unrestricted: the other alone decides.
	equalTimes(t, "Mondays", nextN(t, "0 0 * * 1", "UTC", utc("2026-02-01T00:00:00Z"), 2),
		"2026-02-02T00:00:00Z", "2026-02-09T00:00:00Z")
	equalTimes(t, "day 1-31 and Mondays", nextN(t, "0 0 1-31 * MON", "UTC", utc("2026-02-01T00:00:00Z"), 1),
		"2026-02-02T00:00:00Z")
	equalTimes(t, "31st", nextN(t, "0 0 31 * *", "UTC", utc("2026-01-31T00:00:00Z"), 2),
		"2026-03-31T00:00:00Z", "2026-05-31T00:00:00Z")
}

// In America/New_York in 2026 the clock goes from 02:00 EST to 03:00 EDT
// on March 8, and from 02:00 EDT back to 01:00 EST on November 1. A fixed
// clock: each daily firing comes once a day, none twice, none skipped.
func TestCronAcrossDaylightSavingChanges(t *testing.T) {
	ny := "America/New_York"
	equalTimes(t, "02:30 daily, spring forward (no 02:30 on March 8: 03:30 EDT)",
		nextN(t, "30 2 * * *", ny, utc("2026-03-07T12:00:00Z"), 3),
		"2026-03-08T07:30:00Z", "2026-03-09T06:30:00Z", "2026-03-10T06:30:00Z")
	equalTimes(t, "02:00 daily, spring forward (03:00 EDT)",
		nextN(t, "0 2 * * *", ny, utc("2026-03-07T12:00:00Z"), 2),
		"2026-03-08T07:00:00Z", "2026-03-09T06:00:00Z")
	equalTimes(t, "01:30 daily, fall back (the first 01:30 only)",
		nextN(t, "30 1 * * *", ny, utc("2026-10-31T12:00:00Z"), 3),
		"2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z", "2026-11-03T06:30:00Z")
	equalTimes(t, "01:30 daily, after the first 01:30 on the fall-back night",
		nextN(t, "30 1 * * *", ny, utc("2026-11-01T05:30:00Z"), 1), "2026-11-02T06:30:00Z")
	equalTimes(t, "01:30 daily, from within the repeated hour",
		nextN(t, "30 1 * * *", ny, utc("2026-11-01T06:10:00Z"), 1), "2026-11-02T06:30:00Z")
	equalTimes(t, "every half hour, fall back: the wall times of the repeated hour once",
		nextN(t, "*/30 * * * *", ny, utc("2026-11-01T03:59:00Z"), 6),
		"2026-11-01T04:00:00Z", "2026-11-01T04:30:00Z", "2026-11-01T05:00:00Z", "2026-11-01T05:30:00Z",
		"2026-11-01T07:00:00Z", "2026-11-01T07:30:00Z")
	equalTimes(t, "every half hour, spring forward: every instant once",
		nextN(t, "*/30 * * * *", ny, utc("2026-03-08T04:59:00Z"), 7),
		"2026-03-08T05:00:00Z", "2026-03-08T05:30:00Z", "2026-03-08T06:00:00Z", "2026-03-08T06:30:00Z",
		"2026-03-08T07:00:00Z", "2026-03-08T07:30:00Z", "2026-03-08T08:00:00Z")
	equalTimes(t, "each quarter of 02:xx, spring forward: each once, an hour on",
		nextN(t, "*/15 2 * * *", ny, utc("2026-03-08T05:00:00Z"), 5),
		"2026-03-08T07:00:00Z", "2026-03-08T07:15:00Z", "2026-03-08T07:30:00Z", "2026-03-08T07:45:00Z",
		"2026-03-09T06:00:00Z")
	equalTimes(t, "seconds field, fall back",
		nextN(t, "0 59 1 * * *", ny, utc("2026-11-01T05:00:00Z"), 2),
		"2026-11-01T05:59:00Z", "2026-11-02T06:59:00Z")
	// Europe/Paris, 2026: 02:00 CET → 03:00 CEST on March 29, 03:00 CEST →
	// 02:00 CET on October 25.
	equalTimes(t, "Paris 02:30, spring forward and fall back",
		append(nextN(t, "30 2 * * *", "Europe/Paris", utc("2026-03-28T12:00:00Z"), 2),
			nextN(t, "30 2 * * *", "Europe/Paris", utc("2026-10-24T12:00:00Z"), 2)...),
		"2026-03-29T01:30:00Z", "2026-03-30T00:30:00Z", "2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z")
	// Lord Howe moves its clock by half an hour: 02:00 → 02:30 on October
	// 4, 2026.
	equalTimes(t, "Lord Howe 02:15, a half-hour change",
		nextN(t, "15 2 * * *", "Australia/Lord_Howe", utc("2026-10-03T00:00:00Z"), 2),
		"2026-10-03T15:45:00Z", "2026-10-04T15:15:00Z")
	// Samoa skipped December 30, 2011 (from UTC-10 to UTC+14): noon of the
	// day that did not exist is noon of the 31st, once.
	equalTimes(t, "Apia noon across the skipped day",
		nextN(t, "0 12 * * *", "Pacific/Apia", utc("2011-12-29T00:00:00Z"), 3),
		"2011-12-29T22:00:00Z", "2011-12-30T22:00:00Z", "2011-12-31T22:00:00Z")
}

func FuzzParseCron(f *testing.F) {
	for _, s := range []string{"* * * * *", "*/5 1-3 1,15 JAN-MAR MON-FRI", "0 0 29 2 *", "@daily", "1-10/3 0 0 1 * *"} {
		f.Add(s)
	}
	loc, _ := time.LoadLocation("America/New_York")
	f.Fuzz(func(t *testing.T, expr string) {
		c, err := ParseCron(expr)
		if err != nil {
			return
		}
		s := &Spec{cron: c, loc: loc}
		prev := utc("2026-03-07T00:00:00Z")
		for _, n := range s.NextN(prev, 5) {
			if !n.After(prev) {
				t.Fatalf("%q: %s after %s", expr, n, prev)
			}
			prev = n
		}
	})
}
