package console

// The schedules page: every tenant's schedules, read through the
// dispatcher (Config.Schedules) at most once a second whatever the number
// of open pages (see snapshot.go), with their last firings' jobs as the index holds them,
// and pause and resume as the schedule's tenant.

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// scheduleRow is one schedule on the page.
type scheduleRow struct {
	Tenant, Name string
	Spec, Zone   string
	Overlap      job.Overlap
	Paused       bool
	Status       string
	Next         time.Time
	Made         int64
	Skipped      int64
	Missed       int64
	Rejected     int64
	// Firings are the last ones, newest first.
	Firings []firingRow
}

// Ref is tenant/name, as the page's buttons name a schedule.
func (r scheduleRow) Ref() string { return r.Tenant + "/" + r.Name }

// Path is the schedule's place under /ui/schedules/.
func (r scheduleRow) Path() string {
	return "/ui/schedules/" + url.PathEscape(r.Tenant) + "/" + url.PathEscape(r.Name)
}

type firingRow struct {
	At      time.Time
	Outcome job.FiringOutcome
	JobID   string
	Count   int
	Error   string
	// Path is the job's page, and State its state as the index holds it
	// (empty when it does not hold it yet).
	Path  string
	State job.State
}

type schedulesData struct {
	Off  bool // the console was given no way to read schedules
	Rows []scheduleRow
	Read time.Time
	Err  string
}

// shownFirings bounds the last firings shown of each schedule.
const shownFirings = 5

func (c *Console) schedulesPage(ctx context.Context, _ *http.Request, v *view) error {
	d := &schedulesData{Off: c.cfg.Schedules == nil}
	list, read, _, err := c.sched.get(ctx)
	d.Read = read
	if err != nil {
		d.Err = err.Error()
	}
	if list != nil {
		for _, info := range list.Schedules {
			d.Rows = append(d.Rows, c.scheduleRow(info))
		}
	}
	v.Data = d
	return nil
}

func (c *Console) scheduleRow(info *job.ScheduleInfo) scheduleRow {
	s := info.Schedule
	r := scheduleRow{Tenant: s.Tenant, Name: s.Name, Zone: s.TimeZone, Overlap: s.Overlap, Paused: s.Paused,
		Status: info.Status, Made: info.State.Made, Skipped: info.State.Skipped, Missed: info.State.Missed,
		Rejected: info.State.Rejected}
	switch {
	case s.Cron != "":
		r.Spec = "cron " + s.Cron
	case s.Every != nil:
		r.Spec = "every " + time.Duration(*s.Every).String()
	}
	if r.Zone == "" {
		r.Zone = "UTC"
	}
	if r.Overlap == "" {
		r.Overlap = job.OverlapSkip
	}
	if len(info.Next) > 0 {
		r.Next = info.Next[0]
	}
	recent := info.State.Recent
	for i := len(recent) - 1; i >= 0 && len(r.Firings) < shownFirings; i-- {
		f := recent[i]
		fr := firingRow{At: f.At, Outcome: f.Outcome, JobID: f.JobID, Count: f.Count, Error: f.Error, State: f.State}
		if f.JobID != "" && f.Pool != "" {
			k := queue.JobKey{Tenant: s.Tenant, Pool: f.Pool, ID: f.JobID}
			fr.Path = jobPath(k)
			if row, _, ok := c.index.Job(k); ok {
				fr.State = row.State
			}
		}
		r.Firings = append(r.Firings, fr)
	}
	return r
}

// pauseSchedule and resumeSchedule serve the page's buttons, as the
// schedule's tenant.
func (c *Console) pauseSchedule(w http.ResponseWriter, r *http.Request) (string, error) {
	return c.setPaused(w, r, true)
}

func (c *Console) resumeSchedule(w http.ResponseWriter, r *http.Request) (string, error) {
	return c.setPaused(w, r, false)
}

func (c *Console) setPaused(_ http.ResponseWriter, r *http.Request, paused bool) (string, error) {
	tenant, name := r.PathValue("tenant"), r.PathValue("name")
	if c.cfg.PauseSchedule == nil {
		return "", badRequest("this console cannot change schedules")
	}
	if !job.ValidTenant(tenant) || !job.ValidScheduleName(name) {
		return "", fmt.Errorf("%w: schedule %q/%q", queue.ErrNotFound, tenant, name)
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	info, err := c.cfg.PauseSchedule(ctx, tenant, name, paused)
	if err != nil {
		return "", fmt.Errorf("schedule %s/%s: %w", tenant, name, err)
	}
	action := map[bool]string{true: "pause", false: "resume"}[paused]
	c.m.actions.Add(ctx, 1, metric.WithAttributes(attribute.String("action", action+"_schedule")))
	c.log.Info("console: "+action+" a schedule", "tenant", tenant, "schedule", name, "status", info.Status)
	c.sched.forget()
	msg := fmt.Sprintf("schedule %s of %s: %s", name, tenant, info.Status)
	return "/ui/schedules?notice=" + url.QueryEscape(msg), nil
}
