package console

// The schedules page: every tenant's schedules, read through the
// dispatcher (Config.Schedules) at most once a second whatever the number
// of open pages, with their last firings' jobs as the index holds them,
// and pause and resume as the schedule's tenant.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// schedulesEvery is how long a read of the schedules is shown before the
// next page or update reads them again.
const schedulesEvery = time.Second

// schedules is the last read of the schedules, shared by every page.
type schedules struct {
	read func(ctx context.Context) (*job.ScheduleList, error)

	mu      sync.Mutex // held while reading: one read at a time
	list    *job.ScheduleList
	at      time.Time
	err     error
	raw     []byte // the list as read, to tell a change
	version uint64
}

// get returns the schedules as last read, reading them again when that
// read is older than schedulesEvery; the error is the last read's.
func (s *schedules) get(ctx context.Context) (*job.ScheduleList, time.Time, uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.read == nil {
		return nil, time.Time{}, 0, nil
	}
	if !s.at.IsZero() && time.Since(s.at) < schedulesEvery {
		return s.list, s.at, s.version, s.err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	list, err := s.read(ctx)
	s.at = time.Now()
	if err != nil {
		if s.err == nil {
			s.version++
		}
		s.err = fmt.Errorf("read the schedules: %w", err)
		return s.list, s.at, s.version, s.err
	}
	raw, _ := json.Marshal(list)
	if s.err != nil || !bytes.Equal(raw, s.raw) {
		s.version++
	}
	s.list, s.raw, s.err = list, raw, nil
	return s.list, s.at, s.version, nil
}

// changed is the schedules' version, read again if old, for the stream.
func (s *schedules) changed() uint64 {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _, v, _ := s.get(ctx)
	return v
}

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

// forget makes the next get read the schedules again, so that the page an
// action leads to shows what it did.
func (s *schedules) forget() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.at = time.Time{}
}
