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
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"
	"time"

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

// fleet is a dispatcher, a worker of pool "default" and a producer's
// client, each connected with its own role's key to a server running the
// shipped configuration.
type fleet struct {
	srv      *natsServer
	keys     keys
	disp     *conn
	work     *conn
	prod     *conn
	client   *client.Client
	d        *dispatcher.Dispatcher
	queueCfg queue.Config
}

func startFleet(t *testing.T) *fleet {
	t.Helper()
	k := makeKeys(t, roleDispatcher, roleProducer, roleWorker("default"))
	f := &fleet{srv: startServer(t, shipped(t, "fleet.conf")), keys: k,
		queueCfg: queue.Config{AckWait: 5 * time.Second}}
	f.disp = connectAs(t, f.srv.url(), k, roleDispatcher)
	f.d = f.startDispatcher(t, f.disp)
	f.work = connectAs(t, f.srv.url(), k, roleWorker("default"))
	f.startWorker(t, f.work, "w-security")
	f.prod = connectAs(t, f.srv.url(), k, roleProducer)
	var err error
	if f.client, err = client.New(f.prod.Conn); err != nil {
		t.Fatal(err)
	}
	return f
}

// startDispatcher starts a dispatcher on a dispatcher's connection.
func (f *fleet) startDispatcher(t *testing.T, c *conn) *dispatcher.Dispatcher {
	t.Helper()
	d, err := dispatcher.New(c.Conn, dispatcher.Config{Queue: f.queueCfg, Logger: fleettest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := d.Start(ctx); err != nil {
		t.Fatalf("dispatcher start: %v (violations: %q)", err, f.srv.log.violations())
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = d.Stop(ctx)
	})
	return d
}

// startWorker starts a worker of pool "default" on a worker's connection.
func (f *fleet) startWorker(t *testing.T, c *conn, id string) *worker.Worker {
	t.Helper()
	js, err := jetstream.New(c.Conn)
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(c.Conn, testExecutor{}, worker.Config{ID: id, Pool: "default", Slots: 4,
		Backend: "process", Queue: f.queueCfg, FetchWait: 500 * time.Millisecond,
		Artifacts: artifact.New(js, artifact.Config{Names: f.queueCfg.Names}),
		Retry:     func(*job.RetryPolicy, int) time.Duration { return 50 * time.Millisecond },
		Logger:    fleettest.Logger(t)})
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

// noViolations fails the test if the server refused anything to anyone.
func (f *fleet) noViolations(t *testing.T) {
	t.Helper()
	if v := f.srv.log.violations(); len(v) > 0 {
		t.Errorf("the server refused %d operations:\n%s", len(v), strings.Join(v, "\n"))
	}
	for role, c := range map[string]*conn{"dispatcher": f.disp, "worker": f.work, "producer": f.prod} {
		if e := c.errs.all(); len(e) > 0 {
			t.Errorf("%s got asynchronous errors: %q", role, e)
		}
	}
}

// testExecutor runs a request by its first argument: "ok" succeeds with an
// output, "fail" exits 3, "block" runs until cancelled.
type testExecutor struct{}

func (testExecutor) Run(ctx context.Context, task *executor.Task) (*executor.Outcome, error) {
	start := time.Now()
	switch task.Request.Command[0] {
	case "ok":
		task.Report.Log("stdout", "hello")
		return executor.Succeeded(start, map[string]string{"out.txt": "hi"}), nil
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

func (f *fleet) submit(t *testing.T, r *job.Request) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := f.client.Submit(ctx, r)
	if err != nil {
		t.Fatalf("submit: %v (violations: %q)", err, f.srv.log.violations())
	}
	return s.JobID
}

func (f *fleet) result(t *testing.T, id string) *job.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, err := f.client.Result(ctx, id)
	if err != nil {
		t.Fatalf("result of %s: %v (violations: %q)", id, err, f.srv.log.violations())
	}
	return r
}

// TestEachRoleDoesItsWork runs every path of a job through a fleet whose
// processes each hold only their role's permissions, and checks that the
// server refused nothing.
func TestEachRoleDoesItsWork(t *testing.T) {
	f := startFleet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	t.Run("succeeds", func(t *testing.T) {
		id := f.submit(t, &job.Request{Command: []string{"ok"}, Outputs: []string{"out.txt"}})
		r := f.result(t, id)
		if r.Status != job.StatusSucceeded || r.Outputs["out.txt"] != "hi" {
			t.Fatalf("result: %+v", r)
		}
		var types []job.EventType
		for e, err := range f.client.Events(ctx, id) {
			if err != nil {
				t.Fatalf("events: %v", err)
			}
			types = append(types, e.Type)
		}
		if len(types) < 3 || types[0] != job.EventQueued || types[len(types)-1] != job.EventSucceeded {
			t.Fatalf("events: %v", types)
		}
		st, err := f.client.Status(ctx, id)
		if err != nil || st.Job.State != job.StateSucceeded || st.Result == nil {
			t.Fatalf("status: %+v, %v", st, err)
		}
		// What the HTTP API's GET /v1/jobs/{id} returns.
		dst, err := f.d.Status(ctx, "default", id)
		if err != nil || dst.Result == nil || dst.Result.Status != job.StatusSucceeded {
			t.Fatalf("dispatcher status: %+v, %v", dst, err)
		}
	})

	t.Run("fails, is retried, and is dead-lettered", func(t *testing.T) {
		dlq := f.srv.streamMsgs(t, "FLEET_DLQ")
		id := f.submit(t, &job.Request{Command: []string{"fail"}, Retry: &job.RetryPolicy{MaxAttempts: 2}})
		r := f.result(t, id)
		if r.Status != job.StatusFailed || r.Attempts != 2 {
			t.Fatalf("result: %+v", r)
		}
		// The dead letter follows the result.
		deadline := time.Now().Add(5 * time.Second)
		for f.srv.streamMsgs(t, "FLEET_DLQ") != dlq+1 {
			if time.Now().After(deadline) {
				t.Fatalf("dead letters: %d, want %d", f.srv.streamMsgs(t, "FLEET_DLQ"), dlq+1)
			}
			time.Sleep(20 * time.Millisecond)
		}
	})

	t.Run("is cancelled while running", func(t *testing.T) {
		id := f.submit(t, &job.Request{Command: []string{"block"}})
		for e, err := range f.client.Events(ctx, id) {
			if err != nil {
				t.Fatalf("events: %v", err)
			}
			if e.Type == job.EventStarted {
				break
			}
		}
		// The worker hears the request too and may stop the job before the
		// dispatcher looks: then the dispatcher finds it cancelled already.
		c, err := f.client.Cancel(ctx, id)
		if err != nil || (!c.Cancelled && c.State != job.StateCancelled) {
			t.Fatalf("cancel: %+v, %v", c, err)
		}
		if r := f.result(t, id); r.Status != job.StatusCancelled {
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

	t.Run("is awaited before it ends", func(t *testing.T) {
		id := f.submit(t, &job.Request{Pool: "idle", Command: []string{"ok"}})
		// fleetctl bench follows events and results as core messages.
		live, err := f.prod.SubscribeSync(queue.Names{}.Results(id))
		if err != nil {
			t.Fatal(err)
		}
		liveEvents, err := f.prod.SubscribeSync(queue.Names{}.Events(id))
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan *job.Result, 1)
		go func() {
			r, err := f.client.Result(ctx, id) // no result yet: an ordered consumer waits
			if err != nil {
				t.Errorf("result: %v", err)
			}
			got <- r
		}()
		time.Sleep(300 * time.Millisecond)
		if _, err := f.client.Cancel(ctx, id); err != nil {
			t.Fatal(err)
		}
		if r := <-got; r == nil || r.Status != job.StatusCancelled {
			t.Fatalf("result: %+v", r)
		}
		if _, err := live.NextMsg(5 * time.Second); err != nil {
			t.Fatalf("live result: %v", err)
		}
		if _, err := liveEvents.NextMsg(5 * time.Second); err != nil {
			t.Fatalf("live event: %v", err)
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

	t.Run("is submitted and cancelled through the HTTP API", func(t *testing.T) {
		// POST /v1/jobs sends the request through fleet.submit, as any
		// producer's would go; the dispatcher answers its own request.
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

	t.Run("is seen in the web console", func(t *testing.T) {
		// The console runs in the dispatcher, on its connection: the
		// index, the dead letters, a job's events and its request.
		c, err := console.New(console.Config{JS: f.d.JetStream(), Queue: f.queueCfg, Cancel: f.d.Cancel, Retry: f.d.RetryDeadLetter,
			Logger: fleettest.Logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(ctx); err != nil {
			t.Fatalf("console start: %v (violations: %q)", err, f.srv.log.violations())
		}
		defer func() { _ = c.Stop(context.Background()) }()
		id := f.submit(t, &job.Request{Command: []string{"block"}, Env: map[string]string{"SEEN_ENV": "hidden-value"}})
		deadline := time.Now().Add(10 * time.Second)
		for {
			if row, _, ok := c.Index().Job(id); ok && row.State == job.StateRunning {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the console's index does not show %s running", id)
			}
			time.Sleep(20 * time.Millisecond)
		}
		srv := httptest.NewServer(c)
		defer srv.Close()
		page := func(path string) string {
			resp, err := http.Get(srv.URL + path)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("GET %s: %d %s", path, resp.StatusCode, body)
			}
			return string(body)
		}
		if p := page("/ui/jobs/" + id); !strings.Contains(p, "SEEN_ENV") || strings.Contains(p, "hidden-value") || !strings.Contains(p, ">started<") {
			t.Errorf("the job page lacks its request's env names or its events, or shows an env value")
		}
		deadline = time.Now().Add(5 * time.Second)
		for !strings.Contains(page("/ui/dlq"), `id="dl-`) {
			if time.Now().After(deadline) {
				t.Fatal("the console shows no dead letter")
			}
			time.Sleep(50 * time.Millisecond)
		}
		if _, err := f.client.Cancel(ctx, id); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("moves files through the object store", func(t *testing.T) {
		// The producer uploads an input; the dispatcher checks it at
		// admission; the worker fetches it, stores an output and archives
		// the log; the producer reads both, directly and over HTTP
		// through the dispatcher.
		data := bytes.Repeat([]byte("fleet\x00\xff"), 40_000)
		ref, err := f.client.Upload(ctx, "security/in.bin", bytes.NewReader(data))
		if err != nil {
			t.Fatalf("upload: %v (violations: %q)", err, f.srv.log.violations())
		}
		id := f.submit(t, &job.Request{Command: []string{"files"}, Outputs: []string{"out.bin"},
			InputRefs: map[string]job.InputRef{"in.bin": *ref}})
		r := f.result(t, id)
		if r.Status != job.StatusSucceeded || r.Artifacts["out.bin"].SHA256 != ref.SHA256 {
			t.Fatalf("result: %+v", r)
		}
		o, err := f.client.Output(ctx, id, "out.bin")
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(o)
		o.Close()
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("output: %d bytes, %v", len(got), err)
		}
		lr, err := f.client.Logs(ctx, id, client.LogOptions{Follow: true})
		if err != nil {
			t.Fatal(err)
		}
		lines, err := io.ReadAll(lr)
		lr.Close()
		if err != nil || !strings.Contains(string(lines), " stdout fetched 280000 bytes\n") {
			t.Fatalf("logs: %q, %v", lines, err)
		}
		api := httptest.NewServer(dispatcher.NewAPI(f.d))
		defer api.Close()
		for _, path := range []string{"/v1/jobs/" + id + "/outputs/out.bin", "/v1/jobs/" + id + "/logs"} {
			resp, err := http.Get(api.URL + path)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || len(body) == 0 {
				t.Fatalf("GET %s: %s %.200s", path, resp.Status, body)
			}
		}
		// An output of one job is the input of the next.
		art := r.Artifacts["out.bin"]
		next := f.submit(t, &job.Request{Command: []string{"files"}, Outputs: []string{"out.bin"},
			InputRefs: map[string]job.InputRef{"in.bin": {Bucket: art.Bucket, Key: art.Key, SHA256: art.SHA256}}})
		if r := f.result(t, next); r.Status != job.StatusSucceeded || r.Artifacts["out.bin"].SHA256 != ref.SHA256 {
			t.Fatalf("a job reading another's output: %+v", r)
		}
		// An upload that fails is purged.
		if _, err := f.client.Upload(ctx, "security/broken.bin", io.MultiReader(bytes.NewReader(data), iotest.ErrReader(errors.New("disk gone")))); err == nil {
			t.Fatal("an upload from a failing reader succeeded")
		}
		missing := *ref
		missing.Key = "security/never.bin"
		_, err = f.client.Submit(ctx, &job.Request{Command: []string{"files"}, InputRefs: map[string]job.InputRef{"in.bin": missing}})
		var rej *client.RejectedError
		if !errors.As(err, &rej) || !strings.Contains(rej.Reason, "no object security/never.bin") {
			t.Fatalf("a missing input: %v", err)
		}
	})

	t.Run("waits while its pool is paused", func(t *testing.T) {
		// The dispatcher writes the pool's entry (an operator asked it to),
		// a producer reads it, the worker reads it and starts nothing.
		if _, err := f.d.SetPaused(ctx, "default", true, &job.PoolChange{Reason: "security test"}); err != nil {
			t.Fatalf("pause: %v (violations: %q)", err, f.srv.log.violations())
		}
		if s, err := f.client.Pool(ctx, "default"); err != nil || !s.Paused {
			t.Fatalf("pool show: %+v, %v (violations: %q)", s, err, f.srv.log.violations())
		}
		time.Sleep(1500 * time.Millisecond) // the worker reads it every second
		id := f.submit(t, &job.Request{Command: []string{"ok"}})
		time.Sleep(2 * time.Second)
		if st, err := f.client.Status(ctx, id); err != nil || st.Job.State != job.StateQueued {
			t.Fatalf("a job of the paused pool: %+v, %v", st, err)
		}
		if _, err := f.d.SetPaused(ctx, "default", false, &job.PoolChange{}); err != nil {
			t.Fatal(err)
		}
		if r := f.result(t, id); r.Status != job.StatusSucceeded {
			t.Fatalf("result after the resume: %+v", r)
		}
	})

	t.Run("restarted processes find what exists", func(t *testing.T) {
		// A second dispatcher updates the streams, bucket and consumer the
		// first one created; a second worker updates its pool's consumer.
		// Each has its own connection, as a process would: the server
		// lets a connection answer a request once, and a connection with
		// two dispatchers would receive each request twice.
		f.startDispatcher(t, connectAs(t, f.srv.url(), f.keys, roleDispatcher))
		f.startWorker(t, connectAs(t, f.srv.url(), f.keys, roleWorker("default")), "w-security-2")
		id := f.submit(t, &job.Request{Command: []string{"ok"}})
		if r := f.result(t, id); r.Status != job.StatusSucceeded {
			t.Fatalf("result: %+v", r)
		}
	})

	f.noViolations(t)
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
