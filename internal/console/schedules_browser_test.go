package console_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// schedRow selects a schedule's row on the schedules page.
func schedRow(tenant, name string) string { return fmt.Sprintf(`[id="sched-%s.%s"]`, tenant, name) }

func every(d time.Duration) *job.Duration { x := job.Duration(d); return &x }

// TestConsoleSchedulesPageShowsFiringsAndPauses: a schedule of tenant
// acme firing every second is listed with its spec, zone, overlap and
// next firing, and its last firings link to their jobs' pages (acme's)
// with their states; Pause, clicked in the page, pauses it as acme: the
// page says paused, offers Resume, and no firing is made while it is
// paused; Resume makes it fire again. However many pages are open, the
// console reads the schedules about once a second.
func TestConsoleSchedulesPageShowsFiringsAndPauses(t *testing.T) {
	s := startSite(t, siteOptions{})
	s.worker(t, "w-sched")
	acme := tenantClient(t, s, "acme")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := acme.CreateSchedule(ctx, &job.Schedule{Name: "tick", Every: every(time.Second), Overlap: job.OverlapAllow,
		Template: &job.Request{Command: []string{"true"}}}); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t)
	b.open(t, s.url("/ui/schedules"))
	waitFor(t, "the page live", 5*time.Second, func() bool { return strings.HasPrefix(b.text(t, "#status"), "live") })
	if b.attr(t, "#nav-schedules", "aria-current") != "page" {
		t.Error("the nav does not mark the schedules page")
	}
	r := schedRow("acme", "tick")
	firing := r + " .firings a"
	waitFor(t, "a firing linked to its job, with its state", 15*time.Second, func() bool {
		return b.exists(t, firing) && b.exists(t, firing+" + .state")
	})
	for sel, want := range map[string]string{" td.tenant": "acme", " td.spec": "every 1s", " td.zone": "UTC",
		" td.overlap": "allow", " td.status": "active"} {
		if got := b.text(t, r+sel); got != want {
			t.Errorf("%s: %q, want %q", sel, got, want)
		}
	}
	next, err := time.Parse(time.RFC3339, b.attr(t, r+" td.next time", "datetime"))
	if err != nil || next.Before(time.Now().Add(-3*time.Second)) || next.After(time.Now().Add(3*time.Second)) {
		t.Errorf("next firing %v (%v), want within a few seconds of now", next, err)
	}
	href := b.attr(t, firing, "href")
	id := b.text(t, firing)
	if !strings.HasPrefix(id, "tick-") || href != jobPage("acme", "default", id) {
		t.Fatalf("the firing's link: %q to %q, want a tick-<time> job of acme's", id, href)
	}
	if st, err := acme.Status(ctx, id); err != nil || st.Job == nil || st.Job.Labels[job.LabelSchedule] != "tick" {
		t.Errorf("acme's job %s: %+v %v", id, st, err)
	}

	// Two more pages' streams open, each asking every 500 ms: the
	// schedules are still read about once a second, for all of them, not
	// once a page every half second (six a second).
	for i := 0; i < 2; i++ {
		req, _ := http.NewRequestWithContext(ctx, "GET", s.url("/ui/stream?page=schedules&every=500ms"), nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		go func() {
			sc := bufio.NewScanner(resp.Body)
			sc.Buffer(make([]byte, 1<<20), 1<<20)
			for sc.Scan() {
			}
		}()
	}
	before := s.schedReads.Load()
	waitFor(t, "a read of the schedules", 10*time.Second, func() bool { return s.schedReads.Load() > before })
	from, n := time.Now(), s.schedReads.Load()
	waitFor(t, "three more reads of the schedules", 20*time.Second, func() bool { return s.schedReads.Load() >= n+3 })
	if took := time.Since(from); took < 1500*time.Millisecond {
		t.Errorf("three reads of the schedules in %s with three pages open: each page reads them for itself", took.Round(time.Millisecond))
	}

	// A job's page, from a firing's link (the newest, by then).
	b.click(t, firing)
	defer func() {
		if t.Failed() {
			t.Logf("at %s, tenant %q", b.location(t), b.text(t, "#tenant"))
		}
	}()
	waitFor(t, "the job's page", 10*time.Second, func() bool {
		return strings.Contains(b.location(t), jobPage("acme", "default", "tick-")) && b.text(t, "#tenant") == "acme" &&
			b.exists(t, "h1 .state")
	})

	// Pause, in the page.
	b.open(t, s.url("/ui/schedules"))
	b.click(t, `button[data-pause="acme/tick"]`)
	waitFor(t, "paused on the page", 10*time.Second, func() bool {
		return b.text(t, r+" td.status") == "paused" && b.exists(t, `button[data-resume="acme/tick"]`) &&
			!b.exists(t, `button[data-pause="acme/tick"]`)
	})
	if !strings.Contains(b.text(t, ".notice"), "paused") {
		t.Errorf("the notice after pause: %q", b.text(t, ".notice"))
	}
	if b.text(t, r+" td.next") != "—" {
		t.Errorf("a paused schedule shows a next firing: %q", b.text(t, r+" td.next"))
	}
	info, err := acme.Schedule(ctx, "tick")
	if err != nil || !info.Schedule.Paused {
		t.Fatalf("after Pause, acme's schedule: %+v %v", info, err)
	}
	time.Sleep(1500 * time.Millisecond) // a firing in flight at the pause lands
	before1, err := acme.Schedule(ctx, "tick")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	after, err := acme.Schedule(ctx, "tick")
	if err != nil {
		t.Fatal(err)
	}
	if after.State.Made != before1.State.Made || !after.State.Last.Equal(*before1.State.Last) {
		t.Errorf("fired while paused: made %d then %d, last %s then %s", before1.State.Made, after.State.Made,
			before1.State.Last, after.State.Last)
	}
	last := *after.State.Last
	for sec := last.Add(time.Second); sec.Before(time.Now().Add(-time.Second)); sec = sec.Add(time.Second) {
		if s.c.Index().Has(queue.JobKey{Tenant: "acme", Pool: "default", ID: job.FiringID("tick", sec)}) {
			t.Errorf("a job of the firing at %s, while paused", sec)
		}
	}
	if got := b.text(t, r+" td.made"); got != fmt.Sprint(after.State.Made) {
		t.Errorf("the page counts %s made, the dispatcher %d", got, after.State.Made)
	}

	// Resume: it fires again.
	b.click(t, `button[data-resume="acme/tick"]`)
	waitFor(t, "active on the page", 10*time.Second, func() bool { return b.text(t, r+" td.status") == "active" })
	waitFor(t, "a firing after resume", 10*time.Second, func() bool {
		i, err := acme.Schedule(ctx, "tick")
		return err == nil && i.State.Made > after.State.Made
	})
	if errs := b.errors(); len(errs) > 0 {
		t.Errorf("the page reported errors:\n%s", strings.Join(errs, "\n"))
	}
}

// TestConsoleSchedulesReadOnly: a read-only console lists the schedules
// without Pause or Resume, and refuses them when posted anyway.
func TestConsoleSchedulesReadOnly(t *testing.T) {
	s := startSite(t, siteOptions{readOnly: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, sc := range []*job.Schedule{
		{Name: "nightly", Cron: "30 2 * * 1-5", TimeZone: "Europe/Paris", Template: &job.Request{Command: []string{"true"}}},
		{Name: "held", Every: every(time.Hour), Paused: true, Template: &job.Request{Command: []string{"true"}}},
	} {
		if _, err := s.f.Client.CreateSchedule(ctx, sc); err != nil {
			t.Fatal(err)
		}
	}
	b := newBrowser(t)
	b.open(t, s.url("/ui/schedules"))
	waitFor(t, "both schedules", 10*time.Second, func() bool {
		return b.exists(t, schedRow("default", "nightly")) && b.exists(t, schedRow("default", "held"))
	})
	if got := b.text(t, schedRow("default", "nightly")+" td.zone"); got != "Europe/Paris" {
		t.Errorf("the zone: %q", got)
	}
	if got := b.text(t, schedRow("default", "held")+" td.status"); got != "paused" {
		t.Errorf("the paused schedule's status: %q", got)
	}
	if b.exists(t, "button[data-pause]") || b.exists(t, "button[data-resume]") {
		t.Error("a read-only console offers pause or resume")
	}
	for _, p := range []string{"/ui/schedules/default/nightly/pause", "/ui/schedules/default/held/resume"} {
		code := eval[int](t, b, fmt.Sprintf(`fetch(%q, {method: "POST", body: new URLSearchParams({csrf: "x"})}).then(r => r.status)`, p))
		if code != http.StatusForbidden {
			t.Errorf("POST %s on a read-only console: %d, want 403", p, code)
		}
	}
	b.errors()
	for name, paused := range map[string]bool{"nightly": false, "held": true} {
		if info, err := s.f.Client.Schedule(ctx, name); err != nil || info.Schedule.Paused != paused {
			t.Errorf("schedule %s after the refused posts: %+v %v, want paused %v", name, info, err, paused)
		}
	}
}
