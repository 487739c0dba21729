package job

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"time"
)

// Schedule is periodic work: at each firing of its spec, the fleet submits
// its template as one job of its tenant, with the id FiringID(name, time)
// and the labels LabelSchedule and LabelFiring, so that a firing seen twice
// (two dispatchers, a failover) runs once. A schedule is stored in the
// schedules bucket (<prefix>-schedules) under its tenant and name.
type Schedule struct {
	// Name names the schedule within its tenant: 1 to 63 characters of
	// [A-Za-z0-9_-], starting and ending with a letter or digit (it is a
	// label value and a part of job ids).
	Name string `json:"name"`
	// Tenant owns the schedule and its jobs; the fleet sets it from the
	// subject or the token of the request that made it.
	Tenant string `json:"tenant,omitempty"`
	// Cron is a cron expression: 5 fields (minute hour day-of-month month
	// day-of-week), or 6 with seconds first, or @hourly, @daily,
	// @midnight, @weekly, @monthly, @yearly, @annually. One of Cron and
	// Every.
	Cron string `json:"cron,omitempty"`
	// Every fires at each multiple of the interval since the Unix epoch: a
	// whole number of seconds, at least one.
	Every *Duration `json:"every,omitempty"`
	// TimeZone is the IANA zone in which Cron is read ("Europe/Paris").
	// Defaults to UTC.
	TimeZone string `json:"time_zone,omitempty"`
	// Overlap says what a firing does while the job of the previous one
	// has not ended. Defaults to OverlapSkip.
	Overlap Overlap `json:"overlap,omitempty"`
	// CatchUpWindow bounds how late a firing may be made: firings missed
	// while no dispatcher ran are made once one runs again if they are
	// within it, and counted as missed if they are older. Defaults to
	// DefaultCatchUpWindow (1 hour).
	CatchUpWindow *Duration `json:"catch_up_window,omitempty"`
	// Paused schedules make no firing, and do not make up the ones they
	// would have made while paused.
	Paused bool `json:"paused,omitempty"`
	// End, when set, is when the schedule stops firing.
	End *time.Time `json:"end,omitempty"`
	// Template is the request each firing submits: a v2 request without
	// an id or a not_before. In the bucket and in answers, its env values
	// and inputs' contents are blank; they are sealed in Secrets.
	Template *Request `json:"template"`
	// Secrets seals the template's env values and inputs' contents, as a
	// job's record does; never in an answer.
	Secrets string `json:"secrets,omitempty"`
	// Set by the fleet: when the schedule was made and last changed, and
	// since when it fires (made, resumed, or its timing changed): firings
	// before ActiveSince are neither made nor counted as missed.
	CreatedAt   time.Time `json:"created_at,omitzero"`
	UpdatedAt   time.Time `json:"updated_at,omitzero"`
	ActiveSince time.Time `json:"active_since,omitzero"`
}

// Overlap is a schedule's overlap policy.
type Overlap string

// Overlap policies.
const (
	// OverlapAllow makes every firing's job, whatever the previous one's.
	OverlapAllow Overlap = "allow"
	// OverlapSkip skips a firing while the previous firing's job has not
	// ended; the skip is counted.
	OverlapSkip Overlap = "skip"
	// OverlapCancelPrevious cancels the previous firing's job if it has
	// not ended, and makes the new one at once.
	OverlapCancelPrevious Overlap = "cancel_previous"
)

// Valid reports whether o is a known policy.
func (o Overlap) Valid() bool {
	switch o {
	case OverlapAllow, OverlapSkip, OverlapCancelPrevious:
		return true
	}
	return false
}

// DefaultCatchUpWindow is a schedule's catch-up window when it sets none.
const DefaultCatchUpWindow = time.Hour

// Labels of a firing's job.
const (
	// LabelSchedule names the schedule that made the job.
	LabelSchedule = "schedule.fleet.dev/name"
	// LabelFiring is the firing's time, as in the job's id.
	LabelFiring = "schedule.fleet.dev/time"
)

// FiringLayout formats a firing's time, in UTC, in job ids and labels:
// 20261108T063000Z.
const FiringLayout = "20060102T150405Z"

// FiringID is the job id of a schedule's firing at t.
func FiringID(schedule string, t time.Time) string {
	return schedule + "-" + t.UTC().Format(FiringLayout)
}

var scheduleNameRE = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_]{0,61}[A-Za-z0-9])?$`)

// ValidScheduleName reports whether s may name a schedule.
func ValidScheduleName(s string) bool { return scheduleNameRE.MatchString(s) }

// FiringOutcome is what became of one firing.
type FiringOutcome string

// Firing outcomes; the first three are the outcome label of
// fleet_schedule_firings_total.
const (
	FiringMade    FiringOutcome = "made"
	FiringSkipped FiringOutcome = "skipped_overlap"
	FiringMissed  FiringOutcome = "missed"
	// FiringRejected is a firing whose job the dispatcher refused (its
	// pool has no worker that could run it, say).
	FiringRejected FiringOutcome = "rejected"
)

// Firing is one firing of a schedule, or, for missed ones, the latest of a
// run of them (Count says how many).
type Firing struct {
	// At is the firing's time.
	At      time.Time     `json:"at"`
	Outcome FiringOutcome `json:"outcome"`
	// JobID and Pool name the job a made firing queued, or, for a skipped
	// one, the job it waited for.
	JobID string `json:"job_id,omitempty"`
	Pool  string `json:"pool,omitempty"`
	// QueuedAt is when the firing's job was queued; QueuedAt - At is how
	// late the firing was.
	QueuedAt *time.Time `json:"queued_at,omitempty"`
	// Cancelled is the previous firing's job that cancel_previous
	// cancelled.
	Cancelled string `json:"cancelled,omitempty"`
	Count     int    `json:"count,omitempty"`
	Error     string `json:"error,omitempty"`
	// State is the job's state when the schedule was shown.
	State State `json:"state,omitempty"`
}

// ScheduleState is what the dispatchers record about a schedule as it
// fires, in the schedules bucket beside it.
type ScheduleState struct {
	// Created is the CreatedAt of the schedule this state is of: a state
	// left by an earlier schedule of the same name is not this one's.
	Created time.Time `json:"created"`
	// Last is the latest firing dealt with: made, skipped or missed.
	Last *time.Time `json:"last,omitempty"`
	// Previous is the job of the latest firing made, which the overlap
	// policy looks at.
	Previous *Firing `json:"previous,omitempty"`
	// Counts of firings since the schedule was made.
	Made     int64 `json:"made"`
	Skipped  int64 `json:"skipped_overlap"`
	Missed   int64 `json:"missed"`
	Rejected int64 `json:"rejected,omitempty"`
	// Recent are the latest firings, oldest first (at most
	// MaxRecentFirings).
	Recent []Firing `json:"recent,omitempty"`
}

// MaxRecentFirings bounds ScheduleState.Recent.
const MaxRecentFirings = 10

// ScheduleInfo is the answer about one schedule: the schedule, what its
// firings did, and when it fires next.
type ScheduleInfo struct {
	Schedule *Schedule     `json:"schedule"`
	State    ScheduleState `json:"state"`
	// Status is active, paused or ended.
	Status string `json:"status"`
	// Next are the next firings, in the schedule's zone (five for show,
	// one in a list).
	Next []time.Time `json:"next,omitempty"`
}

// Schedule statuses.
const (
	ScheduleActive = "active"
	SchedulePaused = "paused"
	ScheduleEnded  = "ended"
)

// ScheduleList is the answer to a list: a tenant's schedules by name.
type ScheduleList struct {
	Schedules []*ScheduleInfo `json:"schedules"`
}

// DecodeSchedule decodes a schedule as a producer writes it, strictly:
// unknown fields, trailing data and wrong types are errors, each naming
// its field; the template is decoded as a request is (DecodeRequest), its
// errors prefixed with "template"; a document without one has a nil
// Template (an update keeps the schedule's). The fields the fleet sets (tenant
// aside, which it checks) are ignored, so that a schedule shown can be
// sent back changed. It does not validate values.
func DecodeSchedule(data []byte, l Limits) (*Schedule, error) {
	l = l.WithDefaults()
	if len(data) > l.MaxRequestBytes {
		return nil, &TooLargeError{What: "schedule", Size: len(data), Limit: l.MaxRequestBytes}
	}
	if t := bytes.TrimLeft(data, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return nil, errors.New("invalid schedule: expected a JSON object")
	}
	var doc struct {
		Name          string          `json:"name"`
		Tenant        string          `json:"tenant"`
		Cron          string          `json:"cron"`
		Every         json.RawMessage `json:"every"`
		TimeZone      string          `json:"time_zone"`
		Overlap       Overlap         `json:"overlap"`
		CatchUpWindow json.RawMessage `json:"catch_up_window"`
		Paused        bool            `json:"paused"`
		End           json.RawMessage `json:"end"`
		Template      json.RawMessage `json:"template"`
		// Set by the fleet; ignored.
		Secrets     json.RawMessage `json:"secrets"`
		CreatedAt   json.RawMessage `json:"created_at"`
		UpdatedAt   json.RawMessage `json:"updated_at"`
		ActiveSince json.RawMessage `json:"active_since"`
	}
	if err := decodeStrict(data, &doc); err != nil {
		return nil, fmt.Errorf("invalid schedule: %w", err)
	}
	s := &Schedule{Name: doc.Name, Tenant: doc.Tenant, Cron: doc.Cron, TimeZone: doc.TimeZone,
		Overlap: doc.Overlap, Paused: doc.Paused}
	durationOf := func(field string, raw json.RawMessage) (*Duration, error) {
		if len(raw) == 0 || string(raw) == "null" {
			return nil, nil
		}
		var d Duration
		if err := json.Unmarshal(raw, &d); err != nil {
			return nil, fmt.Errorf("invalid schedule: %s: %w", field, err)
		}
		return &d, nil
	}
	var err error
	if s.Every, err = durationOf("every", doc.Every); err != nil {
		return nil, err
	}
	if s.CatchUpWindow, err = durationOf("catch_up_window", doc.CatchUpWindow); err != nil {
		return nil, err
	}
	if len(doc.End) > 0 && string(doc.End) != "null" {
		var end time.Time
		if err := json.Unmarshal(doc.End, &end); err != nil {
			return nil, fmt.Errorf("invalid schedule: end: must be an RFC 3339 time such as 2026-12-01T09:30:00Z, got %s", truncate(string(doc.End), 40))
		}
		s.End = &end
	}
	if len(doc.Template) > 0 && string(doc.Template) != "null" {
		if s.Template, err = DecodeRequest(doc.Template, l); err != nil {
			return nil, fmt.Errorf("invalid schedule: template: %w", err)
		}
	}
	return s, nil
}
