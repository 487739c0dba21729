package schedule

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/job"
)

func every(d time.Duration) *job.Duration { x := job.Duration(d); return &x }

func mustSpec(t *testing.T, s *job.Schedule) *Spec {
	t.Helper()
	if s.Template == nil {
		s.Template = &job.Request{Command: []string{"true"}}
	}
	if s.Name == "" {
		s.Name = "nightly"
	}
	spec, err := Validate(s, job.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	return spec
}

func TestEveryFiresAtMultiplesOfItsInterval(t *testing.T) {
	s := mustSpec(t, &job.Schedule{Every: every(2 * time.Second)})
	equalTimes(t, "every 2s", s.NextN(utc("2026-01-01T00:00:01Z").Add(300*time.Millisecond), 3),
		"2026-01-01T00:00:02Z", "2026-01-01T00:00:04Z", "2026-01-01T00:00:06Z")
	equalTimes(t, "every 2s from a firing", s.NextN(utc("2026-01-01T00:00:02Z"), 1), "2026-01-01T00:00:04Z")
	h := mustSpec(t, &job.Schedule{Every: every(90 * time.Minute), TimeZone: "Asia/Kolkata"})
	equalTimes(t, "every 90m", h.NextN(utc("2026-01-01T00:10:00Z"), 2), "2026-01-01T01:30:00Z", "2026-01-01T03:00:00Z")
	if z, _ := h.NextN(utc("2026-01-01T00:10:00Z"), 1)[0].Zone(); z != "IST" {
		t.Errorf("firings are not shown in the schedule's zone: %s", z)
	}
}

func TestEndStopsTheFirings(t *testing.T) {
	end := utc("2026-01-01T00:00:05Z")
	s := mustSpec(t, &job.Schedule{Every: every(time.Second), End: &end})
	equalTimes(t, "up to the end", s.NextN(utc("2026-01-01T00:00:02Z"), 10),
		"2026-01-01T00:00:03Z", "2026-01-01T00:00:04Z", "2026-01-01T00:00:05Z")
	if _, ok := s.Next(end); ok {
		t.Error("a firing after the end")
	}
	d := s.Due(utc("2026-01-01T00:00:00Z"), utc("2026-01-01T00:01:00Z"), 10*time.Second, MaxCatchUp)
	if len(d.Fire) != 0 || d.Missed != 5 || !d.Next.IsZero() {
		t.Errorf("a minute later, with the end 55 s back and a 10 s window: %+v", d)
	}
}

// A fixed clock: firings after from and at or before now; those within the
// window are made, older ones missed.
func TestDueMakesUpTheWindowAndCountsTheRestMissed(t *testing.T) {
	s := mustSpec(t, &job.Schedule{Every: every(time.Second)})
	from := utc("2026-01-01T00:00:00Z")
	now := from.Add(10*time.Second + 300*time.Millisecond)
	d := s.Due(from, now, 5*time.Second, MaxCatchUp)
	// 00:01..00:05 are older than 00:10.3 - 5 s; 00:06..00:10 are within.
	equalTimes(t, "made up", d.Fire, "2026-01-01T00:00:06Z", "2026-01-01T00:00:07Z", "2026-01-01T00:00:08Z",
		"2026-01-01T00:00:09Z", "2026-01-01T00:00:10Z")
	if d.Missed != 5 || !d.LastMissed.Equal(from.Add(5*time.Second)) {
		t.Errorf("missed %d, the last at %s; want 5, 00:05", d.Missed, d.LastMissed)
	}
	if !d.Next.Equal(from.Add(11 * time.Second)) {
		t.Errorf("next %s", d.Next)
	}

	// On time: the one firing due, nothing missed.
	d = s.Due(from, from.Add(time.Second+2*time.Millisecond), 5*time.Second, MaxCatchUp)
	if len(d.Fire) != 1 || d.Missed != 0 || !d.Next.Equal(from.Add(2*time.Second)) {
		t.Errorf("on time: %+v", d)
	}
	// Nothing due yet.
	d = s.Due(from, from.Add(500*time.Millisecond), 5*time.Second, MaxCatchUp)
	if len(d.Fire) != 0 || d.Missed != 0 || !d.Next.Equal(from.Add(time.Second)) {
		t.Errorf("early: %+v", d)
	}

	// More in the window than one pass makes up: the latest MaxCatchUp.
	d = s.Due(from, from.Add(time.Hour), 2*time.Hour, MaxCatchUp)
	if len(d.Fire) != MaxCatchUp || d.Missed != 3600-MaxCatchUp || !d.Fire[MaxCatchUp-1].Equal(from.Add(time.Hour)) {
		t.Errorf("an hour of every second: %d made, %d missed, last %s", len(d.Fire), d.Missed, d.Fire[len(d.Fire)-1])
	}

	// A cron expression, the same way: every minute, 10 minutes late, a
	// 3 minute window.
	c := mustSpec(t, &job.Schedule{Cron: "* * * * *", TimeZone: "Europe/Paris"})
	d = c.Due(from, from.Add(10*time.Minute+time.Second), 3*time.Minute, MaxCatchUp)
	equalTimes(t, "cron made up", d.Fire, "2026-01-01T00:08:00Z", "2026-01-01T00:09:00Z", "2026-01-01T00:10:00Z")
	if d.Missed != 7 {
		t.Errorf("cron: %d missed, want 7", d.Missed)
	}
	// A year of every second missed, counted by arithmetic; a firing a
	// whole window old is within it.
	d = s.Due(from, from.AddDate(1, 0, 0), time.Minute, MaxCatchUp)
	if len(d.Fire) != 61 || d.Missed != 365*86400-61 {
		t.Errorf("a year late: %d made, %d missed", len(d.Fire), d.Missed)
	}
}

// Bad input is refused with the field at fault named.
func TestValidateNamesTheField(t *testing.T) {
	ok := func() *job.Schedule {
		return &job.Schedule{Name: "nightly", Cron: "0 3 * * *", Template: &job.Request{Command: []string{"make"}}}
	}
	cases := []struct {
		what   string
		change func(*job.Schedule)
		want   string
	}{
		{"invalid cron", func(s *job.Schedule) { s.Cron = "61 * * * *" }, `cron: minute "61": 61 is out of 0-59`},
		{"cron of 4 fields", func(s *job.Schedule) { s.Cron = "* * * *" }, `cron: "* * * *" has 4 fields`},
		{"unknown zone", func(s *job.Schedule) { s.TimeZone = "Mars/Olympus_Mons" }, `time_zone: "Mars/Olympus_Mons" is not an IANA time zone`},
		{"Local zone", func(s *job.Schedule) { s.TimeZone = "Local" }, `time_zone: Local is whichever zone`},
		{"every under 1s", func(s *job.Schedule) { s.Cron, s.Every = "", every(500*time.Millisecond) }, `every: 500ms is under the minimum of 1s`},
		{"every of a fraction", func(s *job.Schedule) { s.Cron, s.Every = "", every(1500*time.Millisecond) }, `every: 1.5s is not a whole number of seconds`},
		{"both", func(s *job.Schedule) { s.Every = every(time.Minute) }, `every: give cron or every, not both`},
		{"neither", func(s *job.Schedule) { s.Cron = "" }, `cron: give cron or every`},
		{"bad name", func(s *job.Schedule) { s.Name = "-nightly" }, `name: "-nightly" must be 1 to 63 characters`},
		{"dotted name", func(s *job.Schedule) { s.Name = "a.b" }, `name: "a.b"`},
		{"long name", func(s *job.Schedule) { s.Name = strings.Repeat("a", 64) }, `name: `},
		{"overlap", func(s *job.Schedule) { s.Overlap = "sometimes" }, `overlap: "sometimes" must be allow, skip or cancel_previous`},
		{"window", func(s *job.Schedule) { s.CatchUpWindow = every(time.Millisecond) }, `catch_up_window: 1ms must be from 1s to 168h0m0s`},
		{"no template", func(s *job.Schedule) { s.Template = nil }, `template: missing`},
		{"invalid template", func(s *job.Schedule) { s.Template.Priority = 9 }, `template.priority: 9 must be from 1`},
		{"template pool", func(s *job.Schedule) { s.Template.Pool = "a b" }, `template.pool: "a b"`},
		{"template with an id", func(s *job.Schedule) { s.Template.ID = "x" }, `template.id: must be empty: each firing's job has the id <schedule>-<time>, such as nightly-20260102T030405Z`},
		{"template with not_before", func(s *job.Schedule) { now := time.Now(); s.Template.NotBefore = &now }, `template.not_before: must be empty`},
		{"template with the fleet's labels", func(s *job.Schedule) { s.Template.Labels = map[string]string{job.LabelSchedule: "x"} }, `template.labels: schedule.fleet.dev/name`},
	}
	for _, c := range cases {
		s := ok()
		c.change(s)
		_, err := Validate(s, job.Limits{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.what, err, c.want)
		}
	}
	if _, err := Validate(ok(), job.Limits{}); err != nil {
		t.Errorf("a valid schedule: %v", err)
	}
}

func TestDecodeScheduleNamesTheField(t *testing.T) {
	cases := []struct{ doc, want string }{
		{`{"name":"n","crn":"* * * * *","template":{"command":["true"]}}`, `unknown field "crn"`},
		{`{"name":"n","every":"2 seconds","template":{"command":["true"]}}`, `every: "2 seconds" is not a duration`},
		{`{"name":"n","every":2,"template":{"command":["true"]}}`, `every: duration must be a string`},
		{`{"name":"n","catch_up_window":"soon","template":{"command":["true"]}}`, `catch_up_window: "soon" is not a duration`},
		{`{"name":"n","every":"2s","end":"tomorrow","template":{"command":["true"]}}`, `end: must be an RFC 3339 time`},
		{`{"name":"n","every":"2s","template":{"comand":["true"]}}`, `template: invalid request: json: unknown field "comand"`},
		{`{"name":"n","every":"2s","template":{"timeout":"forever"}}`, `template: invalid request: timeout: "forever" is not a duration`},
		{`[]`, `expected a JSON object`},
	}
	for _, c := range cases {
		_, err := job.DecodeSchedule([]byte(c.doc), job.Limits{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.doc, err, c.want)
		}
	}
	// A schedule as the fleet shows it decodes back, the fleet's own
	// fields ignored.
	shown := `{"name":"n","tenant":"acme","every":"2s","template":{"command":["true"]},"secrets":"seal-1:x",
		"created_at":"2026-01-01T00:00:00Z","updated_at":"2026-01-01T00:00:00Z","active_since":"2026-01-01T00:00:00Z"}`
	s, err := job.DecodeSchedule([]byte(shown), job.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if s.Secrets != "" || !s.CreatedAt.IsZero() || s.Tenant != "acme" || s.Every.Std() != 2*time.Second {
		t.Errorf("decoded %+v", s)
	}
	out, _ := json.Marshal(s)
	if strings.Contains(string(out), "created_at") {
		t.Errorf("zero times are written: %s", out)
	}
}

func TestFiringIsTheTemplateWithItsIDAndLabels(t *testing.T) {
	s := &job.Schedule{Name: "nightly", Template: &job.Request{Command: []string{"make"}, Labels: map[string]string{"team": "build"}}}
	at := utc("2026-11-01T05:30:00Z")
	r := Firing(s, at)
	if r.ID != "nightly-20261101T053000Z" || !job.ValidID(r.ID) {
		t.Errorf("id %q", r.ID)
	}
	if r.Labels["team"] != "build" || r.Labels[job.LabelSchedule] != "nightly" || r.Labels[job.LabelFiring] != "20261101T053000Z" {
		t.Errorf("labels %v", r.Labels)
	}
	if len(s.Template.Labels) != 1 || s.Template.ID != "" {
		t.Error("the template was changed")
	}
	if err := r.Validate(job.Limits{}); err != nil {
		t.Error(err)
	}
}
