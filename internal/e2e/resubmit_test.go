package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/internal/capacity"
	"github.com/fleet-dev/fleet/internal/capacity/monitor"
	"github.com/fleet-dev/fleet/internal/dispatcher"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/redistest"
	"github.com/fleet-dev/fleet/job"
)

// The README's tour, when the worker is not up yet: a request for a pool
// with no live worker is rejected, and sent again with the same id once
// the worker is listed, it replaces the rejection, and is followed to its
// end.

// rejectingFleet is a fleet whose admission refuses what no live worker
// could run, and no worker yet.
func rejectingFleet(t *testing.T) (*fleettest.Fleet, *capacity.Store) {
	t.Helper()
	rs := redistest.Start(t)
	caps := openCapacity(t, rs.URL())
	adm, err := monitor.NewAdmission(caps, monitor.AdmitReject, fleettest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := adm.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = adm.Stop(context.Background()) })
	return fleettest.Start(t, func(c *dispatcher.Config) { c.Admission = adm }), caps
}

// startListedWorker starts a worker of pool default and waits until
// `fleetctl workers` would list it.
func startListedWorker(t *testing.T, f *fleettest.Fleet, caps *capacity.Store, id string) {
	t.Helper()
	capacityWorker(t, f, caps, id, 2, nil, nil)
	waitFor(t, "the worker in Redis", 10*time.Second, func() bool {
		hbs, err := caps.Workers(context.Background(), "default")
		return err == nil && len(hbs) == 1
	})
}

// fleetctl runs the fleetctl binary against f with stdin and returns its
// exit code, stdout and stderr.
func fleetctl(t *testing.T, f *fleettest.Fleet, stdin []byte, args ...string) (int, string, string) {
	t.Helper()
	bin := fleettest.Binary(t, "fleetctl") // built before the clock starts: a cold build takes most of a minute
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "FLEET_NATS_URL="+f.NATS.URL())
	cmd.Stdin = bytes.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("fleetctl %s: %v", strings.Join(args, " "), err)
	}
	return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
}

// TestFleetctlFollowsASubmissionThatReplacedARejection: the tour's
// `fleetctl submit -f - --wait`, run before the worker is up, exits 2 with
// the reason; run again once the worker is listed, it follows the job the
// second submission queued to its end and exits 0, and `fleetctl watch`
// shows that job's events, from queued to succeeded, with no rejection.
func TestFleetctlFollowsASubmissionThatReplacedARejection(t *testing.T) {
	f, caps := rejectingFleet(t)
	req := []byte(`{"id": "tour-1", "command": ["sh", "-c", "echo hi"]}`)

	code, out, errOut := fleetctl(t, f, req, "submit", "-f", "-", "--wait")
	if code != 2 || !strings.Contains(errOut, `pool "default" has no live worker`) {
		t.Fatalf("submit --wait before the worker: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}

	startListedWorker(t, f, caps, "tour-worker")
	code, out, errOut = fleetctl(t, f, req, "submit", "-f", "-", "--wait")
	if code != 0 || !strings.Contains(out, "result: succeeded after 1 attempt(s)") || strings.Contains(out+errOut, "rejected") {
		t.Errorf("submit --wait once the worker is listed: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}

	code, out, errOut = fleetctl(t, f, nil, "watch", "tour-1", "-o", "json")
	if code != 0 {
		t.Fatalf("watch: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	var types []job.EventType
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var e job.Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("watch -o json printed %q: %v", sc.Text(), err)
		}
		types = append(types, e.Type)
	}
	if len(types) < 3 || types[0] != job.EventQueued || types[len(types)-1] != job.EventSucceeded ||
		slices.Contains(types, job.EventRejected) {
		t.Fatalf("watch printed the events %v, want queued … succeeded and no rejection", types)
	}
}

// TestEventsAndResultFollowTheJobAsItStands: while a job's latest version
// is a rejection, Events ends at it and Result returns it as a
// *RejectedError; once a later submission of the id replaced it, Events
// replays from that submission's queued version to its end, and Result
// returns its result. The history still holds the rejection.
func TestEventsAndResultFollowTheJobAsItStands(t *testing.T) {
	f, caps := rejectingFleet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req := &job.Request{ID: "again", Command: []string{"true"}}
	var rej *client.RejectedError
	if _, err := f.Client.Submit(ctx, req); !errors.As(err, &rej) || !strings.Contains(rej.Reason, "has no live worker") {
		t.Fatalf("submit before the worker: %v", err)
	}

	// A watcher of the rejection sees it, and ends there.
	evs := f.Events(t, "again", 10*time.Second)
	if len(evs) != 1 || evs[0].Type != job.EventRejected || !strings.Contains(evs[0].Message, "has no live worker") {
		t.Fatalf("events of the rejected job: %v", typesOf(evs))
	}
	wait, stop := context.WithTimeout(ctx, 10*time.Second)
	_, err := f.Client.Result(wait, "again")
	stop()
	if !errors.As(err, &rej) || !strings.Contains(rej.Reason, "has no live worker") {
		t.Errorf("result of the rejected job: %v, want a *client.RejectedError", err)
	}

	startListedWorker(t, f, caps, "late-worker")
	s, err := f.Client.Submit(ctx, req)
	if err != nil || s.Duplicate || s.State != job.StateQueued {
		t.Fatalf("submit once the worker is listed: %+v, %v", s, err)
	}
	evs = f.Events(t, "again", 20*time.Second)
	types := typesOf(evs)
	if len(evs) < 3 || types[0] != job.EventQueued || types[len(types)-1] != job.EventSucceeded ||
		slices.Contains(types, job.EventRejected) {
		t.Errorf("events of the job submitted again: %v, want queued … succeeded and no rejection", types)
	}
	if r := f.Await(t, "again", 20*time.Second); r.Status != job.StatusSucceeded {
		t.Fatalf("result of the job submitted again: %s", r.Status)
	}
	h, err := f.Client.History(ctx, "again")
	if err != nil {
		t.Fatal(err)
	}
	var states []job.State
	for _, rec := range h.Records {
		states = append(states, rec.State)
	}
	if len(states) < 4 || states[0] != job.StateRejected || states[1] != job.StateQueued || states[len(states)-1] != job.StateSucceeded {
		t.Fatalf("history: %v, want rejected, queued … succeeded", states)
	}
}

func typesOf(evs []*job.Event) []job.EventType {
	out := make([]job.EventType, len(evs))
	for i, e := range evs {
		out[i] = e.Type
	}
	return out
}

// TestASubmissionThatWaitedForTheFirstWorkerIsNoDuplicate: the README's
// tour once more, with the worker a second late: the dispatcher holds the
// request until the pool's first worker reports (up to 2 s), while the
// client, unanswered after half a second, sends its copy again. The job
// is queued once, and the answer the client reads (that of its last copy)
// says submitted, not "already exists": every copy carries the one
// submission's token (job.SubmissionHeader).
func TestASubmissionThatWaitedForTheFirstWorkerIsNoDuplicate(t *testing.T) {
	f, caps := rejectingFleet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	type answer struct {
		s   *client.Submission
		err error
	}
	answered := make(chan answer, 1)
	sent := copies(t, f.NATS.Connect(t), job.DefaultTenant, 2)
	start := time.Now()
	go func() {
		s, err := f.Client.Submit(ctx, &job.Request{ID: "waited", Command: []string{"true"}})
		answered <- answer{s, err}
	}()
	select { // the client has sent its second copy
	case <-sent:
	case <-ctx.Done():
		t.Fatal("the client did not send its request again")
	}
	startListedWorker(t, f, caps, "late-worker")
	a := <-answered
	if a.err != nil || a.s.Duplicate || a.s.State == job.StateRejected {
		t.Fatalf("submit that waited %v for the first worker: %+v, %v; want it submitted, not a duplicate",
			time.Since(start).Round(time.Millisecond), a.s, a.err)
	}
	if r := f.Await(t, "waited", 20*time.Second); r.Status != job.StatusSucceeded {
		t.Fatalf("result: %s", r.Status)
	}
	h, err := f.Client.History(ctx, "waited")
	if err != nil {
		t.Fatal(err)
	}
	queued := 0
	for _, rec := range h.Records {
		if rec.State == job.StateQueued && rec.Event == job.EventQueued {
			queued++
		}
	}
	if queued != 1 {
		t.Fatalf("the job was queued %d times, want once", queued)
	}
	// Another submission of the id, later, is one.
	s, err := f.Client.Submit(ctx, &job.Request{ID: "waited", Command: []string{"true"}})
	if err != nil || !s.Duplicate {
		t.Fatalf("a second submission of the id: %+v, %v; want a duplicate", s, err)
	}
}
