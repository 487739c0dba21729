package scheduler

import (
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fleet-dev/fleet/internal/schedule"
	"github.com/fleet-dev/fleet/job"
)

// These tests run on synctest's fake clock, which starts at t0: a
// scheduler sleeps until a firing is due, and the test sees when, to the
// nanosecond, what it submitted. The dispatcher and the bucket are fakes
// (fake_test.go), so that nothing in the bubble waits on a network.

var t0 = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// every is a valid schedule of tenant acme firing every d, active since
// t0, changed by opts.
func every(name string, d time.Duration, opts ...func(*job.Schedule)) *job.Schedule {
	x := job.Duration(d)
	sc := &job.Schedule{Name: name, Tenant: "acme", Every: &x, Template: &job.Request{Command: []string{"true"}},
		CreatedAt: t0, UpdatedAt: t0, ActiveSince: t0}
	for _, o := range opts {
		o(sc)
	}
	return sc
}

func put(t *testing.T, b *memBucket, sc *job.Schedule) {
	t.Helper()
	data, err := json.Marshal(sc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Create(context.Background(), SpecKey(sc.Tenant, sc.Name), data); err != nil {
		// Changed: write over it.
		cur, _ := b.Get(context.Background(), SpecKey(sc.Tenant, sc.Name))
		if _, err := b.Update(context.Background(), SpecKey(sc.Tenant, sc.Name), data, cur.Revision()); err != nil {
			t.Fatal(err)
		}
	}
}

// start starts a scheduler on b and d, stopped when the test ends.
func start(t *testing.T, b *memBucket, d *fakeDispatcher) *Scheduler {
	t.Helper()
	s := New(Config{Dispatcher: d, Bucket: b, JetStream: b, Self: "d1", Logger: testLogger(t)})
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return s
}

// ids are the firings' job ids of schedule name at each of ats.
func ids(name string, ats ...time.Time) []string {
	out := make([]string, len(ats))
	for i, at := range ats {
		out[i] = job.FiringID(name, at)
	}
	return out
}

func subIDs(subs []submitted) []string {
	out := make([]string, len(subs))
	for i, s := range subs {
		out[i] = s.id
	}
	return out
}

func TestNextFiring(t *testing.T) {
	at := func(d time.Duration) *time.Time { x := t0.Add(d); return &x }
	end := t0.Add(25 * time.Second)
	for _, c := range []struct {
		name string
		sc   *job.Schedule
		st   job.ScheduleState
		want time.Time
	}{
		{"first after active since", every("a", 10*time.Second), job.ScheduleState{}, t0.Add(10 * time.Second)},
		{"first after the last dealt with", every("a", 10*time.Second), job.ScheduleState{Last: at(30 * time.Second)}, t0.Add(40 * time.Second)},
		{"a last before active since is ignored", every("a", 10*time.Second, func(s *job.Schedule) { s.ActiveSince = t0.Add(time.Minute) }),
			job.ScheduleState{Last: at(30 * time.Second)}, t0.Add(70 * time.Second)},
		{"paused: none", every("a", 10*time.Second, func(s *job.Schedule) { s.Paused = true }), job.ScheduleState{}, time.Time{}},
		{"ended: none", every("a", 10*time.Second, func(s *job.Schedule) { s.End = &end }), job.ScheduleState{Last: at(20 * time.Second)}, time.Time{}},
		{"a past firing is due at once", every("a", 10*time.Second, func(s *job.Schedule) { s.ActiveSince = t0.Add(-time.Hour) }),
			job.ScheduleState{}, t0.Add(-time.Hour + 10*time.Second)},
	} {
		t.Run(c.name, func(t *testing.T) {
			spec, err := schedule.Validate(c.sc, job.DefaultLimits)
			if err != nil {
				t.Fatal(err)
			}
			if got := nextFiring(&entry{s: c.sc, spec: spec, state: c.st}); !got.Equal(c.want) {
				t.Errorf("nextFiring = %v, want %v", got, c.want)
			}
		})
	}
}

func TestGate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		var g gate
		start := time.Now()
		g.wait(ctx, time.Second)
		if d := time.Since(start); d != 0 {
			t.Errorf("with no work, wait took %v", d)
		}

		// It waits for the last piece of work done.
		g.add(2)
		go func() {
			time.Sleep(100 * time.Millisecond)
			g.done(1)
			time.Sleep(100 * time.Millisecond)
			g.done(1)
		}()
		start = time.Now()
		g.wait(ctx, time.Second)
		if d := time.Since(start); d != 200*time.Millisecond {
			t.Errorf("wait returned after %v, want 200ms: when the work was done", d)
		}

		// At most d.
		g.add(1)
		start = time.Now()
		g.wait(ctx, 250*time.Millisecond)
		if d := time.Since(start); d != 250*time.Millisecond {
			t.Errorf("wait returned after %v, want its bound of 250ms", d)
		}

		// Or until ctx ends.
		cctx, cancel := context.WithCancel(ctx)
		time.AfterFunc(50*time.Millisecond, cancel)
		start = time.Now()
		g.wait(cctx, time.Second)
		if d := time.Since(start); d != 50*time.Millisecond {
			t.Errorf("wait returned after %v, want 50ms: when its context ended", d)
		}
		g.done(1)
		start = time.Now()
		g.wait(ctx, time.Second)
		if d := time.Since(start); d != 0 {
			t.Errorf("once the work was done, wait took %v", d)
		}
	})
}

// TestDispatchSleepsUntilTheNextFiring: dispatch returns how long to
// sleep: until prepareAhead before the next firing, then until the
// firing itself once it is made ready; at most maxSleep.
func TestDispatchSleepsUntilTheNextFiring(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		s := New(Config{Dispatcher: newFakeDispatcher(), Bucket: newMemBucket(), JetStream: newMemBucket(), Logger: testLogger(t)})
		if got := s.dispatch(ctx); got != maxSleep {
			t.Errorf("with no schedule, dispatch sleeps %v, want %v", got, maxSleep)
		}
		add := func(sc *job.Schedule, next time.Time) *entry {
			spec, err := schedule.Validate(sc, job.DefaultLimits)
			if err != nil {
				t.Fatal(err)
			}
			e := &entry{s: sc, spec: spec, next: next}
			s.entries[sc.Tenant+"."+sc.Name] = e
			return e
		}
		add(every("paused", time.Minute, func(s *job.Schedule) { s.Paused = true }), time.Time{})
		add(every("later", time.Minute), t0.Add(time.Minute))
		if got := s.dispatch(ctx); got != time.Minute-prepareAhead {
			t.Errorf("dispatch sleeps %v, want %v: until the firing in a minute is made ready", got, time.Minute-prepareAhead)
		}
		soon := add(every("soon", time.Minute), t0.Add(300*time.Millisecond))
		if got := s.dispatch(ctx); got != 300*time.Millisecond {
			t.Errorf("dispatch sleeps %v, want 300ms: until the firing within prepareAhead", got)
		}
		synctest.Wait()
		s.mu.Lock()
		p := soon.prep
		s.mu.Unlock()
		if p == nil || !p.at.Equal(soon.next) || p.req == nil || p.req.ID != job.FiringID("soon", soon.next) {
			t.Fatalf("the firing within prepareAhead was not made ready: %+v", p)
		}
		if got := s.dispatch(ctx); got != 300*time.Millisecond {
			t.Errorf("dispatch sleeps %v, want 300ms", got)
		}
		synctest.Wait()
		if soon.prep != p {
			t.Error("a firing made ready was made ready again")
		}
		s.fires.Wait()
	})
}

// TestFiresEachFiringOnceAtItsTime: the lease's holder makes each firing
// at its time exactly, once, made ready before it (a batch of one), and
// records what the firings did; a schedule paused fires no more; Stop
// gives the lease up.
func TestFiresEachFiringOnceAtItsTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, d := newMemBucket(), newFakeDispatcher()
		sc := every("tick", 10*time.Second, func(s *job.Schedule) { s.Overlap = job.OverlapAllow })
		put(t, b, sc)
		s := start(t, b, d)
		time.Sleep(65 * time.Second)
		synctest.Wait()

		var want []time.Time
		for i := 1; i <= 6; i++ {
			want = append(want, t0.Add(time.Duration(i)*10*time.Second))
		}
		subs := d.submissions()
		if got := subIDs(subs); !slices.Equal(got, ids("tick", want...)) {
			t.Fatalf("submitted %v, want %v", got, ids("tick", want...))
		}
		for i, sub := range subs {
			if !sub.at.Equal(want[i]) || sub.how != "batch" {
				t.Errorf("firing %s submitted at %v (%s), want at %v, in a batch", sub.id, sub.at, sub.how, want[i])
			}
		}
		st, _ := b.state("acme", "tick")
		if st.Made != 6 || st.Last == nil || !st.Last.Equal(want[5]) || st.Previous == nil || st.Previous.JobID != job.FiringID("tick", want[5]) {
			t.Errorf("recorded %+v, want 6 made, the last at %v", st, want[5])
		}
		if _, err := b.Get(context.Background(), leaderKey); err != nil {
			t.Errorf("the lease's key: %v", err)
		}

		// Paused: no more firings.
		paused := *sc
		paused.Paused = true
		put(t, b, &paused)
		time.Sleep(time.Minute)
		if n := len(d.submissions()); n != 6 {
			t.Errorf("%d firings made after the schedule was paused", n-6)
		}

		if err := s.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Get(context.Background(), leaderKey); err == nil {
			t.Error("the lease is still held after Stop")
		}
	})
}

// TestCatchUpMakesTheFiringsWithinTheWindowAndCountsOlderOnesMissed: a
// schedule whose firings were not made for two hours makes, when the
// scheduler starts, those within its catch-up window at once, and counts
// the older ones missed.
func TestCatchUpMakesTheFiringsWithinTheWindowAndCountsOlderOnesMissed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, d := newMemBucket(), newFakeDispatcher()
		window := job.Duration(30 * time.Minute)
		put(t, b, every("catch", 10*time.Minute, func(s *job.Schedule) {
			s.CreatedAt, s.ActiveSince, s.Overlap, s.CatchUpWindow = t0.Add(-2*time.Hour), t0.Add(-2*time.Hour), job.OverlapAllow, &window
		}))
		start(t, b, d)
		synctest.Wait()

		want := ids("catch", t0.Add(-30*time.Minute), t0.Add(-20*time.Minute), t0.Add(-10*time.Minute), t0)
		subs := d.submissions()
		if got := subIDs(subs); !slices.Equal(got, want) {
			t.Fatalf("made %v, want %v", got, want)
		}
		for _, sub := range subs {
			if !sub.at.Equal(t0) {
				t.Errorf("%s made at %v, want at once (%v)", sub.id, sub.at, t0)
			}
		}
		st, _ := b.state("acme", "catch")
		if st.Missed != 8 || st.Made != 4 || st.Last == nil || !st.Last.Equal(t0) {
			t.Errorf("recorded %+v, want 8 missed, 4 made, the last at %v", st, t0)
		}
		if len(st.Recent) == 0 || st.Recent[0].Outcome != job.FiringMissed || st.Recent[0].Count != 8 ||
			!st.Recent[0].At.Equal(t0.Add(-40*time.Minute)) {
			t.Errorf("the first recent firing is %+v, want the 8 missed, the last at -40m", st.Recent)
		}

		// Then on time again.
		time.Sleep(10*time.Minute + time.Second)
		subs = d.submissions()
		if last := subs[len(subs)-1]; len(subs) != 5 || last.id != job.FiringID("catch", t0.Add(10*time.Minute)) ||
			!last.at.Equal(t0.Add(10*time.Minute)) {
			t.Errorf("after catching up, made %v", subs)
		}
	})
}

func TestOverlapPolicies(t *testing.T) {
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	for _, c := range []struct {
		name    string
		overlap job.Overlap
		// state is the state of each firing's job once submitted.
		state     job.State
		made      []string
		skipped   int64
		cancelled []string
		// how each firing made after the first was submitted (see
		// submitted): in a batch when its overlap was decided as it was
		// made ready; else alone.
		how string
	}{
		{"skip while the previous job runs", job.OverlapSkip, job.StateRunning, ids("o", at(10)), 2, nil, ""},
		{"skip: the previous job ended", job.OverlapSkip, job.StateSucceeded, ids("o", at(10), at(20), at(30)), 0, nil, "batch"},
		{"cancel the previous job", job.OverlapCancelPrevious, job.StateRunning, ids("o", at(10), at(20), at(30)), 0,
			ids("o", at(10), at(20)), "valid"},
		{"allow", job.OverlapAllow, job.StateRunning, ids("o", at(10), at(20), at(30)), 0, nil, "batch"},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b, d := newMemBucket(), newFakeDispatcher()
				d.fail = func(id string) error { d.states[id] = c.state; return nil }
				put(t, b, every("o", 10*time.Second, func(s *job.Schedule) { s.Overlap = c.overlap }))
				start(t, b, d)
				time.Sleep(35 * time.Second)
				synctest.Wait()

				subs := d.submissions()
				if got := subIDs(subs); !slices.Equal(got, c.made) {
					t.Errorf("made %v, want %v", got, c.made)
				}
				for i, sub := range subs {
					// The first firing has no previous one: it needs
					// nothing read.
					want := c.how
					if i == 0 {
						want = "batch"
					}
					if sub.how != want {
						t.Errorf("%s submitted as %q, want %q", sub.id, sub.how, want)
					}
				}
				d.mu.Lock()
				cancelled := slices.Clone(d.cancelled)
				d.mu.Unlock()
				if !slices.Equal(cancelled, c.cancelled) {
					t.Errorf("cancelled %v, want %v", cancelled, c.cancelled)
				}
				st, _ := b.state("acme", "o")
				if st.Made != int64(len(c.made)) || st.Skipped != c.skipped {
					t.Errorf("recorded %d made, %d skipped; want %d, %d", st.Made, st.Skipped, len(c.made), c.skipped)
				}
				if c.cancelled != nil {
					if f := st.Recent[len(st.Recent)-1]; f.Cancelled != c.cancelled[len(c.cancelled)-1] {
						t.Errorf("the last firing cancelled %q, want %q", f.Cancelled, c.cancelled[len(c.cancelled)-1])
					}
				}
			})
		})
	}
}

// TestAFailedFiringIsTriedAgainWithABackoff: a firing that cannot be made
// is tried again 1 s later, then 2 s, ... at most 10 s, until it is made.
func TestAFailedFiringIsTriedAgainWithABackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, d := newMemBucket(), newFakeDispatcher()
		failures := 12
		d.fail = func(string) error {
			if failures > 0 {
				failures--
				return errUnavailable
			}
			return nil
		}
		put(t, b, every("retry", time.Hour))
		start(t, b, d)
		time.Sleep(time.Hour + 2*time.Minute)
		synctest.Wait()

		firing := t0.Add(time.Hour)
		var want []time.Time
		tried := firing
		for i := range 13 {
			want = append(want, tried)
			tried = tried.Add(min(time.Duration(i+1)*time.Second, 10*time.Second))
		}
		subs := d.submissions()
		if len(subs) != len(want) {
			t.Fatalf("%d tries, want %d: %v", len(subs), len(want), subs)
		}
		for i, sub := range subs {
			if sub.id != job.FiringID("retry", firing) || !sub.at.Equal(want[i]) {
				t.Errorf("try %d: %s at +%v, want %s at +%v", i+1, sub.id, sub.at.Sub(firing),
					job.FiringID("retry", firing), want[i].Sub(firing))
			}
			// The first try was made ready; the others are made alone,
			// from the template.
			if want := map[bool]string{true: "batch", false: "submit"}[i == 0]; sub.how != want {
				t.Errorf("try %d submitted as %q, want %q", i+1, sub.how, want)
			}
		}
		st, _ := b.state("acme", "retry")
		if st.Made != 1 || st.Last == nil || !st.Last.Equal(firing) {
			t.Errorf("recorded %+v, want the firing made once", st)
		}
	})
}

// TestTheLeaseIsTakenOverWhenItsHolderStopsRenewingIt: a holder that
// renews its lease keeps it; one that stops loses it to the other
// dispatcher ttl after that one first saw its last renewal, and then
// knows it lost it.
func TestTheLeaseIsTakenOverWhenItsHolderStopsRenewingIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		b := newMemBucket()
		const ttl = 3 * time.Second
		a, other := newLease(b, "a", ttl, testLogger(t)), newLease(b, "b", ttl, testLogger(t))
		if !a.keep(ctx) {
			t.Fatal("a free lease was not taken")
		}
		for range 10 {
			if other.keep(ctx) {
				t.Fatal("a lease renewed was taken over")
			}
			time.Sleep(a.every())
			if !a.keep(ctx) {
				t.Fatal("a lease could not be renewed")
			}
		}
		// a stops renewing: other takes it over on its third look after
		// the one that first saw a's last renewal.
		first := time.Now()
		for !other.keep(ctx) {
			time.Sleep(other.every())
			if time.Since(first) > 2*ttl {
				t.Fatal("the lease was never taken over")
			}
		}
		if d := time.Since(first); d != ttl {
			t.Errorf("taken over %v after its last renewal was seen, want %v", d, ttl)
		}
		if a.keep(ctx) {
			t.Error("the former holder still holds the lease")
		}
	})
}

// TestStopEndsTheFiringsOfAWatchThatNeverCloses: a watch of the bucket
// whose channel stays open after Stop (as nats.go's may, when the context
// ended while the watch was made) holds up neither the scheduler's Stop
// nor any of its goroutines; synctest fails the test if one is left
// blocked.
func TestStopEndsTheFiringsOfAWatchThatNeverCloses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, d := newMemBucket(), newFakeDispatcher()
		b.staysOpen = true
		put(t, b, every("tick", 10*time.Second))
		s := New(Config{Dispatcher: d, Bucket: b, JetStream: b, Self: "d1", Logger: testLogger(t)})
		if err := s.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(15 * time.Second)
		synctest.Wait()
		if n := len(d.submissions()); n != 1 {
			t.Fatalf("%d firings made in 15 s of a schedule every 10 s, want 1", n)
		}
		stopped := make(chan error, 1)
		go func() { stopped <- s.Stop(context.Background()) }()
		synctest.Wait()
		select {
		case err := <-stopped:
			if err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatal("Stop waits on a watch that never closes")
		}
	})
}

// TestALeadStoppedWhileReadingTheSchedulesEndsThere: stopped while it
// reads the schedules as they are, the lead ends without following them;
// the nil that ends the first values, which the read may leave in the
// watch, is never taken for a schedule. (queue.Watched ends a read with its
// context, picking between it and what the watch holds at random: a
// hundred tries take every path.)
func TestALeadStoppedWhileReadingTheSchedulesEndsThere(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for range 100 {
			b, d := newMemBucket(), newFakeDispatcher()
			put(t, b, every("a", time.Minute))
			put(t, b, every("b", time.Minute))
			ctx, cancel := context.WithCancel(context.Background())
			b.watched = func(keys string) {
				if keys == "spec.>" {
					cancel()
				}
			}
			s := New(Config{Dispatcher: d, Bucket: b, JetStream: b, Self: "d1", Logger: testLogger(t)})
			if err := s.lead(ctx); err != nil {
				t.Fatalf("lead stopped while reading the schedules: %v", err)
			}
		}
	})
}
