package dispatcher_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/dispatcher"
	"github.com/fleet-dev/fleet/internal/executor/noop"
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

var _ = dispatcher.DefaultScheduleLease
