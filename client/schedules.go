package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/fleet-dev/fleet/job"
)

// ErrScheduleExists means the tenant already has a schedule of that name.
var ErrScheduleExists = errors.New("a schedule of that name exists")

// ErrScheduleNotFound means the tenant has no schedule of that name; it is
// an ErrNotFound too.
var ErrScheduleNotFound error = notFound("no such schedule")

type notFound string

func (e notFound) Error() string        { return string(e) }
func (e notFound) Is(target error) bool { return target == ErrNotFound }

// ScheduleInfo is the fleet's answer about a schedule: the schedule
// (without its template's secrets), what its firings did, and when it
// fires next.
type ScheduleInfo = job.ScheduleInfo

// CreateSchedule makes a schedule of the client's tenant: from now on,
// each firing of its cron expression or interval submits its template as
// a job with the id <name>-<firing time> (see job.Schedule). A schedule
// of that name is ErrScheduleExists; an invalid one a *RejectedError whose
// reason names each field at fault.
func (c *Client) CreateSchedule(ctx context.Context, s *job.Schedule) (*ScheduleInfo, error) {
	data, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("encode schedule: %w", err)
	}
	return c.CreateScheduleJSON(ctx, s.Name, data)
}

// CreateScheduleJSON makes a schedule from its document as is, for the
// dispatcher to judge.
func (c *Client) CreateScheduleJSON(ctx context.Context, name string, doc []byte) (*ScheduleInfo, error) {
	var info ScheduleInfo
	if err := c.scheduleRequest(ctx, "create", name, doc, &info); err != nil {
		return nil, err
	}
	return &info, nil
}

// UpdateSchedule replaces a schedule with s, of the same name; with no
// Template, the schedule keeps its own (and its env values). Its firings
// go on from the last one made, or from now on when its timing changed or
// it was resumed.
func (c *Client) UpdateSchedule(ctx context.Context, s *job.Schedule) (*ScheduleInfo, error) {
	data, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("encode schedule: %w", err)
	}
	return c.UpdateScheduleJSON(ctx, s.Name, data)
}

// UpdateScheduleJSON replaces a schedule with a document as is.
func (c *Client) UpdateScheduleJSON(ctx context.Context, name string, doc []byte) (*ScheduleInfo, error) {
	var info ScheduleInfo
	if err := c.scheduleRequest(ctx, "update", name, doc, &info); err != nil {
		return nil, err
	}
	return &info, nil
}

// DeleteSchedule deletes a schedule: it fires no more; its jobs are left
// as they are. The answer is the schedule as it was.
func (c *Client) DeleteSchedule(ctx context.Context, name string) (*ScheduleInfo, error) {
	return c.scheduleVerb(ctx, "delete", name)
}

// PauseSchedule pauses a schedule: it fires no more until resumed.
func (c *Client) PauseSchedule(ctx context.Context, name string) (*ScheduleInfo, error) {
	return c.scheduleVerb(ctx, "pause", name)
}

// ResumeSchedule resumes a paused schedule; it fires from now on (what it
// would have fired while paused is not made up).
func (c *Client) ResumeSchedule(ctx context.Context, name string) (*ScheduleInfo, error) {
	return c.scheduleVerb(ctx, "resume", name)
}

// Schedule returns a schedule, its next five firings in its zone, and its
// last firings with their jobs and their states.
func (c *Client) Schedule(ctx context.Context, name string) (*ScheduleInfo, error) {
	return c.scheduleVerb(ctx, "show", name)
}

// Schedules lists the client's tenant's schedules, by name, each with its
// next firing and its counts.
func (c *Client) Schedules(ctx context.Context) (*job.ScheduleList, error) {
	var list job.ScheduleList
	if err := c.scheduleRequest(ctx, "list", "", nil, &list); err != nil {
		return nil, err
	}
	return &list, nil
}

func (c *Client) scheduleVerb(ctx context.Context, verb, name string) (*ScheduleInfo, error) {
	var info ScheduleInfo
	if err := c.scheduleRequest(ctx, verb, name, nil, &info); err != nil {
		return nil, err
	}
	return &info, nil
}

// scheduleRequest sends a request about the tenant's schedules to the
// dispatchers and decodes the answer into v. While no dispatcher is there
// to answer it is sent again, until ctx ends (10 seconds without a
// deadline).
func (c *Client) scheduleRequest(ctx context.Context, verb, name string, body []byte, v any) error {
	subject := c.names.ScheduleList(c.tenant)
	what := "list schedules"
	if verb != "list" {
		if !job.ValidScheduleName(name) {
			return fmt.Errorf("%s schedule: %q is not a schedule name (1 to 63 characters of [A-Za-z0-9_-], starting and ending with a letter or digit)", verb, name)
		}
		subject, what = c.names.ScheduleRequest(c.tenant, verb, name), verb+" schedule "+name
	}
	ctx, cancel := withDefaultTimeout(ctx, 10*time.Second)
	defer cancel()
	// A create sent twice would find its own schedule: only the reads are
	// sent again (see ask).
	r := sendOnce
	if verb == "list" || verb == "show" {
		r = sendAgain
	}
	m, err := c.ask(ctx, subject, body, r)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	var e job.ErrorReply
	if json.Unmarshal(m.Data, &e) == nil && e.Error != "" {
		switch {
		case e.NotFound:
			return fmt.Errorf("%s: %w", what, ErrScheduleNotFound)
		case e.Exists:
			return fmt.Errorf("%s: %w", what, ErrScheduleExists)
		case e.Invalid:
			return &RejectedError{Reason: e.Error}
		}
		return fmt.Errorf("%s: %s", what, e.Error)
	}
	if err := json.Unmarshal(m.Data, v); err != nil {
		return fmt.Errorf("%s: unreadable answer: %w", what, err)
	}
	return nil
}
