package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/natstest"
	"github.com/fleet-dev/fleet/job"
)

// TestScheduleSurvivesItsDispatchersKill runs two dispatchers as processes
// and a schedule firing every 2 s; it kills (SIGKILL) the one holding the
// schedules' lease and checks that the other takes the lease over and goes
// on firing: every slot from the first firing to the last fired once, no
// job id queued twice, each job run once with one result (historytest),
// and the firings after the kill late by at most the lease and a second.
func TestScheduleSurvivesItsDispatchersKill(t *testing.T) {
	const (
		every = 2 * time.Second
		lease = 3 * time.Second
		name  = "failover"
	)
	fleettest.Binary(t, "dispatcher") // built before the clock starts
	srv := natstest.Run(t)
	env := []string{"FLEET_NATS_URL=" + srv.URL(), "FLEET_REDIS_URL=", "FLEET_DATA_DIR=" + t.TempDir(),
		"FLEET_HTTP_ADDR=127.0.0.1:0"}
	leaseFlag := []string{"--schedule-lease", lease.String(), "--log-level", "info"}
	ds := []*fleettest.Proc{fleettest.StartProc(t, "dispatcher", env, leaseFlag...)}
	ds[0].WaitOutput(t, "dispatcher ready", 30*time.Second)
	ds = append(ds, fleettest.StartProc(t, "dispatcher", env, leaseFlag...))
	ds[1].WaitOutput(t, "dispatcher ready", 30*time.Second)
	fleettest.StartProc(t, "worker", env, "--id", "sched-w", "--slots", "4").WaitOutput(t, "worker started", 30*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nc := srv.Connect(t)
	c, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, "fleet-schedules")
	if err != nil {
		t.Fatalf("the schedules' bucket: %v", err)
	}
	ear := listen(t, nc, job.DefaultTenant, "default")
	iv := job.Duration(every)
	if _, err := c.CreateSchedule(ctx, &job.Schedule{Name: name, Every: &iv, Overlap: job.OverlapAllow,
		Template: &job.Request{Command: []string{"true"}}}); err != nil {
		t.Fatalf("create the schedule: %v", err)
	}

	// Two firings made; then the holder of the lease, as its log and the
	// bucket say, is killed.
	waitFirings(t, srv, name, 2, 10*time.Second)
	before := holder(t, kv)
	var victim, survivor *fleettest.Proc
	for i, d := range ds {
		if strings.Contains(d.Output(), "this dispatcher holds their lease") {
			if victim != nil {
				t.Fatal("both dispatchers say they hold the schedules' lease")
			}
			victim, survivor = d, ds[1-i]
		}
	}
	if victim == nil {
		t.Fatalf("no dispatcher says it holds the schedules' lease (the bucket says %s)", before)
	}
	victim.Kill()
	killed := time.Now()
	t.Logf("killed the lease's holder %s (pid %d)", before, victim.Cmd.Process.Pid)

	// The survivor takes the lease over within it and a second, and fires
	// on: the slots during the takeover, late, then each on time.
	survivor.WaitOutput(t, "this dispatcher holds their lease", lease+2*time.Second)
	took := time.Since(killed)
	if after := holder(t, kv); after == before {
		t.Fatalf("the lease still names the killed dispatcher %s", before)
	}
	// Free within the lease and a third of it after the last renewal, which
	// came before the kill; and a little for the log to be read.
	if limit := lease + lease/3 + 250*time.Millisecond; took > limit {
		t.Errorf("the survivor took the lease over %s after the kill, want at most %s", took, limit)
	}
	t.Logf("the survivor took the lease over %s after the kill", took.Round(time.Millisecond))
	n := len(firings(t, srv, name))
	recs := waitFirings(t, srv, name, n+3, 3*every+lease+time.Second)

	// Every slot from the first firing to the last, once.
	var slots []time.Time
	for id, rs := range recs {
		if len(rs) != 1 {
			t.Errorf("job %s queued %d times", id, len(rs))
		}
		at, err := time.Parse(job.FiringLayout, rs[0].Labels[job.LabelFiring])
		if err != nil {
			t.Fatalf("job %s: label %s: %v", id, job.LabelFiring, err)
		}
		if want := job.FiringID(name, at); id != want {
			t.Errorf("job id %s, want %s", id, want)
		}
		slots = append(slots, at)
		late := rs[0].SubmittedAt.Sub(at)
		if at.After(killed.Add(-every)) && late > lease+time.Second {
			t.Errorf("firing %s after the kill queued %s late, want at most %s", at.Format(time.TimeOnly), late, lease+time.Second)
		}
		t.Logf("firing %s queued %s late", at.Format(time.TimeOnly), late.Round(time.Millisecond))
	}
	sort.Slice(slots, func(i, j int) bool { return slots[i].Before(slots[j]) })
	for i := 1; i < len(slots); i++ {
		if gap := slots[i].Sub(slots[i-1]); gap != every {
			t.Errorf("firings %s and %s: %s apart, want %s (a slot missed)", slots[i-1].Format(time.TimeOnly),
				slots[i].Format(time.TimeOnly), gap, every)
		}
	}
	if !slots[len(slots)-1].After(killed.Add(lease)) {
		t.Errorf("no firing after the takeover: the last is %s, the kill at %s", slots[len(slots)-1], killed)
	}
	// Each ran once, and the schedule counts no firing missed or skipped.
	for id := range recs {
		r, err := c.Result(ctx, id)
		if err != nil || r.Status != job.StatusSucceeded || r.Attempts != 1 {
			t.Errorf("job %s: %+v, %v", id, r, err)
		}
	}
	info, err := c.Schedule(ctx, name)
	if err != nil {
		t.Fatalf("show the schedule: %v", err)
	}
	if info.State.Missed != 0 || info.State.Skipped != 0 || info.State.Made < int64(len(recs)) {
		t.Errorf("the schedule's counts: made %d, missed %d, skipped %d; %d jobs", info.State.Made, info.State.Missed,
			info.State.Skipped, len(recs))
	}
	// The schedule fires on: the firings read above must have ended,
	// and any later one may still run.
	requireHistory(t, nc, job.DefaultTenant, "default", name+"-", slices.Collect(maps.Keys(recs)), ear)
}

// holder is the dispatcher the schedules' lease names.
func holder(t *testing.T, kv jetstream.KeyValue) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	e, err := kv.Get(ctx, "leader")
	if err != nil {
		t.Fatalf("the schedules' lease: %v", err)
	}
	var v struct {
		Holder string `json:"holder"`
	}
	if err := json.Unmarshal(e.Value(), &v); err != nil || v.Holder == "" {
		t.Fatalf("the schedules' lease %q: %v", e.Value(), err)
	}
	return v.Holder
}

// waitFirings waits until n jobs of schedule name are queued, and returns
// them as firings does.
func waitFirings(t *testing.T, srv *natstest.Server, name string, n int, within time.Duration) map[string][]*job.Record {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		recs := firings(t, srv, name)
		if len(recs) >= n {
			return recs
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d firings of %s within %s, want %d", len(recs), name, within, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// firings reads the first version of every job that schedule name queued
// in pool default, by job id: a job queued twice shows as two.
func firings(t *testing.T, srv *natstest.Server, name string) map[string][]*job.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js, err := jetstream.New(srv.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	out, err := readFirings(ctx, js, name)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// readFirings reads the first version of every job that schedule name
// queued in pool default, by job id.
func readFirings(ctx context.Context, js jetstream.JetStream, name string) (map[string][]*job.Record, error) {
	s, err := js.Stream(ctx, "FLEET_POOL_default")
	if err != nil {
		return nil, fmt.Errorf("the pool's stream: %w", err)
	}
	var filters []string
	for p := job.HighestPriority; p <= job.LowestPriority; p++ {
		filters = append(filters, fmt.Sprintf("fleet.p.default.q%d.>", p))
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: filters})
	if err != nil {
		return nil, fmt.Errorf("read the pool's stream: %w", err)
	}
	out := map[string][]*job.Record{}
	for {
		batch, err := cons.FetchNoWait(256)
		if err != nil {
			return nil, fmt.Errorf("read the pool's stream: %w", err)
		}
		got, pending := 0, uint64(0)
		for m := range batch.Messages() {
			got++
			var rec job.Record
			if err := json.Unmarshal(m.Data(), &rec); err != nil {
				return nil, fmt.Errorf("a record in the pool's stream: %w", err)
			}
			if rec.Labels[job.LabelSchedule] == name {
				out[rec.ID] = append(out[rec.ID], &rec)
			}
			if md, err := m.Metadata(); err == nil {
				pending = md.NumPending
			}
		}
		if got == 0 || pending == 0 {
			return out, nil
		}
	}
}
