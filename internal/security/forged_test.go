package security_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/internal/dispatcher"
	"github.com/fleet-dev/fleet/internal/testenv"
	"github.com/fleet-dev/fleet/job"
)

// TestAWorkerCannotRewriteAnotherPoolsJob: an outside client (the nats
// CLI) holding pool default's worker seed publishes, on its own pool's
// subjects, as its role allows, versions of the records of tenant acme's
// jobs of pool gpu: a copy of the record (its body naming pool gpu, its
// subject pool default) and one whose body names pool default, each with
// another worker and a submission in 2099, so that it would be "the most
// recently submitted". Once as a final version, once (for other jobs) as a
// non-final one. What acme reads of its gpu jobs does not change: status
// and history over NATS (read with the CLI), status, outputs and logs over
// HTTP and through the Go client; a cancel of the running job stops it
// (it ends cancelled), and one of the finished job says it has ended as it
// did.
func TestAWorkerCannotRewriteAnotherPoolsJob(t *testing.T) {
	bin := testenv.NatsCLI(t)
	f := startFleet(t)
	c := natsRunner{bin: bin, url: f.srv.url(), home: t.TempDir(), keys: f.keys}
	api := httptest.NewServer(dispatcher.NewAPI(f.d))
	defer api.Close()
	forger := roleWorker("default")
	acme := roleTenant("acme")

	for _, tc := range []struct {
		name, kind string
		forge      func(r *job.Record, pool string)
	}{
		{"a forged final version", "r", func(r *job.Record, pool string) {
			now := time.Now()
			fl := job.Failf(job.ClassExecution, job.CodeExitCode, "forged by a worker of pool default")
			r.State, r.Event, r.Failure, r.Message, r.FinishedAt = job.StateFailed, job.EventFailed, fl, fl.Message, &now
			r.Result = &job.Result{JobID: r.ID, Pool: pool, Status: job.StatusFailed, Attempts: 1, FinishedAt: now, Failure: fl,
				Outputs: map[string]string{"out.txt": "forged"}}
		}},
		{"a forged non-final version", "s", func(r *job.Record, pool string) {
			r.State, r.Event, r.Attempt, r.Result, r.FinishedAt = job.StateRunning, job.EventStarted, 2, nil, nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			done := submit(t, f, f.acme, &job.Request{Pool: "gpu", Command: []string{"ok"}, Outputs: []string{"out.txt"}})
			if r := result(t, f, f.acme, done); r.Status != job.StatusSucceeded || r.Outputs["out.txt"] != "hi" {
				t.Fatalf("the finished job's result: %+v", r)
			}
			running := submit(t, f, f.acme, &job.Request{Pool: "gpu", Command: []string{"block"}})
			for e, err := range f.acme.Events(ctx, running) {
				if err != nil {
					t.Fatalf("events: %v", err)
				}
				if e.Type == job.EventStarted {
					break
				}
			}
			r := reader{t: t, ctx: ctx, cli: c, role: acme, api: api.URL, client: f.acme}
			before := map[string]tenantView{running: r.view(running, false), done: r.view(done, true)}
			// A producer waiting for the running job's result, and one
			// following its events, from before the forgeries on: what
			// they hear live of another pool is not the job's.
			awaited := make(chan *job.Result, 1)
			go func() {
				res, err := f.acme.Result(ctx, running)
				if err != nil {
					t.Errorf("the waiting producer: %v", err)
				}
				awaited <- res
			}()
			followed := make(chan []*job.Event, 1)
			go func() {
				var evs []*job.Event
				for e, err := range f.acme.Events(ctx, running) {
					if err != nil {
						t.Errorf("the following producer: %v", err)
						break
					}
					evs = append(evs, e)
				}
				followed <- evs
			}()
			time.Sleep(200 * time.Millisecond) // both listen

			for _, id := range []string{running, done} {
				for _, pool := range []string{"gpu", "default"} {
					forged := *before[id].status.Job
					forged.WorkerID, forged.SubmittedAt = "forged-by-default", time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC)
					forged.Pool = pool // gpu: a copy; default: a body that agrees with its subject
					tc.forge(&forged, pool)
					body, err := json.Marshal(&forged)
					if err != nil {
						t.Fatal(err)
					}
					subject := fmt.Sprintf("fleet.p.default.%s.acme.%s", tc.kind, id)
					pub := c.cmd(ctx, forger, "pub", "--jetstream", "--no-templates", subject, string(body))
					if out, err := pub.CombinedOutput(); err != nil || !strings.Contains(string(out), "FLEET_POOL_default") {
						t.Fatalf("the forged version was not stored: %v\n%s", err, out)
					}
					for _, id := range []string{running, done} {
						if diff := before[id].diff(r.view(id, id == done)); diff != "" {
							t.Fatalf("after a version of job %s with pool %s in its body on %s, what acme reads of job %s changed:\n%s",
								forged.ID, pool, subject, id, diff)
						}
					}
				}
			}

			// The finished job has nothing to cancel, as before.
			var cr job.CancelReply
			if err := json.Unmarshal(c.run(t, acme, "request", "--raw", "fleet.t.acme.cancel."+done, ""), &cr); err != nil ||
				cr.Cancelled || cr.State != job.StateSucceeded {
				t.Fatalf("cancel of the finished job: %+v, %v", cr, err)
			}
			// The running one is stopped.
			if err := json.Unmarshal(c.run(t, acme, "request", "--raw", "fleet.t.acme.cancel."+running, ""), &cr); err != nil ||
				!cr.Cancelled || cr.State != job.StateRunning {
				t.Fatalf("cancel of the running job: %+v, %v", cr, err)
			}
			if res := result(t, f, f.acme, running); res.Status != job.StatusCancelled || res.Pool != "gpu" {
				t.Fatalf("the running job's result after the cancel: %+v", res)
			}
			if res := <-awaited; res == nil || res.Status != job.StatusCancelled || res.Pool != "gpu" || res.WorkerID == "forged-by-default" {
				t.Fatalf("the producer waiting since before the forgeries got %+v", res)
			}
			evs := <-followed
			for _, e := range evs {
				if e.WorkerID == "forged-by-default" || e.Pool != "gpu" {
					t.Errorf("the producer following the job heard %+v", e)
				}
			}
			if n := len(evs); n == 0 || evs[n-1].Type != job.EventCancelled {
				t.Errorf("the producer following the job heard %d events, the last not cancelled", n)
			}
			var h job.HistoryReply
			if err := json.Unmarshal(c.run(t, acme, "request", "--raw", "fleet.t.acme.history."+running, ""), &h); err != nil || len(h.Records) == 0 {
				t.Fatalf("history: %+v, %v", h, err)
			}
			for _, rec := range h.Records {
				if rec.Pool != "gpu" || rec.WorkerID == "forged-by-default" {
					t.Fatalf("a version in the history of job %s: %+v", running, rec)
				}
			}
			if last := h.Records[len(h.Records)-1]; last.State != job.StateCancelled {
				t.Fatalf("the last version of job %s: %s", running, last.State)
			}
		})
	}
	f.noViolations(t)
}

// reader reads what tenant acme is told of its jobs: over NATS with the
// nats CLI, over HTTP, and through the Go client.
type reader struct {
	t      *testing.T
	ctx    context.Context
	cli    natsRunner
	role   string
	api    string
	client *client.Client
}

// tenantView is what a tenant reads of a job.
type tenantView struct {
	statusRaw, httpStatus []byte
	status                *job.StatusReply
	records               []*job.Record
	seqs                  []uint64
	// of a finished job: its output out.txt and its log, through the Go
	// client and over HTTP
	output, httpOutput, logs, httpLogs string
}

func (r reader) view(id string, finished bool) tenantView {
	t := r.t
	t.Helper()
	v := tenantView{statusRaw: bytes.TrimSpace(r.cli.run(t, r.role, "request", "--raw", "fleet.t.acme.status."+id, ""))}
	if err := json.Unmarshal(v.statusRaw, &v.status); err != nil || v.status.Job == nil {
		t.Fatalf("status of %s: %q, %v", id, v.statusRaw, err)
	}
	var h job.HistoryReply
	if err := json.Unmarshal(r.cli.run(t, r.role, "request", "--raw", "fleet.t.acme.history."+id, ""), &h); err != nil {
		t.Fatalf("history of %s: %v", id, err)
	}
	v.records, v.seqs = h.Records, h.Seqs
	v.httpStatus = bytes.TrimSpace([]byte(r.get("/v1/jobs/" + id)))
	if !finished {
		return v
	}
	o, err := r.client.Output(r.ctx, id, "out.txt")
	if err != nil {
		t.Fatalf("output of %s: %v", id, err)
	}
	b, err := io.ReadAll(o)
	o.Close()
	if err != nil {
		t.Fatalf("output of %s: %v", id, err)
	}
	v.output = string(b)
	lr, err := r.client.Logs(r.ctx, id, client.LogOptions{})
	if err != nil {
		t.Fatalf("logs of %s: %v", id, err)
	}
	b, err = io.ReadAll(lr)
	lr.Close()
	if err != nil {
		t.Fatalf("logs of %s: %v", id, err)
	}
	v.logs = string(b)
	v.httpOutput, v.httpLogs = r.get("/v1/jobs/"+id+"/outputs/out.txt"), r.get("/v1/jobs/"+id+"/logs")
	return v
}

// get reads a path of the HTTP API as tenant acme: its status and body.
func (r reader) get(path string) string {
	req, err := http.NewRequestWithContext(r.ctx, http.MethodGet, r.api+path, nil)
	if err != nil {
		r.t.Fatal(err)
	}
	req.Header.Set(dispatcher.TenantHeader, "acme")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		r.t.Fatalf("GET %s: %v", path, err)
	}
	return resp.Status + " " + string(body)
}

// diff says how two views differ; empty when they do not.
func (v tenantView) diff(w tenantView) string {
	var out []string
	if !bytes.Equal(v.statusRaw, w.statusRaw) {
		out = append(out, fmt.Sprintf("status over NATS:\n  %s\n  %s", v.statusRaw, w.statusRaw))
	}
	if !bytes.Equal(v.httpStatus, w.httpStatus) {
		out = append(out, fmt.Sprintf("status over HTTP:\n  %s\n  %s", v.httpStatus, w.httpStatus))
	}
	if !reflect.DeepEqual(v.seqs, w.seqs) || !reflect.DeepEqual(v.records, w.records) {
		out = append(out, fmt.Sprintf("history: versions %v, then %v; last %+v, then %+v", v.seqs, w.seqs, last(v.records), last(w.records)))
	}
	for _, d := range []struct{ what, a, b string }{{"output", v.output, w.output}, {"output over HTTP", v.httpOutput, w.httpOutput},
		{"logs", v.logs, w.logs}, {"logs over HTTP", v.httpLogs, w.httpLogs}} {
		if d.a != d.b {
			out = append(out, fmt.Sprintf("%s: %q, then %q", d.what, d.a, d.b))
		}
	}
	return strings.Join(out, "\n")
}

func last(recs []*job.Record) *job.Record {
	if len(recs) == 0 {
		return nil
	}
	return recs[len(recs)-1]
}

// TestAWorkerCannotEndAnotherPoolsNode: an outside client (the nats CLI)
// holding pool default's worker seed says, on its own pool's subjects of
// the runs' stream (fleet.r.*.*.node.default.*), as its role allows, that
// nodes of tenant acme's runs that run in pool gpu ended. It may not write
// on pool gpu's subject. What it writes on its own releases nothing, and
// hides nothing of what pool gpu's worker said: a node waiting for a
// running one stays unqueued, and the run ends as its real nodes' ends
// say, even when the forged end names a later round (which makes the
// releaser read the run again) and comes after the real one. Written
// before a run is submitted, with the message ids the fleet would give
// that run's definition, its gpu node's end and its summary, it does not
// keep any of them from being stored. Ends of runs that do not exist do
// not stay with the releaser.
func TestAWorkerCannotEndAnotherPoolsNode(t *testing.T) {
	bin := testenv.NatsCLI(t)
	f := startFleet(t)
	c := natsRunner{bin: bin, url: f.srv.url(), home: t.TempDir(), keys: f.keys}
	forger := roleWorker("default")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	// forge writes e on subject as the forger, with the message id msgID
	// when it is not empty.
	forge := func(t *testing.T, subject, msgID string, e *job.NodeEnded) {
		t.Helper()
		body, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		args := []string{"pub", "--jetstream", "--no-templates"}
		if msgID != "" {
			args = append(args, "--header", "Nats-Msg-Id:"+msgID)
		}
		out, err := c.cmd(ctx, forger, append(args, subject, string(body))...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "FLEET_RUNS") {
			t.Fatalf("the forged end on %s was not stored: %v\n%s", subject, err, out)
		}
	}

	t.Run("on another pool's subject", func(t *testing.T) {
		subject := "fleet.r.acme.forged.node.gpu.n"
		body, _ := json.Marshal(&job.NodeEnded{RunID: "forged", NodeID: "n", JobID: "forged:n", Pool: "gpu", Round: 1,
			State: job.StateSucceeded, At: time.Now()})
		out, err := c.cmd(ctx, forger, "--timeout", "2s", "pub", "--jetstream", "--no-templates", subject, string(body)).CombinedOutput()
		if err == nil || !strings.Contains(string(out), `Permissions Violation for Publish to "`+subject+`"`) {
			t.Fatalf("a worker of pool default wrote on pool gpu's subject: %v\n%s", err, out)
		}
		refused(t, f.srv, nil, subject)
		f.srv.log.forget(subject)
	})

	t.Run("of a node of another pool", func(t *testing.T) {
		// g ends in pool gpu; next, after it, runs in pool default until it
		// is cancelled; late, in pool gpu, runs once next has ended.
		const run = "forged-run"
		r := &job.RunRequest{ID: run, Nodes: []job.RunNode{
			{ID: "g", Job: &job.Request{Pool: "gpu", Command: []string{"ok"}}},
			{ID: "next", After: []string{"g"}, Job: &job.Request{Pool: "default", Command: []string{"block"}}},
			{ID: "late", After: []string{"next"}, When: job.WhenAllDone, Job: &job.Request{Pool: "gpu", Command: []string{"ok"}}},
		}}
		if _, err := f.acme.SubmitRun(ctx, r); err != nil {
			t.Fatalf("submit run: %v", err)
		}
		waitNode(t, f, run, "next", job.StateRunning)

		at := time.Now()
		for _, e := range []*job.NodeEnded{
			// a copy of what pool gpu's worker would say
			{RunID: run, NodeID: "late", JobID: run + ":late", Pool: "gpu", Round: 1, State: job.StateSucceeded, At: at},
			// an end that agrees with its subject
			{RunID: run, NodeID: "late", JobID: run + ":late", Pool: "default", Round: 1, State: job.StateSucceeded, At: at},
			// of a later round, so that the releaser reads the run again
			{RunID: run, NodeID: "late", JobID: run + ":late", Pool: "default", Round: 99, State: job.StateFailed, At: at},
			// of a node whose real end is stored: written after it, the
			// last end on a subject of that node
			{RunID: run, NodeID: "g", JobID: run + ":g", Pool: "default", Round: 99, State: job.StateFailed, At: at},
		} {
			forge(t, "fleet.r.acme."+run+".node.default."+e.NodeID, "", e)
		}
		releaserCaughtUp(t, f)
		if st, err := f.acme.Status(ctx, run+":late"); !errors.Is(err, client.ErrNotFound) {
			t.Fatalf("node late's job, whose parent runs, after the forged ends: %+v, %v", st, err)
		}
		v, err := f.acme.Run(ctx, run)
		if err != nil {
			t.Fatal(err)
		}
		if v.Nodes[0].State != job.StateSucceeded || v.Nodes[1].State != job.StateRunning || v.Nodes[2].State != job.NodeWaiting ||
			!slices.Equal(v.Nodes[2].WaitingFor, []string{"next"}) {
			t.Fatalf("the run after the forged ends: %+v", v.Nodes)
		}

		// next is cancelled: late runs (all_done), and the run ends as
		// its nodes did.
		if cr, err := f.acme.Cancel(ctx, run+":next"); err != nil || !cr.Cancelled {
			t.Fatalf("cancel node next's job: %+v, %v", cr, err)
		}
		rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
		defer rcancel()
		end, err := f.acme.RunResult(rctx, run)
		if err != nil {
			t.Fatalf("the run's end: %v", err)
		}
		want := []job.NodeState{
			{ID: "g", JobID: run + ":g", Pool: "gpu", State: job.StateSucceeded},
			{ID: "next", JobID: run + ":next", Pool: "default", State: job.StateCancelled, Code: job.CodeCancelled},
			{ID: "late", JobID: run + ":late", Pool: "gpu", State: job.StateSucceeded},
		}
		if end.State != job.RunFailed || !slices.Equal(end.Nodes, want) {
			t.Fatalf("the run's end: %s %+v, want failed %+v", end.State, end.Nodes, want)
		}
		if res := result(t, f, f.acme, run+":late"); res.Pool != "gpu" || res.Status != job.StatusSucceeded {
			t.Fatalf("node late's result: %+v", res)
		}
	})

	t.Run("before its run, with the message ids of its messages", func(t *testing.T) {
		const run = "preempted"
		e := &job.NodeEnded{RunID: run, NodeID: "g", JobID: run + ":g", Pool: "default", Round: 1, State: job.StateFailed, At: time.Now()}
		for _, id := range []string{"acme/" + run + "/def", "acme/" + run + ":g/ended", "acme/" + run + "/end/1"} {
			forge(t, "fleet.r.acme."+run+".node.default.g", id, e)
		}
		end := runToEnd(t, f, f.acme, &job.RunRequest{ID: run, Nodes: []job.RunNode{
			{ID: "g", Job: &job.Request{Pool: "gpu", Command: []string{"ok"}}},
			{ID: "n", After: []string{"g"}, Job: &job.Request{Pool: "default", Command: []string{"ok"}}},
		}})
		if end.State != job.RunSucceeded || len(end.Nodes) != 2 || end.Nodes[0].State != job.StateSucceeded ||
			end.Nodes[1].State != job.StateSucceeded {
			t.Fatalf("the run's end: %+v", end)
		}
		if v, err := f.acme.Run(ctx, run); err != nil || v.State != job.RunSucceeded {
			t.Fatalf("the run's view: %+v, %v", v, err)
		}
	})

	t.Run("of runs that do not exist", func(t *testing.T) {
		for i := range 5 {
			forge(t, fmt.Sprintf("fleet.r.acme.no-such-run-%d.node.default.n", i), "",
				&job.NodeEnded{RunID: fmt.Sprintf("no-such-run-%d", i), NodeID: "n", JobID: fmt.Sprintf("no-such-run-%d:n", i),
					Pool: "default", Round: 1, State: job.StateSucceeded, At: time.Now()})
		}
		releaserCaughtUp(t, f)
	})
	f.noViolations(t)
}

// waitNode waits until node of tenant acme's run is in state.
func waitNode(t *testing.T, f *fleet, run, node string, state job.State) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		v, err := f.acme.Run(ctx, run)
		if err != nil {
			t.Fatalf("run %s: %v", run, err)
		}
		for _, n := range v.Nodes {
			if n.ID == node && n.State == state {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("node %s of run %s is not %s: %+v", node, run, state, v.Nodes)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// releaserCaughtUp waits until the dispatchers' consumer on the runs'
// stream has handed out every message and has none waiting for its
// acknowledgement: each was handled, or terminated. It is read on the
// server: no role may look at the consumer.
func releaserCaughtUp(t *testing.T, f *fleet) {
	t.Helper()
	var last string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		d, err := f.srv.JszAccount(&server.JSzOptions{Account: "FLEET", Streams: true, Consumer: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range d.Streams {
			for _, ci := range st.Consumer {
				if st.Name == "FLEET_RUNS" && ci.Name == "releaser" {
					if ci.NumPending == 0 && ci.NumAckPending == 0 {
						return
					}
					last = fmt.Sprintf("pending %d, waiting for acknowledgement %d, redelivered %d",
						ci.NumPending, ci.NumAckPending, ci.NumRedelivered)
				}
			}
		}
	}
	t.Fatalf("the releaser did not catch up: %s", last)
}
