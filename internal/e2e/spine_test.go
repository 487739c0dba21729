// Package e2e tests the fleet end to end: real NATS with JetStream, the
// dispatcher, workers (in the test process and as real processes that the
// tests kill), and the commands.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/executor/process"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/worker"
	"github.com/fleet-dev/fleet/job"
)

func processExec(t *testing.T) executor.Executor {
	t.Helper()
	e, err := process.New(process.Config{Dir: t.TempDir(), Grace: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// greeting is a job that writes an output and reads an input.
func greeting(id string) *job.Request {
	return &job.Request{
		ID:      id,
		Command: []string{"sh", "-c", `cat "$FLEET_INPUTS/name.txt" > "$FLEET_OUTPUTS/greeting.txt"; echo " greeted" >> "$FLEET_OUTPUTS/greeting.txt"; echo ran`},
		Inputs:  map[string]string{"name.txt": id},
		Outputs: []string{"greeting.txt"},
	}
}

func checkGreeting(t *testing.T, r *job.Result, id string) {
	t.Helper()
	if r.Status != job.StatusSucceeded {
		t.Fatalf("job %s: status %s, failure %+v, stderr %q", id, r.Status, r.Failure, r.Stderr)
	}
	if got, want := r.Outputs["greeting.txt"], id+" greeted\n"; got != want {
		t.Errorf("job %s: output %q, want %q", id, got, want)
	}
	if r.ExitCode == nil || *r.ExitCode != 0 || r.Attempts != 1 || r.Stdout != "ran\n" {
		t.Errorf("job %s: exit %v attempts %d stdout %q", id, r.ExitCode, r.Attempts, r.Stdout)
	}
}

func TestSubmitEveryWayReachesAResultWithOutputs(t *testing.T) {
	f := fleettest.Start(t)
	f.Worker(t, processExec(t), worker.Config{Slots: 4})
	nc := f.NATS.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// 1. A NATS request on the tenant's submit subject gets the job id
	// back, once the job is queued.
	body, _ := json.Marshal(greeting("via-request"))
	m, err := nc.RequestWithContext(ctx, "fleet.t.default.submit", body)
	if err != nil {
		t.Fatal(err)
	}
	var reply struct {
		JobID string `json:"job_id"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &reply); err != nil || reply.JobID != "via-request" || reply.Error != "" {
		t.Fatalf("reply %s (%v)", m.Data, err)
	}

	// 2. A plain publish on the intake subject, no answer wanted: the
	// intake stream keeps it until a dispatcher takes it.
	body, _ = json.Marshal(greeting("via-publish"))
	if err := nc.Publish("fleet.t.default.intake", body); err != nil {
		t.Fatal(err)
	}

	// 3. A JetStream publish on the intake subject: acknowledged once kept.
	js, _ := jetstream.New(nc)
	body, _ = json.Marshal(greeting("via-jetstream"))
	ack, err := js.Publish(ctx, "fleet.t.default.intake", body)
	if err != nil || ack.Stream != "FLEET_INTAKE" {
		t.Fatalf("js.Publish: %+v, %v", ack, err)
	}

	// 4. HTTP.
	body, _ = json.Marshal(greeting("via-http"))
	resp, err := http.Post(f.API.URL+"/v1/jobs", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("HTTP submit: %s", resp.Status)
	}

	for _, id := range []string{"via-request", "via-publish", "via-jetstream", "via-http"} {
		checkGreeting(t, f.Await(t, id, 20*time.Second), id)
	}

	// 5. fleetctl, waiting for the result as JSON.
	req, _ := json.Marshal(greeting("via-fleetctl"))
	cmd := exec.Command(fleettest.Binary(t, "fleetctl"), "submit", "-f", "-", "--wait", "-o", "json")
	cmd.Env = append(os.Environ(), "FLEET_NATS_URL="+f.NATS.URL())
	cmd.Stdin = bytes.NewReader(req)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("fleetctl: %v\n%s", err, out)
	}
	var res job.Result
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("fleetctl output is not a result: %v\n%s", err, out)
	}
	checkGreeting(t, &res, "via-fleetctl")

	// The HTTP API and fleetctl status agree with the result.
	resp, err = http.Get(f.API.URL + "/v1/jobs/via-http")
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Job    job.Record  `json:"job"`
		Result *job.Result `json:"result"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if st.Job.State != job.StateSucceeded || st.Result == nil || st.Result.Outputs["greeting.txt"] == "" {
		t.Errorf("GET /v1/jobs/via-http: %+v", st)
	}
}

func TestFailuresTimeoutsAndNoProcessLeftBehind(t *testing.T) {
	f := fleettest.Start(t)
	f.Worker(t, processExec(t), worker.Config{Slots: 4})

	f.Submit(t, &job.Request{ID: "exits-3", Command: []string{"sh", "-c", "echo oops >&2; exit 3"}})
	// The command ignores SIGTERM and leaves a child behind: the timeout
	// must kill both.
	marker := fmt.Sprintf("%d.%d", 40+time.Now().Nanosecond()%50, os.Getpid())
	timeout := job.Duration(300 * time.Millisecond)
	f.Submit(t, &job.Request{ID: "too-slow", Timeout: &timeout,
		Command: []string{"sh", "-c", "trap '' TERM; sleep " + marker + " & sleep " + marker + "; wait"}})
	f.Submit(t, &job.Request{ID: "no-such-program", Command: []string{"/does/not/exist"}})

	r := f.Await(t, "exits-3", 20*time.Second)
	if r.Status != job.StatusFailed || r.ExitCode == nil || *r.ExitCode != 3 ||
		r.Failure.Class != job.ClassExecution || r.Stderr != "oops\n" {
		t.Errorf("exits-3: %+v", r)
	}
	r = f.Await(t, "too-slow", 20*time.Second)
	if r.Status != job.StatusTimedOut || r.Failure.Class != job.ClassTimeout || !strings.Contains(r.Failure.Message, "SIGKILL") {
		t.Errorf("too-slow: %+v %+v", r, r.Failure)
	}
	if pids := processesWith(marker); len(pids) > 0 {
		t.Errorf("processes left behind after the timeout: %v", pids)
	}
	r = f.Await(t, "no-such-program", 20*time.Second)
	if r.Status != job.StatusFailed || r.Failure.Code != "start_failed" {
		t.Errorf("no-such-program: %+v %+v", r, r.Failure)
	}

	// Every job that failed is in the dead-letter stream, and each job's
	// events end with its final event.
	evs := f.Events(t, "exits-3", 10*time.Second)
	types := eventTypes(evs)
	if want := "queued started log dead_lettered failed"; types != want {
		t.Errorf("events of exits-3: %q, want %q", types, want)
	}
}

func TestDuplicateIDIsAcceptedOnceAndRunOnce(t *testing.T) {
	f := fleettest.Start(t)
	f.Worker(t, processExec(t), worker.Config{Slots: 4})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	nc := f.NATS.Connect(t)
	ear := listen(t, nc, job.DefaultTenant, "default")

	r := &job.Request{ID: "only-once", Command: []string{"sh", "-c", "sleep 0.2"}}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var fresh, dups int
	for i := 0; i < 5; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := f.Client.Submit(ctx, r)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if s.Duplicate {
				dups++
			} else {
				fresh++
			}
		}()
	}
	wg.Wait()
	f.Await(t, "only-once", 20*time.Second)
	// Once it is finished, a resubmission is still a duplicate.
	s, err := f.Client.Submit(ctx, r)
	if err != nil || !s.Duplicate {
		t.Fatalf("resubmission after the end: %+v, %v", s, err)
	}
	evs := f.Events(t, "only-once", 10*time.Second)
	if n := strings.Count(eventTypes(evs), "started"); n != 1 {
		t.Errorf("job started %d times; events %q", n, eventTypes(evs))
	}
	if dups+fresh != 5 || dups < 1 {
		t.Errorf("%d fresh and %d duplicate answers to 5 concurrent submissions", fresh, dups)
	}
	requireHistory(t, nc, job.DefaultTenant, "default", "", []string{"only-once"}, ear)
}

func TestBadRequestsAreRejectedWithAReason(t *testing.T) {
	f := fleettest.Start(t)
	f.Worker(t, processExec(t), worker.Config{Slots: 2})
	nc := f.NATS.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	for _, tc := range []struct{ name, body, want string }{
		{"malformed JSON", `{"command": ["true"`, "malformed JSON"},
		{"not an object", `"true"`, "expected a JSON object"},
		{"unknown field", `{"command": ["true"], "comand": 1}`, `unknown field "comand"`},
		{"bad duration", `{"command": ["true"], "timeout": "soon"}`, "timeout:"},
		{"bad quantity", `{"command": ["true"], "resources": {"memory": "lots"}}`, "resources.memory:"},
		{"oversized", `{"command": ["true"], "env": {"BIG": "` + strings.Repeat("x", 600<<10) + `"}}`, "over the limit"},
		{"bad id", `{"id": "a b", "command": ["true"]}`, "id:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := f.Client.SubmitJSON(ctx, []byte(tc.body))
			rej, ok := err.(*client.RejectedError)
			if !ok || !strings.Contains(rej.Reason, tc.want) {
				t.Fatalf("got %v, want a rejection mentioning %q", err, tc.want)
			}
		})
	}

	// Garbage published without a reply wanted is dropped, and the
	// dispatcher goes on.
	for i := 0; i < 10; i++ {
		_ = nc.Publish("fleet.t.default.intake", []byte{0xff, byte(i), '{'})
	}

	// A rejected request with a usable id says why on its events and status.
	_, err := f.Client.SubmitJSON(ctx, []byte(`{"id": "bad-mem", "command": ["true"], "resources": {"memory": "1Mi"}}`))
	if err == nil {
		t.Fatal("memory below the minimum was accepted")
	}
	evs := f.Events(t, "bad-mem", 10*time.Second)
	if len(evs) != 1 || evs[0].Type != job.EventRejected || !strings.Contains(evs[0].Message, "resources.memory") {
		t.Errorf("events of bad-mem: %+v", evs)
	}
	st, err := f.Client.Status(ctx, "bad-mem")
	if err != nil || st.Job.State != job.StateRejected {
		t.Errorf("status of bad-mem: %+v, %v", st, err)
	}
	// The same id, now valid, is accepted: a rejection does not hold it.
	f.Submit(t, &job.Request{ID: "bad-mem", Command: []string{"true"}})
	if r := f.Await(t, "bad-mem", 20*time.Second); r.Status != job.StatusSucceeded {
		t.Errorf("bad-mem resubmitted: %s", r.Status)
	}

	// HTTP: a body over the limit is 413, a bad request 400.
	resp, err := http.Post(f.API.URL+"/v1/jobs", "application/json", strings.NewReader(`{"env":{"X":"`+strings.Repeat("x", 600<<10)+`"}}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("oversized HTTP body: %s, want 413", resp.Status)
	}
	resp, err = http.Post(f.API.URL+"/v1/jobs", "application/json", strings.NewReader(`{"timeout": 5}`))
	if err != nil {
		t.Fatal(err)
	}
	var rep struct{ Error string }
	_ = json.NewDecoder(resp.Body).Decode(&rep)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(rep.Error, "duration") {
		t.Errorf("bad HTTP request: %s %q", resp.Status, rep.Error)
	}

	// And the dispatcher still serves.
	f.Submit(t, greeting("after-the-garbage"))
	checkGreeting(t, f.Await(t, "after-the-garbage", 20*time.Second), "after-the-garbage")
}

func TestKilledWorkerLosesNoJob(t *testing.T) {
	f := fleettest.Start(t)
	env := []string{"FLEET_NATS_URL=" + f.NATS.URL(), "FLEET_DATA_DIR=" + t.TempDir(), "FLEET_REDIS_URL="}
	first := fleettest.StartProc(t, "worker", env, "--id", "doomed", "--slots", "2", "--ack-wait", "2s")
	first.WaitOutput(t, "worker started", 20*time.Second)
	nc := f.NATS.Connect(t)
	ear := listen(t, nc, job.DefaultTenant, "default")

	marker := t.TempDir()
	id := f.Submit(t, &job.Request{ID: "survivor", Retry: &job.RetryPolicy{MaxAttempts: 3},
		Command: []string{"sh", "-c", "touch " + marker + "/attempt-$FLEET_ATTEMPT; sleep 1.5; echo done > $FLEET_OUTPUTS/out"},
		Outputs: []string{"out"}})
	waitFile(t, filepath.Join(marker, "attempt-1"), 20*time.Second)
	// Once the attempt is recorded as running (a process attempt is, once
	// it has run --running-after), its loss is the job's history.
	waitFor(t, "the attempt recorded running", 20*time.Second, func() bool {
		st, err := f.Client.Status(context.Background(), id)
		return err == nil && st.Job.State == job.StateRunning
	})
	first.Kill() // SIGKILL, mid-attempt

	second := fleettest.StartProc(t, "worker", env, "--id", "heir", "--slots", "2", "--ack-wait", "2s")
	second.WaitOutput(t, "worker started", 20*time.Second)
	r := f.Await(t, id, 30*time.Second)
	if r.Status != job.StatusSucceeded || r.WorkerID != "heir" || r.Attempts != 2 || r.Outputs["out"] != "done\n" {
		t.Fatalf("result: %+v", r)
	}
	if len(r.History) != 1 || r.History[0].WorkerID != "doomed" || r.History[0].Failure.Code != job.CodeWorkerLost {
		t.Errorf("history: %+v", r.History)
	}
	// The killed worker's process died with it and did not finish.
	if _, err := os.Stat(filepath.Join(marker, "attempt-1")); err != nil {
		t.Error(err)
	}
	requireHistory(t, nc, job.DefaultTenant, "default", "", []string{id}, ear)
}

// A job whose first delivery kills its worker at once, before the attempt
// is recorded as running (a process attempt is, once it has run
// --running-after), is delivered again; that delivery records its attempt
// before it starts, so that a job that kills every worker it reaches is
// counted lost each time, up to its max_lost, and fails: it does not come
// back forever.
func TestAJobThatKillsItsWorkerAtOnceEnds(t *testing.T) {
	f := fleettest.Start(t)
	env := []string{"FLEET_NATS_URL=" + f.NATS.URL(), "FLEET_DATA_DIR=" + t.TempDir(), "FLEET_REDIS_URL="}
	nc := f.NATS.Connect(t)
	ear := listen(t, nc, job.DefaultTenant, "default")
	lost := 2
	// The attempt kills the worker that runs it (its parent) at once.
	id := f.Submit(t, &job.Request{ID: "poison", Retry: &job.RetryPolicy{MaxAttempts: 1, MaxLost: &lost},
		Command: []string{"sh", "-c", "kill -9 $PPID"}})
	ended := func() bool {
		st, err := f.Client.Status(context.Background(), id)
		return err == nil && st.Job.State.Final()
	}
	killed := 0
	for i := 0; !ended(); i++ {
		if i == 6 {
			t.Fatalf("the job did not end after %d workers it killed", killed)
		}
		// (It may be killed before it says it started.)
		w := fleettest.StartProc(t, "worker", env, "--id", fmt.Sprintf("w%d", i), "--slots", "1", "--ack-wait", "1s")
		waitFor(t, "the worker killed, or the job ended", 30*time.Second, func() bool { return w.Wait(0) || ended() })
		if w.Wait(time.Second) {
			killed++
			t.Logf("worker w%d killed", i)
		}
	}
	r := f.Await(t, id, 10*time.Second)
	if r.Status != job.StatusFailed || r.Failure == nil || r.Failure.Code != job.CodeWorkerLost {
		t.Fatalf("result %+v; want failed, worker_lost", r)
	}
	// Each delivery after the first is a lost attempt, and the third lost
	// (over max_lost 2) ends the job; the first counts only if its worker
	// had recorded the attempt before it died (it does after 20 ms, which
	// the start of a shell can outlast on a busy machine).
	if killed < 3 || killed > 4 || len(r.History) != 2 {
		t.Errorf("%d workers killed, %d attempts in its history; want 3 or 4 (the first delivery's, uncounted when it died at once) and 2", killed, len(r.History))
	}
	requireHistory(t, nc, job.DefaultTenant, "default", "", []string{id}, ear)
}

func TestDispatcherRestartLosesNothingAccepted(t *testing.T) {
	f := fleettest.Start(t) // NATS and an in-process dispatcher we leave alone
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Stop the in-process dispatcher so the process below is the only one.
	if err := f.Dispatcher.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	env := []string{"FLEET_NATS_URL=" + f.NATS.URL(), "FLEET_HTTP_ADDR=127.0.0.1:0", "FLEET_ACK_WAIT=2s", "FLEET_REDIS_URL="}
	d := fleettest.StartProc(t, "dispatcher", env)
	d.WaitOutput(t, "dispatcher ready", 20*time.Second)
	nc := f.NATS.Connect(t)
	ear := listen(t, nc, job.DefaultTenant, "default")

	var accepted []string
	for i := 0; i < 40; i++ {
		s, err := f.Client.Submit(ctx, &job.Request{ID: fmt.Sprintf("acc-%d", i), Command: []string{"true"}})
		if err != nil {
			t.Fatal(err)
		}
		accepted = append(accepted, s.JobID)
	}
	// Fire-and-forget submissions while the dispatcher dies and is away.
	for i := 0; i < 40; i++ {
		body, _ := json.Marshal(&job.Request{ID: fmt.Sprintf("ff-%d", i), Command: []string{"true"}})
		if err := nc.Publish("fleet.t.default.intake", body); err != nil {
			t.Fatal(err)
		}
		if i == 10 {
			d.Kill()
		}
		accepted = append(accepted, fmt.Sprintf("ff-%d", i))
	}
	_ = nc.Flush()
	d2 := fleettest.StartProc(t, "dispatcher", env)
	d2.WaitOutput(t, "dispatcher ready", 20*time.Second)
	f.Worker(t, processExec(t), worker.Config{Slots: 8})
	for _, id := range accepted {
		if r := f.Await(t, id, 30*time.Second); r.Status != job.StatusSucceeded {
			t.Errorf("%s: %s", id, r.Status)
		}
	}
	requireHistory(t, nc, job.DefaultTenant, "default", "", accepted, ear)
}

func eventTypes(evs []*job.Event) string {
	var s []string
	for _, e := range evs {
		s = append(s, string(e.Type))
	}
	return strings.Join(s, " ")
}

func waitFile(t *testing.T, p string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(p); err == nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s did not appear within %s", p, d)
}

// processesWith lists the pids whose command line contains s.
func processesWith(s string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if bytes.Contains(cmdline, []byte(s)) {
			// A zombie awaiting its parent is gone already.
			stat, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
			if !bytes.Contains(stat, []byte(") Z ")) {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// TestSubmitIsSentAgainUntilADispatcherAnswers submits while no dispatcher
// runs: the client sends the request again with the same id until one
// answers, and the fleet runs one job, with one result, for it.
func TestSubmitIsSentAgainUntilADispatcherAnswers(t *testing.T) {
	f := fleettest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := f.Dispatcher.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	f.Worker(t, processExec(t), worker.Config{Slots: 2})
	nc := f.NATS.Connect(t)
	ear := listen(t, nc, job.DefaultTenant, "default")

	type answer struct {
		s   *client.Submission
		err error
	}
	done := make(chan answer, 1)
	sent := copies(t, nc, job.DefaultTenant, 3)
	go func() {
		s, err := f.Client.Submit(ctx, &job.Request{ID: "retried", Command: []string{"true"}})
		done <- answer{s, err}
	}()
	select { // the request, and two copies sent again when nobody answered
	case <-sent:
	case a := <-done:
		t.Fatalf("answered with no dispatcher running: %+v %v", a.s, a.err)
	case <-ctx.Done():
		t.Fatal("the client did not send its request again")
	}
	select {
	case a := <-done:
		t.Fatalf("answered with no dispatcher running: %+v %v", a.s, a.err)
	default:
	}
	env := []string{"FLEET_NATS_URL=" + f.NATS.URL(), "FLEET_HTTP_ADDR=127.0.0.1:0", "FLEET_REDIS_URL="}
	fleettest.StartProc(t, "dispatcher", env).WaitOutput(t, "dispatcher ready", 20*time.Second)
	a := <-done
	if a.err != nil || a.s.JobID != "retried" {
		t.Fatalf("submit: %+v %v", a.s, a.err)
	}
	again, err := f.Client.Submit(ctx, &job.Request{ID: "retried", Command: []string{"true"}})
	if err != nil || !again.Duplicate {
		t.Fatalf("the same id again: %+v %v, want a duplicate", again, err)
	}
	if r := f.Await(t, "retried", 20*time.Second); r.Status != job.StatusSucceeded || r.Attempts != 1 {
		t.Fatalf("result %s after %d attempts", r.Status, r.Attempts)
	}
	js, _ := jetstream.New(nc)
	info, err := js.Stream(ctx, "FLEET_POOL_default")
	if err != nil {
		t.Fatal(err)
	}
	// One version queued the job (its request), one result ended it.
	for subject, want := range map[string]uint64{"fleet.p.default.q3.default.retried": 1, "fleet.p.default.r.default.retried": 1} {
		// State.Msgs is the whole stream's; the filter fills Subjects.
		st, err := info.Info(ctx, jetstream.WithSubjectFilter(subject))
		if err != nil {
			t.Fatal(err)
		}
		if n := st.State.Subjects[subject]; n != want {
			t.Fatalf("%s: %d messages, want %d", subject, n, want)
		}
	}
	requireHistory(t, nc, job.DefaultTenant, "default", "", []string{"retried"}, ear)
}
