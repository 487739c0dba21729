package security_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/internal/artifact"
	"github.com/fleet-dev/fleet/internal/console"
	"github.com/fleet-dev/fleet/internal/dispatcher"
	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/internal/worker"
	"github.com/fleet-dev/fleet/job"
)

// fleet is a dispatcher with its web console, a worker of each of pools
// "default" and "gpu" and the producers of tenants "default" and "acme",
// each connected with its own role's key to a server running the shipped
// configuration, with pool gpu added by add-pool.sh and tenant acme by
// add-tenant.sh.
type fleet struct {
	srv      *natsServer
	keys     keys
	disp     *conn
	work     *conn // worker of pool default
	gpu      *conn // worker of pool gpu
	prod     *conn // producer of tenant default
	acmeConn *conn // producer of tenant acme
	client   *client.Client
	acme     *client.Client
	d        *dispatcher.Dispatcher
	cons     *console.Console // the first dispatcher's
	queueCfg queue.Config
	// logs are what the dispatchers, their consoles and the workers
	// logged, by process.
	logs []processLog
}

type processLog struct {
	name  string
	lines func() []string
}

// logger is a process's logger: to the test's log, and kept, so that
// noViolations reads it.
func (f *fleet) logger(t *testing.T, name string) *slog.Logger {
	kept, _, lines := newCapture()
	f.logs = append(f.logs, processLog{name: name, lines: lines})
	return slog.New(teeHandler{kept.Handler(), fleettest.Logger(t).Handler()})
}

// waitLogged waits until the process named name has logged a line that
// holds text.
func (f *fleet) waitLogged(t *testing.T, name, text string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		for _, l := range f.logs {
			if l.name != name {
				continue
			}
			for _, line := range l.lines() {
				if strings.Contains(line, text) {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not log %q within %s", name, text, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// teeHandler hands each record to every handler that takes its level.
type teeHandler []slog.Handler

func (h teeHandler) Enabled(ctx context.Context, l slog.Level) bool {
	for _, x := range h {
		if x.Enabled(ctx, l) {
			return true
		}
	}
	return false
}

func (h teeHandler) Handle(ctx context.Context, r slog.Record) error {
	for _, x := range h {
		if x.Enabled(ctx, r.Level) {
			if err := x.Handle(ctx, r.Clone()); err != nil {
				return err
			}
		}
	}
	return nil
}

func (h teeHandler) WithAttrs(as []slog.Attr) slog.Handler {
	out := make(teeHandler, len(h))
	for i, x := range h {
		out[i] = x.WithAttrs(as)
	}
	return out
}

func (h teeHandler) WithGroup(name string) slog.Handler {
	out := make(teeHandler, len(h))
	for i, x := range h {
		out[i] = x.WithGroup(name)
	}
	return out
}

func startFleet(t *testing.T, tweak ...func(*server.Options)) *fleet {
	t.Helper()
	k := makeKeys(t, roleDispatcher, roleOperator, roleProducer, roleTenant("acme"), roleWorker("default"), roleWorker("gpu"))
	f := &fleet{srv: startServer(t, configured(t, []string{"gpu"}, []string{"acme"}), tweak...), keys: k,
		queueCfg: queue.Config{AckWait: 5 * time.Second}}
	f.disp = connectAs(t, f.srv.url(), k, roleDispatcher)
	f.d = f.startDispatcher(t, f.disp)
	f.work = connectAs(t, f.srv.url(), k, roleWorker("default"))
	f.startWorker(t, f.work, "default", "w-security")
	f.gpu = connectAs(t, f.srv.url(), k, roleWorker("gpu"))
	f.startWorker(t, f.gpu, "gpu", "w-security-gpu")
	f.prod = connectAs(t, f.srv.url(), k, roleProducer)
	f.acmeConn = connectAs(t, f.srv.url(), k, roleTenant("acme"))
	var err error
	if f.client, err = client.New(f.prod.Conn); err != nil {
		t.Fatal(err)
	}
	if f.acme, err = client.New(f.acmeConn.Conn, client.WithTenant("acme")); err != nil {
		t.Fatal(err)
	}
	return f
}

// startDispatcher starts a dispatcher on a dispatcher's connection, with
// its web console on, as cmd/dispatcher runs it by default.
func (f *fleet) startDispatcher(t *testing.T, c *conn) *dispatcher.Dispatcher {
	t.Helper()
	log := f.logger(t, fmt.Sprintf("dispatcher %d", len(f.logs)))
	d, err := dispatcher.New(c.Conn, dispatcher.Config{Queue: f.queueCfg, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := d.Start(ctx); err != nil {
		t.Fatalf("dispatcher start: %v (violations: %q)", err, f.srv.log.violations())
	}
	cons, err := console.New(console.Config{JS: d.JetStream(), Queue: f.queueCfg, History: d.History, Status: d.Status,
		Cancel: d.Cancel, Retry: d.RetryDeadLetter, Lag: d.Lag, Schedules: d.AllSchedules, PauseSchedule: d.PauseSchedule,
		Pools: d.AllPools, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	if err := cons.Start(ctx); err != nil {
		t.Fatalf("console start: %v (violations: %q)", err, f.srv.log.violations())
	}
	if f.cons == nil {
		f.cons = cons
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = cons.Stop(ctx)
		_ = d.Stop(ctx)
	})
	return d
}

// startWorker starts a worker of pool on a worker's connection.
func (f *fleet) startWorker(t *testing.T, c *conn, pool, id string) *worker.Worker {
	t.Helper()
	js, err := jetstream.New(c.Conn)
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(c.Conn, testExecutor{}, worker.Config{ID: id, Pool: pool, Slots: 4,
		Backend: "process", Queue: f.queueCfg, FetchWait: 500 * time.Millisecond,
		Artifacts: artifact.New(js, artifact.Config{Names: f.queueCfg.Names}),
		Retry:     func(*job.RetryPolicy, int) time.Duration { return 50 * time.Millisecond },
		Logger:    f.logger(t, "worker "+id)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := w.Start(ctx); err != nil {
		t.Fatalf("worker start: %v (violations: %q)", err, f.srv.log.violations())
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = w.Stop(ctx)
	})
	return w
}

// noViolations fails the test if the server refused anything to anyone:
// in the server's log, on any connection, or in what any process logged.
func (f *fleet) noViolations(t *testing.T) {
	t.Helper()
	if v := f.srv.log.violations(); len(v) > 0 {
		t.Errorf("the server refused %d operations:\n%s", len(v), strings.Join(v, "\n"))
	}
	for _, l := range f.logs {
		for _, line := range l.lines() {
			if strings.Contains(line, "Permissions Violation") {
				t.Errorf("%s logged: %s", l.name, line)
			}
		}
	}
	for role, c := range map[string]*conn{"dispatcher": f.disp, "worker of default": f.work, "worker of gpu": f.gpu,
		"producer of default": f.prod, "producer of acme": f.acmeConn} {
		if e := c.errs.all(); len(e) > 0 {
			t.Errorf("%s got asynchronous errors: %q", role, e)
		}
	}
}

// testExecutor runs a request by its first argument: "ok" succeeds with an
// output, "copy" succeeds with its input in.txt as its output out.txt,
// "fail" exits 3, "block" runs until cancelled.
type testExecutor struct{}

func (testExecutor) Run(ctx context.Context, task *executor.Task) (*executor.Outcome, error) {
	start := time.Now()
	switch task.Request.Command[0] {
	case "ok":
		task.Report.Log("stdout", "hello")
		return executor.Succeeded(start, map[string]string{"out.txt": "hi"}), nil
	case "copy":
		return executor.Succeeded(start, map[string]string{"out.txt": task.Request.Inputs["in.txt"]}), nil
	case "fail":
		code := 3
		return &executor.Outcome{Status: job.StatusFailed, ExitCode: &code, StartedAt: start, FinishedAt: time.Now(),
			Failure: job.Failf(job.ClassExecution, job.CodeExitCode, "exit code 3")}, nil
	case "block":
		task.Report.Phase("running", "waiting to be cancelled")
		<-ctx.Done()
		return executor.CancelledOutcome(ctx, start), nil
	case "files":
		return filesJob(ctx, task, start)
	}
	return nil, errors.New("unknown command")
}

func submit(t *testing.T, f *fleet, c *client.Client, r *job.Request) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.Submit(ctx, r)
	if err != nil {
		t.Fatalf("submit as %s: %v (violations: %q)", c.Tenant(), err, f.srv.log.violations())
	}
	if s.Tenant != c.Tenant() {
		t.Fatalf("submitted as %s, queued as %s", c.Tenant(), s.Tenant)
	}
	return s.JobID
}

func result(t *testing.T, f *fleet, c *client.Client, id string) *job.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, err := c.Result(ctx, id)
	if err != nil {
		t.Fatalf("result of %s/%s: %v (violations: %q)", c.Tenant(), id, err, f.srv.log.violations())
	}
	return r
}

// runToEnd submits a run as c's tenant and waits for its round to end.
func runToEnd(t *testing.T, f *fleet, c *client.Client, r *job.RunRequest) *job.RunEnd {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reply, err := c.SubmitRun(ctx, r)
	if err != nil || reply.Duplicate || reply.Tenant != c.Tenant() {
		t.Fatalf("submit run %s as %s: %+v, %v (violations: %q)", r.ID, c.Tenant(), reply, err, f.srv.log.violations())
	}
	end, err := c.RunResult(ctx, r.ID)
	if err != nil {
		t.Fatalf("run %s of %s: %v (violations: %q)", r.ID, c.Tenant(), err, f.srv.log.violations())
	}
	return end
}

func (f *fleet) submit(t *testing.T, r *job.Request) string { return submit(t, f, f.client, r) }

func (f *fleet) result(t *testing.T, id string) *job.Result { return result(t, f, f.client, id) }

// TestEachRoleDoesItsWork runs every path of a job through a fleet whose
// processes each hold only their role's permissions, and checks that the
// server refused nothing.
//
// The server traces what each client does; at the end, every allow line of
// the dispatcher's, the producers' and the workers' permissions must have
// been what allowed something (see allowsAreNeeded).
func TestEachRoleDoesItsWork(t *testing.T) {
	f := startFleet(t, func(o *server.Options) { o.Trace, o.MaxTracedMsgLen = true, 1 })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	op := connectAs(t, f.srv.url(), f.keys, roleOperator)

	t.Run("succeeds, for each tenant in each pool", func(t *testing.T) {
		for _, tc := range []struct {
			c    *client.Client
			pool string
		}{{f.client, "default"}, {f.acme, "gpu"}, {f.acme, "default"}, {f.client, "gpu"}} {
			id := submit(t, f, tc.c, &job.Request{Pool: tc.pool, Command: []string{"ok"}, Outputs: []string{"out.txt"}})
			r := result(t, f, tc.c, id)
			if r.Status != job.StatusSucceeded || r.Outputs["out.txt"] != "hi" || r.Pool != tc.pool {
				t.Fatalf("%s in %s: result %+v", tc.c.Tenant(), tc.pool, r)
			}
			var types []job.EventType
			for e, err := range tc.c.Events(ctx, id) {
				if err != nil {
					t.Fatalf("events: %v", err)
				}
				types = append(types, e.Type)
			}
			if len(types) < 3 || types[0] != job.EventQueued || types[len(types)-1] != job.EventSucceeded {
				t.Fatalf("events: %v", types)
			}
			st, err := tc.c.Status(ctx, id)
			if err != nil || st.Job.State != job.StateSucceeded || st.Result == nil || st.Job.Tenant != tc.c.Tenant() {
				t.Fatalf("status: %+v, %v", st, err)
			}
			h, err := tc.c.History(ctx, id)
			if err != nil || len(h.Records) < 3 {
				t.Fatalf("history: %+v, %v", h, err)
			}
			// What the HTTP API's GET /v1/jobs/{id} returns.
			dst, err := f.d.Status(ctx, tc.c.Tenant(), id)
			if err != nil || dst.Result == nil || dst.Result.Status != job.StatusSucceeded {
				t.Fatalf("dispatcher status: %+v, %v", dst, err)
			}
		}
	})

	t.Run("a tenant reads its feed", func(t *testing.T) {
		id := submit(t, f, f.acme, &job.Request{Pool: "gpu", Command: []string{"ok"}})
		if r := result(t, f, f.acme, id); r.Status != job.StatusSucceeded {
			t.Fatalf("result: %+v", r)
		}
		reply, err := f.acme.FeedConsumer(ctx, "roles", &job.FeedRequest{Pool: "gpu"})
		if err != nil {
			t.Fatalf("acme's feed consumer: %v (violations: %q)", err, f.srv.log.violations())
		}
		// With the producer's own connection, as any JetStream client.
		js, err := jetstream.New(f.acmeConn.Conn)
		if err != nil {
			t.Fatal(err)
		}
		cons, err := js.Consumer(ctx, reply.Stream, reply.Consumer)
		if err != nil {
			t.Fatalf("look up the consumer: %v (violations: %q)", err, f.srv.log.violations())
		}
		for found := false; !found; {
			batch, err := cons.Fetch(10, jetstream.FetchMaxWait(time.Second))
			if err != nil {
				t.Fatal(err)
			}
			for m := range batch.Messages() {
				if !strings.HasPrefix(m.Subject(), "fleet.t.acme.job.gpu.") {
					t.Fatalf("acme's gpu feed delivered %s", m.Subject())
				}
				found = found || m.Subject() == "fleet.t.acme.job.gpu.r."+id
				if err := m.DoubleAck(ctx); err != nil {
					t.Fatalf("ack %s: %v (violations: %q)", m.Subject(), err, f.srv.log.violations())
				}
			}
			if err := batch.Error(); err != nil || ctx.Err() != nil {
				t.Fatalf("pull: %v, %v (violations: %q)", err, ctx.Err(), f.srv.log.violations())
			}
		}
		// The Go client's follower, as fleetctl events: a consumer it
		// asks for, pulled until caught up, each entry acknowledged,
		// then deleted.
		heard := false
		for e, err := range f.acme.Feed(ctx, "roles-go", &job.FeedRequest{Pool: "gpu", Inactive: job.Duration(time.Minute)}, client.UntilCaughtUp()) {
			if err != nil {
				t.Fatalf("client.Feed: %v (violations: %q)", err, f.srv.log.violations())
			}
			heard = heard || e.Record.ID == id
			if err := e.Ack(ctx); err != nil {
				t.Fatalf("client.Feed's ack: %v (violations: %q)", err, f.srv.log.violations())
			}
		}
		if err := f.acme.DeleteFeedConsumer(ctx, "roles-go"); !heard || err != nil {
			t.Fatalf("client.Feed heard %s: %v; deleted: %v (violations: %q)", id, heard, err, f.srv.log.violations())
		}
		// What else the nats CLI does with a feed: look at the stream,
		// read a message of it (by sequence and last of a subject), list
		// the consumers, delete one.
		s, err := js.Stream(ctx, reply.Stream)
		if err != nil {
			t.Fatalf("stream info: %v (violations: %q)", err, f.srv.log.violations())
		}
		last, err := s.GetLastMsgForSubject(ctx, "fleet.t.acme.job.gpu.r."+id)
		if err != nil {
			t.Fatalf("the last message of the job's subject: %v (violations: %q)", err, f.srv.log.violations())
		}
		if m, err := s.GetMsg(ctx, last.Sequence); err != nil || m.Subject != last.Subject {
			t.Fatalf("message %d: %v, %v (violations: %q)", last.Sequence, m, err, f.srv.log.violations())
		}
		var names []string
		for n := range s.ConsumerNames(ctx).Name() {
			names = append(names, n)
		}
		infos := 0
		for range s.ListConsumers(ctx).Info() {
			infos++
		}
		if !slices.Contains(names, "roles") || infos != len(names) {
			t.Fatalf("consumers: %q, %d infos (violations: %q)", names, infos, f.srv.log.violations())
		}
		if err := s.DeleteConsumer(ctx, "roles"); err != nil {
			t.Fatalf("delete the consumer: %v (violations: %q)", err, f.srv.log.violations())
		}
	})

	t.Run("ids are a tenant's own", func(t *testing.T) {
		// The same id, in the same pool, for two tenants: two jobs.
		a := submit(t, f, f.client, &job.Request{ID: "same-id", Command: []string{"ok"}})
		s, err := f.acme.Submit(ctx, &job.Request{ID: "same-id", Command: []string{"ok"}})
		if err != nil || s.Duplicate {
			t.Fatalf("acme's job of default's id: %+v, %v", s, err)
		}
		ra, rb := result(t, f, f.client, a), result(t, f, f.acme, s.JobID)
		if ra.Status != job.StatusSucceeded || rb.Status != job.StatusSucceeded {
			t.Fatalf("default's %s, acme's %s", ra.Status, rb.Status)
		}
	})

	t.Run("fails, is retried, dead-lettered, and retried from its dead letter", func(t *testing.T) {
		dlq := f.srv.streamMsgs(t, "FLEET_DLQ")
		id := submit(t, f, f.acme, &job.Request{Pool: "gpu", Command: []string{"fail"}, Retry: &job.RetryPolicy{MaxAttempts: 2},
			Env: map[string]string{"SECRET": "s3cret"}})
		r := result(t, f, f.acme, id)
		if r.Status != job.StatusFailed || r.Attempts != 2 {
			t.Fatalf("result: %+v", r)
		}
		deadline := time.Now().Add(5 * time.Second)
		for f.srv.streamMsgs(t, "FLEET_DLQ") != dlq+1 {
			if time.Now().After(deadline) {
				t.Fatalf("dead letters: %d, want %d", f.srv.streamMsgs(t, "FLEET_DLQ"), dlq+1)
			}
			time.Sleep(20 * time.Millisecond)
		}
		// An operator reads it (fleetctl dlq --tenant acme), its env
		// values sealed.
		oc, err := client.New(op.Conn, client.WithTenant("acme"))
		if err != nil {
			t.Fatal(err)
		}
		dls, err := oc.DeadLetters(ctx, "gpu")
		if err != nil || len(dls) != 1 || dls[0].JobID != id || dls[0].Request.Env["SECRET"] == "s3cret" {
			t.Fatalf("the operator's dead letters: %+v, %v (violations: %q)", dls, err, f.srv.log.violations())
		}
		// Its tenant retries it: a dispatcher opens the secrets.
		s, err := f.acme.RetryDeadLetter(ctx, id)
		if err != nil {
			t.Fatalf("retry: %v", err)
		}
		if r := result(t, f, f.acme, s.JobID); r.Status != job.StatusFailed {
			t.Fatalf("the retry's result: %+v", r)
		}
	})

	t.Run("is cancelled while running", func(t *testing.T) {
		id := submit(t, f, f.acme, &job.Request{Pool: "gpu", Command: []string{"block"}})
		for e, err := range f.acme.Events(ctx, id) {
			if err != nil {
				t.Fatalf("events: %v", err)
			}
			if e.Type == job.EventStarted {
				break
			}
		}
		c, err := f.acme.Cancel(ctx, id)
		if err != nil || !c.Cancelled {
			t.Fatalf("cancel: %+v, %v", c, err)
		}
		if r := result(t, f, f.acme, id); r.Status != job.StatusCancelled {
			t.Fatalf("result: %+v", r)
		}
	})

	t.Run("is cancelled while queued", func(t *testing.T) {
		// No worker serves this pool: the dispatcher finishes the job.
		id := f.submit(t, &job.Request{Pool: "idle", Command: []string{"ok"}})
		c, err := f.client.Cancel(ctx, id)
		if err != nil || !c.Cancelled {
			t.Fatalf("cancel: %+v, %v", c, err)
		}
		if r := f.result(t, id); r.Status != job.StatusCancelled {
			t.Fatalf("result: %+v", r)
		}
	})

	t.Run("is submitted twice", func(t *testing.T) {
		r := &job.Request{ID: "twice", Command: []string{"ok"}}
		f.submit(t, r)
		s, err := f.client.Submit(ctx, r)
		if err != nil || !s.Duplicate {
			t.Fatalf("second submit: %+v, %v", s, err)
		}
	})

	t.Run("is submitted without waiting, through the intake stream", func(t *testing.T) {
		js, err := jetstream.New(f.acmeConn.Conn)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.Publish(ctx, "fleet.t.acme.intake", []byte(`{"id":"kept","pool":"gpu","command":["ok"]}`)); err != nil {
			t.Fatalf("intake: %v (violations: %q)", err, f.srv.log.violations())
		}
		if r := result(t, f, f.acme, "kept"); r.Status != job.StatusSucceeded {
			t.Fatalf("result: %+v", r)
		}
	})

	t.Run("is submitted and cancelled through the HTTP API", func(t *testing.T) {
		api := httptest.NewServer(dispatcher.NewAPI(f.d))
		defer api.Close()
		hc := &http.Client{Timeout: 10 * time.Second}
		resp, err := hc.Post(api.URL+"/v1/jobs", "application/json", strings.NewReader(`{"pool":"idle","command":["ok"]}`))
		if err != nil {
			t.Fatal(err)
		}
		var reply job.SubmitReply
		err = json.NewDecoder(resp.Body).Decode(&reply)
		resp.Body.Close()
		if err != nil || reply.JobID == "" {
			t.Fatalf("POST /v1/jobs: %s %+v, %v", resp.Status, reply, err)
		}
		resp, err = hc.Post(api.URL+"/v1/jobs/"+reply.JobID+"/cancel", "application/json", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("cancel: %s", resp.Status)
		}
		if r := f.result(t, reply.JobID); r.Status != job.StatusCancelled {
			t.Fatalf("result: %+v", r)
		}
	})

	t.Run("is rejected", func(t *testing.T) {
		_, err := f.client.SubmitJSON(ctx, []byte(`{"id":"bad-request","timeout":"soon"}`))
		var rej *client.RejectedError
		if !errors.As(err, &rej) || !strings.Contains(rej.Reason, "timeout") {
			t.Fatalf("submit: %v", err)
		}
		st, err := f.client.Status(ctx, "bad-request")
		if err != nil || st.Job.State != job.StateRejected {
			t.Fatalf("status: %+v, %v", st, err)
		}
	})

	t.Run("moves files through the object store", func(t *testing.T) {
		// A tenant uploads an input to its bucket; the dispatcher checks
		// it at admission; the pool's worker fetches it, stores an output
		// and archives the log in its pool's bucket; the tenant reads
		// both by their chunks, and over HTTP through the dispatcher.
		data := bytes.Repeat([]byte("fleet\x00\xff"), 40_000)
		ref, err := f.acme.Upload(ctx, "security/in.bin", bytes.NewReader(data))
		if err != nil {
			t.Fatalf("upload: %v (violations: %q)", err, f.srv.log.violations())
		}
		if ref.Bucket != "fleet-uploads-acme" {
			t.Fatalf("uploaded to %s", ref.Bucket)
		}
		id := submit(t, f, f.acme, &job.Request{Pool: "gpu", Command: []string{"files"}, Outputs: []string{"out.bin"},
			InputRefs: map[string]job.InputRef{"in.bin": *ref}})
		r := result(t, f, f.acme, id)
		art := r.Artifacts["out.bin"]
		if r.Status != job.StatusSucceeded || art.SHA256 != ref.SHA256 || art.Bucket != "fleet-artifacts-gpu" ||
			art.Key != artifact.OutputKey("acme", id, 1, "out.bin") {
			t.Fatalf("result: %+v", r)
		}
		o, err := f.acme.Output(ctx, id, "out.bin")
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(o)
		o.Close()
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("output: %d bytes, %v", len(got), err)
		}
		for _, follow := range []bool{false, true} {
			lr, err := f.acme.Logs(ctx, id, client.LogOptions{Follow: follow})
			if err != nil {
				t.Fatal(err)
			}
			lines, err := io.ReadAll(lr)
			lr.Close()
			if err != nil || !strings.Contains(string(lines), " stdout fetched 280000 bytes\n") {
				t.Fatalf("logs (follow %v): %q, %v", follow, lines, err)
			}
		}
		api := httptest.NewServer(dispatcher.NewAPI(f.d))
		defer api.Close()
		for _, path := range []string{"/v1/jobs/" + id + "/outputs/out.bin", "/v1/jobs/" + id + "/logs"} {
			req, _ := http.NewRequest(http.MethodGet, api.URL+path, nil)
			req.Header.Set(dispatcher.TenantHeader, "acme")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || len(body) == 0 {
				t.Fatalf("GET %s: %s %.200s", path, resp.Status, body)
			}
		}
		// An output of one job is the input of the next, in another pool.
		next := submit(t, f, f.acme, &job.Request{Command: []string{"files"}, Outputs: []string{"out.bin"},
			InputRefs: map[string]job.InputRef{"in.bin": {Bucket: art.Bucket, Key: art.Key, SHA256: art.SHA256}}})
		if r := result(t, f, f.acme, next); r.Status != job.StatusSucceeded || r.Artifacts["out.bin"].SHA256 != ref.SHA256 {
			t.Fatalf("a job reading another's output: %+v", r)
		}
		// An upload that fails is purged.
		if _, err := f.acme.Upload(ctx, "security/broken.bin", io.MultiReader(bytes.NewReader(data), iotest.ErrReader(errors.New("disk gone")))); err == nil {
			t.Fatal("an upload from a failing reader succeeded")
		}
		missing := *ref
		missing.Key = "security/never.bin"
		_, err = f.acme.Submit(ctx, &job.Request{Command: []string{"files"}, InputRefs: map[string]job.InputRef{"in.bin": missing}})
		var rej *client.RejectedError
		if !errors.As(err, &rej) || !strings.Contains(rej.Reason, "no object security/never.bin") {
			t.Fatalf("a missing input: %v", err)
		}
		// Another tenant's objects are refused at admission.
		_, err = f.client.Submit(ctx, &job.Request{Command: []string{"files"}, InputRefs: map[string]job.InputRef{"in.bin": *ref}})
		if !errors.As(err, &rej) || !strings.Contains(rej.Reason, "tenant acme's") {
			t.Fatalf("another tenant's upload as an input: %v", err)
		}
		_, err = f.client.Submit(ctx, &job.Request{Command: []string{"files"},
			InputRefs: map[string]job.InputRef{"in.bin": {Bucket: art.Bucket, Key: art.Key, SHA256: art.SHA256}}})
		if !errors.As(err, &rej) || !strings.Contains(rej.Reason, "not an output of tenant default") {
			t.Fatalf("another tenant's output as an input: %v", err)
		}
	})

	t.Run("is read by the documented subjects", func(t *testing.T) {
		// What an outside client does: find the pool's stream by subject,
		// read the job's result and its last version by direct get.
		id := submit(t, f, f.acme, &job.Request{Pool: "gpu", Command: []string{"ok"}})
		result(t, f, f.acme, id)
		js, err := jetstream.New(f.acmeConn.Conn)
		if err != nil {
			t.Fatal(err)
		}
		stream, err := js.StreamNameBySubject(ctx, "fleet.p.gpu.r.acme."+id)
		if err != nil || stream != "FLEET_POOL_gpu" {
			t.Fatalf("stream by subject: %q, %v", stream, err)
		}
		for _, subject := range []string{"fleet.p.gpu.r.acme." + id, "fleet.p.gpu.*.acme." + id} {
			m, err := f.acmeConn.RequestWithContext(ctx, "$JS.API.DIRECT.GET."+stream+"."+subject, nil)
			if err != nil {
				t.Fatal(err)
			}
			var rec job.Record
			if err := json.Unmarshal(m.Data, &rec); err != nil || rec.Result == nil || rec.Result.Status != job.StatusSucceeded {
				t.Fatalf("direct get %s: %s %q, %v", subject, m.Header.Get("Status"), m.Data, err)
			}
		}
	})

	t.Run("waits while its pool is paused", func(t *testing.T) {
		// An operator pauses the pool (a dispatcher writes its entry), a
		// producer reads it, the worker reads it and starts nothing.
		oc, err := client.New(op.Conn)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := oc.PausePool(ctx, "default", "security test"); err != nil {
			t.Fatalf("pause: %v (violations: %q)", err, f.srv.log.violations())
		}
		if s, err := f.client.Pool(ctx, "default"); err != nil || !s.Paused {
			t.Fatalf("pool show: %+v, %v (violations: %q)", s, err, f.srv.log.violations())
		}
		f.waitLogged(t, "worker w-security", "pool paused", 10*time.Second) // it reads it every second
		id := f.submit(t, &job.Request{Command: []string{"ok"}})
		time.Sleep(2 * time.Second)
		if st, err := f.client.Status(ctx, id); err != nil || st.Job.State != job.StateQueued {
			t.Fatalf("a job of the paused pool: %+v, %v", st, err)
		}
		if _, err := oc.ResumePool(ctx, "default"); err != nil {
			t.Fatal(err)
		}
		if r := f.result(t, id); r.Status != job.StatusSucceeded {
			t.Fatalf("result after the resume: %+v", r)
		}
	})

	t.Run("is made by a schedule of its tenant", func(t *testing.T) {
		// A tenant's producer makes and lists its own schedule through the
		// dispatcher, which holds the lease in the schedules bucket and
		// fires it as that tenant; an operator sees and deletes it.
		every := job.Duration(time.Second)
		info, err := f.acme.CreateSchedule(ctx, &job.Schedule{Name: "nightly", Every: &every,
			Template: &job.Request{Pool: "gpu", Command: []string{"ok"}}})
		if err != nil {
			t.Fatalf("create: %v (violations: %q)", err, f.srv.log.violations())
		}
		if info.Schedule.Tenant != "acme" || info.Status != job.ScheduleActive {
			t.Fatalf("created: %+v", info)
		}
		list, err := f.acme.Schedules(ctx)
		if err != nil || len(list.Schedules) != 1 || list.Schedules[0].Schedule.Name != "nightly" {
			t.Fatalf("list: %+v, %v (violations: %q)", list, err, f.srv.log.violations())
		}
		if own, err := f.client.Schedules(ctx); err != nil || len(own.Schedules) != 0 {
			t.Fatalf("tenant default's list: %+v, %v", own, err)
		}
		var fired *job.ScheduleInfo
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			fired, err = f.acme.Schedule(ctx, "nightly")
			if err != nil {
				t.Fatalf("show: %v", err)
			}
			if fired.State.Previous != nil && fired.State.Previous.JobID != "" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the schedule did not fire: %+v (violations: %q)", fired.State, f.srv.log.violations())
			}
		}
		if r := result(t, f, f.acme, fired.State.Previous.JobID); r.Status != job.StatusSucceeded || r.Pool != "gpu" {
			t.Fatalf("the firing's result: %+v", r)
		}
		oc, err := client.New(op.Conn, client.WithTenant("acme"))
		if err != nil {
			t.Fatal(err)
		}
		if l, err := oc.Schedules(ctx); err != nil || len(l.Schedules) != 1 {
			t.Fatalf("the operator's list of acme's schedules: %+v, %v (violations: %q)", l, err, f.srv.log.violations())
		}
		if _, err := oc.DeleteSchedule(ctx, "nightly"); err != nil {
			t.Fatalf("the operator deletes acme's schedule: %v", err)
		}
		if l, err := f.acme.Schedules(ctx); err != nil || len(l.Schedules) != 0 {
			t.Fatalf("list after the delete: %+v, %v", l, err)
		}
	})

	t.Run("is a node of a run", func(t *testing.T) {
		// Tenant acme submits a run across both pools, the second node
		// reading the first's output: each pool's worker says its node's
		// end on its pool's subject of the runs' stream, and a dispatcher
		// releases the node after it. The tenant follows the run, reads
		// and lists it; tenant default has no such run; an operator reads
		// it as acme's.
		r := &job.RunRequest{ID: "security-run", Nodes: []job.RunNode{
			{ID: "a", Job: &job.Request{Pool: "gpu", Command: []string{"ok"}, Outputs: []string{"out.txt"}}},
			{ID: "b", After: []string{"a"}, InputsFrom: map[string]job.OutputOf{"in.txt": {Node: "a", Output: "out.txt"}},
				Job: &job.Request{Pool: "default", Command: []string{"copy"}, Outputs: []string{"out.txt"}}},
		}}
		end := runToEnd(t, f, f.acme, r)
		if end.State != job.RunSucceeded || len(end.Nodes) != 2 ||
			end.Nodes[0] != (job.NodeState{ID: "a", JobID: "security-run:a", Pool: "gpu", State: job.StateSucceeded}) ||
			end.Nodes[1] != (job.NodeState{ID: "b", JobID: "security-run:b", Pool: "default", State: job.StateSucceeded}) {
			t.Fatalf("the run's end: %+v", end)
		}
		if res := result(t, f, f.acme, "security-run:b"); res.Outputs["out.txt"] != "hi" {
			t.Fatalf("node b's result, its input a's output: %+v", res)
		}
		if v, err := f.acme.Run(ctx, r.ID); err != nil || v.State != job.RunSucceeded || v.Tenant != "acme" {
			t.Fatalf("the run's view: %+v, %v (violations: %q)", v, err, f.srv.log.violations())
		}
		if l, err := f.acme.Runs(ctx); err != nil || !slices.Contains(l, r.ID) {
			t.Fatalf("acme's runs: %q, %v", l, err)
		}
		if v, err := f.client.Run(ctx, r.ID); !errors.Is(err, client.ErrNotFound) {
			t.Fatalf("tenant default read acme's run: %+v, %v", v, err)
		}
		if l, err := f.client.Runs(ctx); err != nil || slices.Contains(l, r.ID) {
			t.Fatalf("tenant default's runs: %q, %v", l, err)
		}
		oc, err := client.New(op.Conn, client.WithTenant("acme"))
		if err != nil {
			t.Fatal(err)
		}
		if v, err := oc.Run(ctx, r.ID); err != nil || v.State != job.RunSucceeded {
			t.Fatalf("the operator's view of acme's run: %+v, %v (violations: %q)", v, err, f.srv.log.violations())
		}
		if l, err := oc.Runs(ctx); err != nil || !slices.Contains(l, r.ID) {
			t.Fatalf("the operator's list of acme's runs: %q, %v", l, err)
		}
	})

	t.Run("is a node of a run cancelled, and of one retried", func(t *testing.T) {
		// A run cancelled while its first node runs: a worker stops it, a
		// dispatcher ends the node after it, which never ran, and says so.
		r := &job.RunRequest{ID: "security-cancelled", Nodes: []job.RunNode{
			{ID: "hold", Job: &job.Request{Pool: "gpu", Command: []string{"block"}}},
			{ID: "after", After: []string{"hold"}, Job: &job.Request{Pool: "default", Command: []string{"ok"}}},
		}}
		if _, err := f.acme.SubmitRun(ctx, r); err != nil {
			t.Fatalf("submit run: %v (violations: %q)", err, f.srv.log.violations())
		}
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			v, err := f.acme.Run(ctx, r.ID)
			if err != nil {
				t.Fatal(err)
			}
			if v.Nodes[0].State == job.StateRunning {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node hold did not start: %+v (violations: %q)", v, f.srv.log.violations())
			}
		}
		if c, err := f.acme.CancelRun(ctx, r.ID); err != nil || !c.Cancelled {
			t.Fatalf("cancel run: %+v, %v", c, err)
		}
		end, err := f.acme.RunResult(ctx, r.ID)
		if err != nil || end.State != job.RunCancelled || end.Nodes[0].State != job.StateCancelled ||
			end.Nodes[1].State != job.StateCancelled {
			t.Fatalf("the cancelled run's end: %+v, %v", end, err)
		}

		// A run that fails, retried: its second round runs the node again
		// as a new job.
		r = &job.RunRequest{ID: "security-retried", Nodes: []job.RunNode{
			{ID: "bad", Job: &job.Request{Pool: "default", Command: []string{"fail"}, Retry: &job.RetryPolicy{MaxAttempts: 1}}},
		}}
		if end := runToEnd(t, f, f.acme, r); end.State != job.RunFailed {
			t.Fatalf("the failed run's end: %+v", end)
		}
		if rt, err := f.acme.RetryRun(ctx, r.ID); err != nil || rt.Round != 2 || !slices.Equal(rt.Retried, []string{"bad"}) {
			t.Fatalf("retry run: %+v, %v", rt, err)
		}
		end, err = f.acme.RunResult(ctx, r.ID)
		if err != nil || end.Round != 2 || end.State != job.RunFailed || end.Nodes[0].JobID != "security-retried:bad:2" {
			t.Fatalf("the retried run's end: %+v, %v", end, err)
		}
	})

	t.Run("is followed in the web console", func(t *testing.T) {
		// The console's index hears every job's versions as they are
		// stored; a job's page follows the job's versions and its
		// heartbeat and log events.
		id := submit(t, f, f.acme, &job.Request{Pool: "gpu", Command: []string{"ok"}})
		result(t, f, f.acme, id)
		k := queue.JobKey{Tenant: "acme", Pool: "gpu", ID: id}
		for deadline := time.Now().Add(5 * time.Second); !f.cons.Index().Has(k); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the console's index has no job %s (violations: %q)", id, f.srv.log.violations())
			}
		}
		ui := httptest.NewServer(f.cons)
		defer ui.Close()
		sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
		defer scancel()
		req, _ := http.NewRequestWithContext(sctx, http.MethodGet, ui.URL+"/ui/stream?page=job&tenant=acme&pool=gpu&id="+id, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			body, _ := io.ReadAll(resp.Body)
			t.Fatalf("the job's page's stream: %s %s", resp.Status, body)
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		page := false
		for !page && sc.Scan() {
			page = sc.Text() == "event: page"
		}
		if !page {
			t.Fatalf("the job's page's stream sent no page: %v", sc.Err())
		}
	})

	t.Run("restarted processes find what exists", func(t *testing.T) {
		// An operator changed the retention: a second dispatcher updates
		// the streams the first one created (a dispatcher leaves what is
		// as it asks alone); a second worker updates its pool's consumer.
		f.queueCfg.Retention = 2 * queue.DefaultRetention
		f.startDispatcher(t, connectAs(t, f.srv.url(), f.keys, roleDispatcher))
		w := f.startWorker(t, connectAs(t, f.srv.url(), f.keys, roleWorker("gpu")), "gpu", "w-security-gpu-2")
		id := submit(t, f, f.acme, &job.Request{Pool: "gpu", Command: []string{"ok"}})
		if r := result(t, f, f.acme, id); r.Status != job.StatusSucceeded {
			t.Fatalf("result: %+v", r)
		}
		// A worker that stops deletes its watch of the pool's state (the
		// workers' watches may also be made again when the bucket
		// changes, as above, but not by the time this test looks).
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := w.Stop(sctx); err != nil {
			t.Fatalf("stop the second worker: %v (violations: %q)", err, f.srv.log.violations())
		}
	})

	f.noViolations(t)
	if e := op.errs.all(); len(e) > 0 {
		t.Errorf("operator got asynchronous errors: %q", e)
	}
	allowsAreNeeded(t, f)
}

// filesJob fetches the task's inputs by reference, logs, and stores its
// input back as output out.bin, as an executor does through the worker's
// object store.
func filesJob(ctx context.Context, task *executor.Task, start time.Time) (*executor.Outcome, error) {
	dir, err := os.MkdirTemp("", "fleet-security-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if err := task.Artifacts.FetchInputs(ctx, dir); err != nil {
		return nil, err
	}
	f, err := os.Open(filepath.Join(dir, "in.bin"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	task.Report.Log("stdout", fmt.Sprintf("fetched %d bytes", fi.Size()))
	// An output whose file fails half way is not stored, and its chunks
	// are purged.
	broken := io.MultiReader(io.LimitReader(f, fi.Size()/2), iotest.ErrReader(errors.New("disk gone")))
	if _, err := task.Artifacts.StoreOutput(ctx, "broken.bin", broken, fi.Size()); err == nil {
		return nil, errors.New("an output read from a failing file was stored")
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	a, err := task.Artifacts.StoreOutput(ctx, "out.bin", f, fi.Size())
	if err != nil {
		return nil, err
	}
	out := executor.Succeeded(start, nil)
	out.Artifacts = map[string]job.Artifact{"out.bin": *a}
	return out, nil
}
