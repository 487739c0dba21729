package dispatcher_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/internal/dispatcher"
	"github.com/fleet-dev/fleet/internal/executor/noop"
	"github.com/fleet-dev/fleet/internal/executor/process"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/worker"
	"github.com/fleet-dev/fleet/job"
)

func dur(d time.Duration) *job.Duration { x := job.Duration(d); return &x }

// queued reads the first version of every job of a pool's stream made by
// schedule name (its label says so), by job id; a job queued twice would
// show as two.
func queued(t *testing.T, js jetstream.JetStream, pool, name string) map[string][]*job.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, "FLEET_POOL_"+pool)
	if err != nil {
		t.Fatal(err)
	}
	var filters []string
	for p := job.HighestPriority; p <= job.LowestPriority; p++ {
		filters = append(filters, fmt.Sprintf("fleet.p.%s.q%d.>", pool, p))
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: filters})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]*job.Record{}
	for {
		batch, err := c.FetchNoWait(256)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		pending := uint64(0)
		for m := range batch.Messages() {
			n++
			var rec job.Record
			if err := json.Unmarshal(m.Data(), &rec); err != nil {
				t.Fatal(err)
			}
			if rec.Labels[job.LabelSchedule] == name {
				out[rec.ID] = append(out[rec.ID], &rec)
			}
			md, _ := m.Metadata()
			pending = md.NumPending
		}
		if n == 0 || pending == 0 {
			return out
		}
	}
}

// firingTime reads a firing's time from its job's label.
func firingTime(t *testing.T, rec *job.Record) time.Time {
	t.Helper()
	at, err := time.Parse(job.FiringLayout, rec.Labels[job.LabelFiring])
	if err != nil {
		t.Fatalf("job %s: label %s: %v", rec.ID, job.LabelFiring, err)
	}
	if want := job.FiringID(rec.Labels[job.LabelSchedule], at); rec.ID != want {
		t.Errorf("job id %s, want %s", rec.ID, want)
	}
	return at
}

// every2s is the first case: every 2 s for 20 s makes 10 jobs
// (one more or less, as the run starts and ends between firings), each
// once, each with the id <schedule>-<firing time>, on time, and each runs.
func TestScheduleEveryTwoSecondsForTwentySeconds(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t)
	f.Worker(t, noop.Executor{}, worker.Config{Backend: "noop", Slots: 4})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	info, err := f.Client.CreateSchedule(ctx, &job.Schedule{Name: "every2s", Every: dur(2 * time.Second),
		Overlap: job.OverlapAllow, Template: &job.Request{Command: []string{"true"}, Labels: map[string]string{"team": "ops"}}})
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if len(info.Next) != 5 || info.Next[1].Sub(info.Next[0]) != 2*time.Second || info.Status != job.ScheduleActive {
		t.Fatalf("created: %+v", info)
	}
	time.Sleep(20 * time.Second)
	if _, err := f.Client.PauseSchedule(ctx, "every2s"); err != nil {
		t.Fatal(err)
	}
	ended := time.Now()
	time.Sleep(500 * time.Millisecond) // a firing in flight lands

	js, _ := jetstream.New(f.NC)
	jobs := queued(t, js, "default", "every2s")
	if n := len(jobs); n < 9 || n > 11 {
		t.Errorf("%d jobs in 20 s at every 2 s, want 10 ± 1", n)
	}
	var times []time.Time
	var worst time.Duration
	for id, recs := range jobs {
		if len(recs) != 1 {
			t.Errorf("job %s queued %d times", id, len(recs))
		}
		at := firingTime(t, recs[0])
		if at.Unix()%2 != 0 || at.Before(began.Truncate(time.Second)) || at.After(ended) {
			t.Errorf("job %s fired at %s, not a firing of the run", id, at)
		}
		if late := recs[0].SubmittedAt.Sub(at); late > worst {
			worst = late
		}
		if recs[0].Labels["team"] != "ops" {
			t.Errorf("job %s lost the template's labels: %v", id, recs[0].Labels)
		}
		times = append(times, at)
	}
	sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
	for i := 1; i < len(times); i++ {
		if d := times[i].Sub(times[i-1]); d != 2*time.Second {
			t.Errorf("firings %s and %s are %s apart", times[i-1], times[i], d)
		}
	}
	t.Logf("%d jobs, the latest queued %s after its firing", len(jobs), worst.Round(time.Millisecond))
	if worst > time.Second {
		t.Errorf("a firing was queued %s late", worst)
	}
	for id := range jobs {
		if r := f.Await(t, id, 10*time.Second); r.Status != job.StatusSucceeded {
			t.Errorf("job %s: %s", id, r.Status)
		}
	}
	show, err := f.Client.Schedule(ctx, "every2s")
	if err != nil {
		t.Fatal(err)
	}
	if show.Status != job.SchedulePaused || int(show.State.Made) != len(jobs) || show.State.Missed != 0 || len(show.Next) != 0 {
		t.Errorf("shown: status %s, made %d, missed %d, next %v", show.Status, show.State.Made, show.State.Missed, show.Next)
	}
	for _, fr := range show.State.Recent {
		if fr.Outcome != job.FiringMade || fr.State != job.StateSucceeded || !strings.HasPrefix(fr.JobID, "every2s-") {
			t.Errorf("recent firing %+v", fr)
		}
	}
}

// waitFor polls cond every 50 ms until it holds, or fails the test after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, d)
		}
	}
}

// startDispatcher starts another dispatcher on f's NATS server.
func startDispatcher(t *testing.T, f *fleettest.Fleet, cfg dispatcher.Config) *dispatcher.Dispatcher {
	t.Helper()
	cfg.Logger = fleettest.Logger(t)
	d, err := dispatcher.New(f.NATS.Connect(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = d.Stop(ctx)
	})
	return d
}

// With no dispatcher for 10 s and a 5 s catch-up window, the firings
// within the window are made once each as soon as a dispatcher runs, the
// older ones are counted as missed, and none runs twice. The dispatcher
// that comes back has a clock 10 s ahead: to it, no dispatcher ran for
// 10 s.
func TestScheduleMakesUpTheCatchUpWindowAndCountsOlderFiringsMissed(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A second dispatcher beside the first: only the holder of the lease
	// fires.
	second := startDispatcher(t, f, dispatcher.Config{})
	if _, err := f.Client.CreateSchedule(ctx, &job.Schedule{Name: "catchup", Every: dur(time.Second),
		Overlap: job.OverlapAllow, CatchUpWindow: dur(5 * time.Second), Template: &job.Request{Command: []string{"true"}}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "three firings", func() bool {
		s, err := f.Client.Schedule(ctx, "catchup")
		return err == nil && s.State.Made >= 3
	})
	for _, d := range []*dispatcher.Dispatcher{f.Dispatcher, second} {
		if err := d.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}
	js, _ := jetstream.New(f.NC)
	before := queued(t, js, "default", "catchup")
	var last time.Time
	for _, recs := range before {
		if at := firingTime(t, recs[0]); at.After(last) {
			last = at
		}
	}

	startDispatcher(t, f, dispatcher.Config{Now: func() time.Time { return time.Now().Add(10 * time.Second) }})
	var shown *job.ScheduleInfo
	var err error
	waitFor(t, 10*time.Second, "the firings made up", func() bool {
		shown, err = f.Client.Schedule(ctx, "catchup")
		return err == nil && shown.State.Missed > 0 && int(shown.State.Made) >= len(before)+7
	})
	if _, err := f.Client.PauseSchedule(ctx, "catchup"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	jobs := queued(t, js, "default", "catchup")
	var after []time.Time
	byTime := map[time.Time]*job.Record{}
	for id, recs := range jobs {
		if len(recs) != 1 {
			t.Errorf("job %s queued %d times", id, len(recs))
		}
		at := firingTime(t, recs[0])
		byTime[at] = recs[0]
		if at.After(last) {
			after = append(after, at)
		}
	}
	sort.Slice(after, func(i, j int) bool { return after[i].Before(after[j]) })
	if len(after) < 6 {
		t.Fatalf("%d firings after the outage", len(after))
	}
	// Between the last firing before the outage and the first after it,
	// each firing was counted missed, and none made.
	gap := int64(after[0].Sub(last)/time.Second) - 1
	if gap < 5 || shown.State.Missed != gap {
		t.Errorf("%d firings between %s and %s, %d counted missed; want at least 5, each counted", gap, last, after[0], shown.State.Missed)
	}
	// The window, made up at once (within the first pass) and in order;
	// every firing from there on, once.
	burst := byTime[after[4]].SubmittedAt.Sub(byTime[after[0]].SubmittedAt)
	if burst > 500*time.Millisecond {
		t.Errorf("the five firings of the window were made over %s, not at once", burst)
	}
	for i := 1; i < len(after); i++ {
		if after[i].Sub(after[i-1]) != time.Second {
			t.Errorf("firings %s and %s: a gap after the catch-up", after[i-1], after[i])
		}
	}
	if m := shown.State.Recent; !slicesContainsMissed(m, gap) {
		t.Errorf("the recent firings do not show the %d missed: %+v", gap, m)
	}
	t.Logf("last firing before the outage %s; %d missed; made up %s..%s within %s",
		last.Format(time.TimeOnly), gap, after[0].Format(time.TimeOnly), after[4].Format(time.TimeOnly), burst.Round(time.Millisecond))
}

func slicesContainsMissed(fs []job.Firing, n int64) bool {
	for _, f := range fs {
		if f.Outcome == job.FiringMissed && int64(f.Count) == n {
			return true
		}
	}
	return false
}

// Overlap policies, with jobs that run 2.5 s fired every second: skip
// makes no job while the previous one runs (and counts the skips),
// cancel_previous cancels the previous job and makes the new one, allow
// runs them side by side.
func TestScheduleOverlapPolicies(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t)
	exec, err := process.New(process.Config{Dir: t.TempDir(), Grace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	f.Worker(t, exec, worker.Config{Slots: 16})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	policies := []job.Overlap{job.OverlapSkip, job.OverlapCancelPrevious, job.OverlapAllow}
	for _, p := range policies {
		if _, err := f.Client.CreateSchedule(ctx, &job.Schedule{Name: strings.ReplaceAll(string(p), "_", "-"),
			Every: dur(time.Second), Overlap: p,
			Template: &job.Request{Command: []string{"sleep", "2.5"}, Timeout: dur(30 * time.Second)}}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(6 * time.Second)
	for _, p := range policies {
		if _, err := f.Client.PauseSchedule(ctx, strings.ReplaceAll(string(p), "_", "-")); err != nil {
			t.Fatal(err)
		}
	}
	js, _ := jetstream.New(f.NC)
	type run struct {
		id         string
		start, end time.Time
		status     job.Status
	}
	runs := map[job.Overlap][]run{}
	for _, p := range policies {
		name := strings.ReplaceAll(string(p), "_", "-")
		for id := range queued(t, js, "default", name) {
			r := f.Await(t, id, 20*time.Second)
			var start time.Time
			rr := run{id: id, end: r.FinishedAt, status: r.Status}
			if h, err := f.Client.History(ctx, id); err == nil {
				for _, rec := range h.Records {
					if rec.StartedAt != nil {
						start = *rec.StartedAt
						break
					}
				}
			}
			rr.start = start
			runs[p] = append(runs[p], rr)
		}
		sort.Slice(runs[p], func(i, j int) bool { return runs[p][i].id < runs[p][j].id })
	}
	overlapping := func(rs []run) int {
		n := 0
		for i := range rs {
			for j := i + 1; j < len(rs); j++ {
				a, b := rs[i], rs[j]
				if !a.start.IsZero() && !b.start.IsZero() && a.start.Before(b.end) && b.start.Before(a.end) {
					n++
				}
			}
		}
		return n
	}
	show := func(name string) *job.ScheduleInfo {
		s, err := f.Client.Schedule(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}

	skip, sk := runs[job.OverlapSkip], show("skip")
	if len(skip) < 2 || overlapping(skip) != 0 || sk.State.Skipped < 2 {
		t.Errorf("skip: %d jobs, %d pairs ran together, %d skipped; want ≥ 2 jobs one at a time, ≥ 2 skips",
			len(skip), overlapping(skip), sk.State.Skipped)
	}
	for _, r := range skip {
		if r.status != job.StatusSucceeded {
			t.Errorf("skip: %s %s", r.id, r.status)
		}
	}

	cancelled := 0
	cp := runs[job.OverlapCancelPrevious]
	for i, r := range cp {
		switch {
		case r.status == job.StatusCancelled:
			cancelled++
		case i < len(cp)-1:
			t.Errorf("cancel_previous: %s ended %s, though a later firing came while it ran", r.id, r.status)
		}
	}
	st := show("cancel-previous")
	noted := 0
	for _, fr := range st.State.Recent {
		if fr.Cancelled != "" {
			noted++
		}
	}
	if len(cp) < 4 || cancelled < 3 || noted == 0 || st.State.Skipped != 0 {
		t.Errorf("cancel_previous: %d jobs, %d cancelled, %d firings say what they cancelled, %d skipped", len(cp), cancelled, noted, st.State.Skipped)
	}

	allow := runs[job.OverlapAllow]
	if len(allow) < 5 || overlapping(allow) < 3 {
		t.Errorf("allow: %d jobs, %d pairs ran together; want ≥ 5, side by side", len(allow), overlapping(allow))
	}
	t.Logf("skip: %d jobs, %d skipped; cancel_previous: %d jobs, %d cancelled; allow: %d jobs, %d overlapping pairs",
		len(skip), sk.State.Skipped, len(cp), cancelled, len(allow), overlapping(allow))
}

// The requests about schedules, through the client and HTTP: bad input
// refused naming the field, a second schedule of a name refused, each
// tenant seeing its own, pause (no firing, nothing made up on resume),
// an end, update, delete.
func TestScheduleRequests(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tmpl := func() *job.Request {
		return &job.Request{Command: []string{"true"}, Env: map[string]string{"TOKEN": "s3cret"}}
	}
	bad := []struct {
		s    *job.Schedule
		want string
	}{
		{&job.Schedule{Name: "b", Cron: "*/61 * * * *", Template: tmpl()}, `cron: minute "*/61"`},
		{&job.Schedule{Name: "b", Cron: "0 3 * * *", TimeZone: "Europe/Atlantis", Template: tmpl()}, `time_zone: "Europe/Atlantis" is not an IANA time zone`},
		{&job.Schedule{Name: "b", Every: dur(100 * time.Millisecond), Template: tmpl()}, `every: 100ms is under the minimum of 1s`},
		{&job.Schedule{Name: "b", Every: dur(time.Second), Template: &job.Request{Command: []string{"true"}, Pool: "no pool"}}, `template.pool: "no pool"`},
		{&job.Schedule{Name: "b", Every: dur(time.Second)}, `template: missing`},
	}
	for _, b := range bad {
		_, err := f.Client.CreateSchedule(ctx, b.s)
		var rej *client.RejectedError
		if !errors.As(err, &rej) || !strings.Contains(rej.Reason, b.want) {
			t.Errorf("%+v: %v, want a rejection with %q", b.s, err, b.want)
		}
	}
	end := time.Now().Add(2500 * time.Millisecond)
	if _, err := f.Client.CreateSchedule(ctx, &job.Schedule{Name: "ends", Every: dur(time.Second), End: &end,
		Overlap: job.OverlapAllow, Template: tmpl()}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Client.CreateSchedule(ctx, &job.Schedule{Name: "ends", Every: dur(time.Hour), Template: tmpl()}); !errors.Is(err, client.ErrScheduleExists) {
		t.Errorf("a second schedule of a name: %v", err)
	}
	acme, err := client.New(f.NATS.Connect(t), client.WithTenant("acme"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := acme.Schedule(ctx, "ends"); !errors.Is(err, client.ErrScheduleNotFound) || !errors.Is(err, client.ErrNotFound) {
		t.Errorf("another tenant's schedule: %v", err)
	}
	if _, err := acme.CreateSchedule(ctx, &job.Schedule{Name: "ends", Cron: "0 3 * * *", Template: tmpl()}); err != nil {
		t.Errorf("the same name in another tenant: %v", err)
	}
	if _, err := acme.CreateSchedule(ctx, &job.Schedule{Name: "x", Tenant: "default", Cron: "0 3 * * *", Template: tmpl()}); err == nil {
		t.Error("a schedule made for another tenant")
	}

	// Paused, it makes nothing; resumed, it does not make up the pause.
	if _, err := f.Client.CreateSchedule(ctx, &job.Schedule{Name: "paused", Every: dur(time.Second), Paused: true,
		Overlap: job.OverlapAllow, Template: tmpl()}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // "ends" ends meanwhile
	js, _ := jetstream.New(f.NC)
	if n := len(queued(t, js, "default", "paused")); n != 0 {
		t.Errorf("a paused schedule made %d jobs", n)
	}
	resumed, err := f.Client.ResumeSchedule(ctx, "paused")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "a firing after the resume", func() bool { return len(queued(t, js, "default", "paused")) > 0 })
	for id, recs := range queued(t, js, "default", "paused") {
		if at := firingTime(t, recs[0]); at.Before(resumed.Schedule.ActiveSince) {
			t.Errorf("%s: the pause made up", id)
		}
	}
	ended, err := f.Client.Schedule(ctx, "ends")
	if err != nil {
		t.Fatal(err)
	}
	endJobs := queued(t, js, "default", "ends")
	for id, recs := range endJobs {
		if firingTime(t, recs[0]).After(end) {
			t.Errorf("%s fired after the end", id)
		}
		// The env values, sealed in the schedule, reach the job sealed.
		if recs[0].Request.Env["TOKEN"] != "" || recs[0].Secrets == "" {
			t.Errorf("%s: env %v, secrets %q", id, recs[0].Request.Env, recs[0].Secrets)
		}
	}
	if ended.Status != job.ScheduleEnded || len(ended.Next) != 0 || len(endJobs) < 2 || len(endJobs) > 3 {
		t.Errorf("after its end: status %s, next %v, %d jobs", ended.Status, ended.Next, len(endJobs))
	}
	if ended.Schedule.Template.Env["TOKEN"] != "" || ended.Schedule.Secrets != "" {
		t.Errorf("an answer shows the template's secrets: %+v", ended.Schedule)
	}

	// Update: new timing, the template and its env values kept.
	upd := *ended.Schedule
	upd.Template, upd.End, upd.Every, upd.Cron, upd.TimeZone = nil, nil, nil, "0 3 * * *", "Europe/Paris"
	u, err := f.Client.UpdateSchedule(ctx, &upd)
	if err != nil {
		t.Fatal(err)
	}
	if u.Status != job.ScheduleActive || len(u.Next) != 5 || u.Next[0].Hour() != 3 || u.Schedule.Template == nil ||
		!u.Schedule.ActiveSince.After(ended.Schedule.ActiveSince) {
		t.Errorf("updated: %+v next %v", u.Schedule, u.Next)
	}
	if loc, _ := time.LoadLocation("Europe/Paris"); !u.Next[0].Equal(u.Next[0].In(loc)) || u.Next[0].In(loc).Hour() != 3 {
		t.Errorf("next firings not at 03:00 in Paris: %v", u.Next)
	}

	// HTTP, as an operator acting for acme.
	req, _ := http.NewRequest(http.MethodGet, f.API.URL+"/v1/schedules", nil)
	req.Header.Set(dispatcher.TenantHeader, "acme")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var list job.ScheduleList
	_ = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || len(list.Schedules) != 1 || list.Schedules[0].Schedule.Cron != "0 3 * * *" {
		t.Errorf("GET /v1/schedules as acme: %d %+v", resp.StatusCode, list)
	}
	resp, err = http.Post(f.API.URL+"/v1/schedules", "application/json", strings.NewReader(`{"name":"h","every":"1s","time_zone":"Nowhere/Else","template":{"command":["true"]}}`))
	if err != nil {
		t.Fatal(err)
	}
	var e job.ErrorReply
	_ = json.NewDecoder(resp.Body).Decode(&e)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(e.Error, "time_zone") {
		t.Errorf("POST an invalid schedule: %d %+v", resp.StatusCode, e)
	}
	for _, c := range []struct {
		method, path string
		code         int
	}{
		{http.MethodPost, "/v1/schedules/paused/pause", http.StatusOK},
		{http.MethodGet, "/v1/schedules/paused", http.StatusOK},
		{http.MethodDelete, "/v1/schedules/paused", http.StatusOK},
		{http.MethodGet, "/v1/schedules/paused", http.StatusNotFound},
		{http.MethodDelete, "/v1/schedules/paused", http.StatusNotFound},
	} {
		req, _ := http.NewRequest(c.method, f.API.URL+c.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.code {
			t.Errorf("%s %s: %d, want %d", c.method, c.path, resp.StatusCode, c.code)
		}
	}
	list2, err := f.Client.Schedules(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list2.Schedules) != 1 || list2.Schedules[0].Schedule.Name != "ends" || len(list2.Schedules[0].State.Recent) != 0 {
		t.Errorf("default's schedules after the delete (a list carries no recent firings): %+v", list2.Schedules)
	}
	// Every tenant's, for the console: by tenant and name, with their
	// recent firings.
	all, err := f.Dispatcher.AllSchedules(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, i := range all.Schedules {
		names = append(names, i.Schedule.Tenant+"/"+i.Schedule.Name)
	}
	if strings.Join(names, " ") != "acme/ends default/ends" {
		t.Errorf("every tenant's schedules: %v, want acme/ends default/ends", names)
	}
	if len(all.Schedules) == 2 {
		recent := all.Schedules[1].State.Recent
		if len(recent) != len(endJobs) || recent[0].Outcome != job.FiringMade || endJobs[recent[0].JobID] == nil {
			t.Errorf("default/ends's recent firings: %+v, its jobs %d", recent, len(endJobs))
		}
		if all.Schedules[1].Schedule.Secrets != "" {
			t.Error("every tenant's schedules show a template's secrets")
		}
	}
}

// On the night the clock in New York goes back from 02:00 EDT to 01:00
// EST, a schedule firing every second of the hour 01:xx fires each
// wall-clock second once: after 01:59:59 EDT come no firings at 01:00:00
// EST and on. The dispatcher's clock is set to 01:59:56 EDT.
func TestScheduleFiresEachWallClockSlotOnceWhenTheClockGoesBack(t *testing.T) {
	t.Parallel()
	fallBack := time.Date(2026, 11, 1, 5, 59, 56, 0, time.UTC) // 01:59:56 EDT
	offset := time.Until(fallBack)
	f := fleettest.Start(t, func(c *dispatcher.Config) { c.Now = func() time.Time { return time.Now().Add(offset) } })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := f.Client.CreateSchedule(ctx, &job.Schedule{Name: "hour1", Cron: "* * 1 * * *", TimeZone: "America/New_York",
		Overlap: job.OverlapAllow, Template: &job.Request{Command: []string{"true"}}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(7 * time.Second)
	s, err := f.Client.Schedule(ctx, "hour1")
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(f.NC)
	var got []string
	for _, recs := range queued(t, js, "default", "hour1") {
		got = append(got, firingTime(t, recs[0]).Format(time.RFC3339))
	}
	sort.Strings(got)
	// 01:59:57, :58, :59 EDT, then nothing until 01:00 the next night.
	want := []string{"2026-11-01T05:59:57Z", "2026-11-01T05:59:58Z", "2026-11-01T05:59:59Z"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("firings %v, want %v", got, want)
	}
	if len(s.Next) == 0 || !s.Next[0].Equal(time.Date(2026, 11, 2, 6, 0, 0, 0, time.UTC)) {
		t.Errorf("next %v, want 01:00:00 EST on November 2", s.Next)
	}
}
