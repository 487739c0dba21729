package dispatcher

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/internal/schedule"
	"github.com/fleet-dev/fleet/internal/scheduler"
	"github.com/fleet-dev/fleet/job"
)

// errExists is a schedule made under a name its tenant already uses.
var errExists = errors.New("a schedule of that name exists")

// scheduleError is a schedule that is not there (queue.ErrNotFound), or is
// there already (errExists).
type scheduleError struct {
	msg string
	is  error
}

func (e scheduleError) Error() string        { return e.msg }
func (e scheduleError) Is(target error) bool { return target == e.is }

// invalidf is a request about a schedule that cannot be carried out as
// asked (errInvalid), in words that need no prefix.
func invalidf(format string, args ...any) error {
	return invalidError{fmt.Errorf(format, args...)}
}

type invalidError struct{ err error }

func (e invalidError) Error() string        { return e.err.Error() }
func (e invalidError) Unwrap() error        { return e.err }
func (e invalidError) Is(target error) bool { return target == errInvalid }

// CreateSchedule makes a schedule of tenant from its document (see
// job.DecodeSchedule); name, when given, is the name the request was made
// under, which the document's must match. It fires from now on.
func (d *Dispatcher) CreateSchedule(ctx context.Context, tenant, name string, data []byte) (*job.ScheduleInfo, error) {
	s, spec, err := d.decodeSchedule(tenant, name, data)
	if err != nil {
		return nil, err
	}
	now := d.cfg.Now()
	if s.End != nil && !s.End.After(now) {
		return nil, invalidf("invalid schedule: end: %s is past", s.End.Format(time.RFC3339))
	}
	s.CreatedAt, s.UpdatedAt, s.ActiveSince = now, now, now
	stored, err := d.storeSchedule(s)
	if err != nil {
		return nil, err
	}
	if _, err := d.schedules.Create(ctx, scheduler.SpecKey(tenant, s.Name), stored); err != nil {
		if conflict(err) {
			return nil, scheduleError{fmt.Sprintf("schedule %s exists: update it, or delete it first", s.Name), errExists}
		}
		return nil, fmt.Errorf("create schedule %s: %w", s.Name, err)
	}
	d.log.Info("schedule created", "tenant", tenant, "schedule", s.Name, "cron", s.Cron, "every", s.Every,
		"time_zone", s.TimeZone, "paused", s.Paused)
	return scheduleInfo(s, spec, nil, now, showNext), nil
}

// UpdateSchedule replaces a schedule of tenant with a new document of the
// same name; a document without a template keeps the schedule's (and its
// secrets). Its firings go on from the last one made; when its timing
// (cron, every, time zone) changes, or it is resumed, from now on.
func (d *Dispatcher) UpdateSchedule(ctx context.Context, tenant, name string, data []byte) (*job.ScheduleInfo, error) {
	s, err := d.decodeScheduleDoc(tenant, name, data)
	if err != nil {
		return nil, err
	}
	return d.changeSchedule(ctx, tenant, s.Name, "updated", func(old *job.Schedule, now time.Time) (*job.Schedule, error) {
		if s.End != nil && !s.End.After(now) && (old.End == nil || !old.End.Equal(*s.End)) {
			return nil, invalidf("invalid schedule: end: %s is past", s.End.Format(time.RFC3339))
		}
		n := *s
		if n.Template == nil {
			n.Template = old.Template
		}
		n.CreatedAt, n.ActiveSince = old.CreatedAt, old.ActiveSince
		if n.Cron != old.Cron || !sameDuration(n.Every, old.Every) || n.TimeZone != old.TimeZone || old.Paused && !n.Paused {
			n.ActiveSince = now
		}
		return &n, nil
	})
}

// PauseSchedule pauses (or, with paused false, resumes) a schedule of
// tenant. A resumed schedule fires from now on: what it would have fired
// while paused is neither made up nor missed.
func (d *Dispatcher) PauseSchedule(ctx context.Context, tenant, name string, paused bool) (*job.ScheduleInfo, error) {
	verb := map[bool]string{true: "paused", false: "resumed"}[paused]
	return d.changeSchedule(ctx, tenant, name, verb, func(old *job.Schedule, now time.Time) (*job.Schedule, error) {
		n := *old
		if old.Paused && !paused {
			n.ActiveSince = now
		}
		n.Paused = paused
		return &n, nil
	})
}

// changeSchedule reads a schedule, changes it and writes it back with a
// compare-and-set, again if another change came in between.
func (d *Dispatcher) changeSchedule(ctx context.Context, tenant, name, verb string,
	change func(old *job.Schedule, now time.Time) (*job.Schedule, error)) (*job.ScheduleInfo, error) {
	for try := 0; ; try++ {
		old, rev, err := d.readSchedule(ctx, tenant, name)
		if err != nil {
			return nil, err
		}
		if err := d.sealer.Open(scheduler.TemplateKey(tenant, name), old.Template, old.Secrets); err != nil {
			return nil, fmt.Errorf("schedule %s: %w", name, err)
		}
		now := d.cfg.Now()
		n, err := change(old, now)
		if err != nil {
			return nil, err
		}
		n.Tenant, n.Name, n.UpdatedAt = tenant, name, now
		spec, err := schedule.Validate(n, d.cfg.Limits)
		if err != nil {
			return nil, invalidf("%v", err)
		}
		stored, err := d.storeSchedule(n)
		if err != nil {
			return nil, err
		}
		if _, err := d.schedules.Update(ctx, scheduler.SpecKey(tenant, name), stored, rev); err != nil {
			if conflict(err) && try < 5 {
				continue
			}
			return nil, fmt.Errorf("%s schedule %s: %w", strings.TrimSuffix(verb, "d"), name, err)
		}
		d.log.Info("schedule "+verb, "tenant", tenant, "schedule", name, "paused", n.Paused)
		st, _ := d.readScheduleState(ctx, n)
		return scheduleInfo(n, spec, st, now, showNext), nil
	}
}

// DeleteSchedule deletes a schedule of tenant; it fires no more. Its jobs
// are left as they are.
func (d *Dispatcher) DeleteSchedule(ctx context.Context, tenant, name string) (*job.ScheduleInfo, error) {
	var s *job.Schedule
	for try := 0; ; try++ {
		var rev uint64
		var err error
		if s, rev, err = d.readSchedule(ctx, tenant, name); err != nil {
			return nil, err
		}
		err = d.schedules.Delete(ctx, scheduler.SpecKey(tenant, name), jetstream.LastRevision(rev))
		if err == nil {
			break
		}
		if !conflict(err) || try == 5 {
			return nil, fmt.Errorf("delete schedule %s: %w", name, err)
		}
	}
	st, _ := d.readScheduleState(ctx, s)
	if err := d.schedules.Purge(ctx, scheduler.StateKey(tenant, name)); err != nil {
		d.log.Debug("the firings of a deleted schedule are left", "schedule", name, "err", err)
	}
	d.log.Info("schedule deleted", "tenant", tenant, "schedule", name)
	spec, _ := schedule.Validate(s, d.cfg.Limits)
	info := scheduleInfo(s, spec, st, d.cfg.Now(), 0)
	return info, nil
}

// showNext is how many next firings show lists.
const showNext = 5

// ShowSchedule returns a schedule of tenant, its next five firings in its
// zone, and its last ones with their jobs' states.
func (d *Dispatcher) ShowSchedule(ctx context.Context, tenant, name string) (*job.ScheduleInfo, error) {
	s, _, err := d.readSchedule(ctx, tenant, name)
	if err != nil {
		return nil, err
	}
	spec, err := schedule.Validate(s, d.cfg.Limits)
	if err != nil {
		return nil, fmt.Errorf("schedule %s: %w", name, err)
	}
	st, err := d.readScheduleState(ctx, s)
	if err != nil {
		return nil, err
	}
	// The jobs' states, read together.
	var wg sync.WaitGroup
	for i := range st.Recent {
		f := &st.Recent[i]
		if f.Outcome != job.FiringMade || f.Pool == "" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if rec, _, err := d.jobs.Latest(ctx, queue.JobKey{Tenant: tenant, Pool: f.Pool, ID: f.JobID}); err == nil {
				f.State = rec.State
			}
		}()
	}
	wg.Wait()
	if p := st.Previous; p != nil {
		for _, f := range st.Recent {
			if f.JobID == p.JobID && f.State != "" {
				p.State = f.State
			}
		}
	}
	return scheduleInfo(s, spec, st, d.cfg.Now(), showNext), nil
}

// ListSchedules returns the schedules of tenant, by name, each with its
// next firing and its counts.
func (d *Dispatcher) ListSchedules(ctx context.Context, tenant string) (*job.ScheduleList, error) {
	if !job.ValidTenant(tenant) {
		return nil, invalidf("%q is not a tenant", tenant)
	}
	return d.listSchedules(ctx, tenant, false)
}

// AllSchedules returns the schedules of every tenant, by tenant and name,
// each with its next firing, its counts and its recent firings (their
// jobs' states not read), for the console: two reads of the bucket
// whatever the number of schedules.
func (d *Dispatcher) AllSchedules(ctx context.Context) (*job.ScheduleList, error) {
	return d.listSchedules(ctx, "*", true)
}

// listSchedules lists the schedules of the tenants that tenant matches
// (a tenant, or * for all), with their recent firings if recent.
func (d *Dispatcher) listSchedules(ctx context.Context, tenant string, recent bool) (*job.ScheduleList, error) {
	specs, err := d.readAll(ctx, "spec."+tenant+".*")
	if err != nil {
		return nil, err
	}
	states, err := d.readAll(ctx, "state."+tenant+".*")
	if err != nil {
		return nil, err
	}
	out := &job.ScheduleList{Schedules: []*job.ScheduleInfo{}}
	now := d.cfg.Now()
	for key, data := range specs {
		var s job.Schedule
		if json.Unmarshal(data, &s) != nil {
			continue
		}
		spec, err := schedule.Validate(&s, d.cfg.Limits)
		if err != nil {
			continue
		}
		var st job.ScheduleState
		if data, ok := states["state"+strings.TrimPrefix(key, "spec")]; ok && json.Unmarshal(data, &st) == nil && st.Created.Equal(s.CreatedAt) {
			if !recent {
				st.Recent = nil
			}
		} else {
			st = job.ScheduleState{}
		}
		out.Schedules = append(out.Schedules, scheduleInfo(&s, spec, &st, now, 1))
	}
	slices.SortFunc(out.Schedules, func(a, b *job.ScheduleInfo) int {
		return cmp.Or(strings.Compare(a.Schedule.Tenant, b.Schedule.Tenant), strings.Compare(a.Schedule.Name, b.Schedule.Name))
	})
	return out, nil
}

// readAll returns the values of the keys of the schedules bucket that
// match filter.
func (d *Dispatcher) readAll(ctx context.Context, filter string) (map[string][]byte, error) {
	w, err := d.schedules.Watch(ctx, filter, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("read the schedules: %w", err)
	}
	defer func() { _ = w.Stop() }()
	out := map[string][]byte{}
	if err := queue.Current(ctx, w, func(e jetstream.KeyValueEntry) { out[e.Key()] = e.Value() }); err != nil {
		return nil, fmt.Errorf("read the schedules: %w", err)
	}
	return out, nil
}

// decodeSchedule decodes and validates a schedule document of tenant,
// made under name.
func (d *Dispatcher) decodeSchedule(tenant, name string, data []byte) (*job.Schedule, *schedule.Spec, error) {
	s, err := d.decodeScheduleDoc(tenant, name, data)
	if err != nil {
		return nil, nil, err
	}
	spec, err := schedule.Validate(s, d.cfg.Limits)
	if err != nil {
		return nil, nil, invalidf("%v", err)
	}
	return s, spec, nil
}

// decodeScheduleDoc decodes a schedule document of tenant, made under
// name, and checks its name and tenant.
func (d *Dispatcher) decodeScheduleDoc(tenant, name string, data []byte) (*job.Schedule, error) {
	if !job.ValidTenant(tenant) {
		return nil, invalidf("%q is not a tenant", tenant)
	}
	s, err := job.DecodeSchedule(data, d.cfg.Limits)
	if err != nil {
		return nil, invalidf("%v", err)
	}
	switch {
	case s.Name == "":
		s.Name = name
	case name != "" && s.Name != name:
		return nil, invalidf("invalid schedule: name: %q is not the name the request is made under, %q", s.Name, name)
	}
	if s.Tenant != "" && s.Tenant != tenant {
		return nil, invalidf("invalid schedule: tenant: %q is not the tenant the request acts as, %q", s.Tenant, tenant)
	}
	s.Tenant = tenant
	return s, nil
}

// storeSchedule encodes a schedule for the bucket, its template's secrets
// sealed.
func (d *Dispatcher) storeSchedule(s *job.Schedule) ([]byte, error) {
	c := *s
	c.Template = s.Template.Clone()
	sealed, err := d.sealer.Seal(scheduler.TemplateKey(s.Tenant, s.Name), c.Template)
	if err != nil {
		return nil, fmt.Errorf("seal the template's secrets: %w", err)
	}
	c.Secrets = sealed
	data, err := json.Marshal(&c)
	if err != nil {
		return nil, fmt.Errorf("encode schedule %s: %w", s.Name, err)
	}
	return data, nil
}

// readSchedule returns a schedule of tenant as stored (its template's
// secrets sealed), with its revision.
func (d *Dispatcher) readSchedule(ctx context.Context, tenant, name string) (*job.Schedule, uint64, error) {
	if !job.ValidTenant(tenant) {
		return nil, 0, invalidf("%q is not a tenant", tenant)
	}
	if !job.ValidScheduleName(name) {
		return nil, 0, scheduleError{fmt.Sprintf("no schedule %q: not a schedule name", name), queue.ErrNotFound}
	}
	e, err := d.schedules.Get(ctx, scheduler.SpecKey(tenant, name))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, scheduleError{fmt.Sprintf("no schedule %s", name), queue.ErrNotFound}
	}
	if err != nil {
		return nil, 0, fmt.Errorf("read schedule %s: %w", name, err)
	}
	var s job.Schedule
	if err := json.Unmarshal(e.Value(), &s); err != nil {
		return nil, 0, fmt.Errorf("read schedule %s: %w", name, err)
	}
	return &s, e.Revision(), nil
}

// readScheduleState returns what a schedule's firings did; nothing yet
// when none was recorded, or only of an earlier schedule of its name.
func (d *Dispatcher) readScheduleState(ctx context.Context, s *job.Schedule) (*job.ScheduleState, error) {
	e, err := d.schedules.Get(ctx, scheduler.StateKey(s.Tenant, s.Name))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return &job.ScheduleState{Created: s.CreatedAt}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the firings of schedule %s: %w", s.Name, err)
	}
	var st job.ScheduleState
	if err := json.Unmarshal(e.Value(), &st); err != nil || !st.Created.Equal(s.CreatedAt) {
		return &job.ScheduleState{Created: s.CreatedAt}, nil
	}
	return &st, nil
}

// scheduleInfo is the answer about a schedule: without its secrets, with
// its status and next n firings in its zone.
func scheduleInfo(s *job.Schedule, spec *schedule.Spec, st *job.ScheduleState, now time.Time, n int) *job.ScheduleInfo {
	c := *s
	c.Secrets = ""
	info := &job.ScheduleInfo{Schedule: &c, Status: job.ScheduleActive}
	if st != nil {
		info.State = *st
	}
	if spec == nil {
		return info
	}
	from := now
	if s.ActiveSince.After(from) {
		from = s.ActiveSince
	}
	if _, ok := spec.Next(from); !ok {
		info.Status = job.ScheduleEnded
	}
	if s.Paused {
		info.Status = job.SchedulePaused
		return info
	}
	info.Next = spec.NextN(from, n)
	return info
}

func sameDuration(a, b *job.Duration) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// onSchedule answers <prefix>.t.<tenant>.schedules.<verb>[.<name>]; the
// tenant comes from the subject, which the NATS permissions of an
// authenticated fleet confine to the requester's own (an operator's may
// name any).
func (d *Dispatcher) onSchedule(m *nats.Msg) {
	tenant, verb, name, ok := d.names.ParseScheduleRequest(m.Subject)
	if !ok || m.Reply == "" {
		return
	}
	d.answer(m, func(ctx context.Context) ([]byte, error) {
		v, err := d.scheduleRequest(ctx, tenant, verb, name, m.Data)
		if errors.Is(err, errExists) {
			return json.Marshal(&job.ErrorReply{Error: err.Error(), Exists: true})
		}
		return d.replyOf(v, err, "schedule "+verb, m.Subject)
	})
}

func (d *Dispatcher) scheduleRequest(ctx context.Context, tenant, verb, name string, data []byte) (any, error) {
	if verb == "list" {
		if name != "" {
			return nil, invalidf("list takes no schedule name")
		}
		return d.ListSchedules(ctx, tenant)
	}
	if name == "" {
		return nil, invalidf("%s needs a schedule's name: schedules.%s.<name>", verb, verb)
	}
	switch verb {
	case "create":
		return d.CreateSchedule(ctx, tenant, name, data)
	case "update":
		return d.UpdateSchedule(ctx, tenant, name, data)
	case "delete":
		return d.DeleteSchedule(ctx, tenant, name)
	case "pause":
		return d.PauseSchedule(ctx, tenant, name, true)
	case "resume":
		return d.PauseSchedule(ctx, tenant, name, false)
	case "show":
		return d.ShowSchedule(ctx, tenant, name)
	}
	return nil, invalidf("%q is not create, update, delete, pause, resume, show or list", verb)
}
