package security_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/artifact"
	"github.com/fleet-dev/fleet/job"
)

// configured copies the shipped configuration into a temporary folder and
// adds pools with add-pool.sh and tenants with add-tenant.sh, as an
// operator would.
func configured(t *testing.T, pools, tenants []string) string {
	t.Helper()
	conf := filepath.Join(t.TempDir(), "fleet.conf")
	data, err := os.ReadFile(shipped(t, "fleet.conf"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(conf, data, 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(script, name string) {
		out, err := exec.Command("sh", shipped(t, script), name, conf).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", script, name, err, out)
		}
	}
	for _, p := range pools {
		run("add-pool.sh", p)
	}
	for _, tn := range tenants {
		run("add-tenant.sh", tn)
	}
	return conf
}

// refused asserts that the server refused an operation of c on subject
// with a permissions violation: the connection is told (asynchronously),
// and the server logs it. A nil c is a client of another program: only
// the server's log is read. The server tells the client before it logs, so
// the log is waited for too.
func refused(t *testing.T, s *natsServer, c *conn, subject string) {
	t.Helper()
	if c != nil {
		c.errs.wait(t, "Permissions Violation", `"`+subject+`"`)
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		for _, v := range s.log.violations() {
			if containsAll(v, `"`+subject+`"`) {
				return
			}
		}
	}
	t.Fatalf("the server logged no violation on %s: %q", subject, s.log.violations())
}

// jsRequest sends a request that must be refused: the server reports the
// violation, and no answer comes.
func jsRequest(t *testing.T, s *natsServer, c *conn, subject string, body any) {
	t.Helper()
	var data []byte
	if body != nil {
		data, _ = json.Marshal(body)
	}
	inbox := c.NewInbox()
	sub, err := c.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := c.PublishRequest(subject, inbox, data); err != nil {
		t.Fatal(err)
	}
	refused(t, s, c, subject)
	if m, err := sub.NextMsg(50 * time.Millisecond); err == nil {
		t.Fatalf("%s was answered: %s", subject, m.Data)
	}
}

// forbidden is one operation a role must be refused.
type forbidden struct {
	name    string
	c       *conn
	op      string // "pub" (a plain publish), "sub", or "req" (a request, its answer must not come)
	subject string
	body    any
}

func (o forbidden) run(t *testing.T, s *natsServer) {
	t.Helper()
	switch o.op {
	case "pub":
		data, _ := json.Marshal(o.body)
		if err := o.c.Publish(o.subject, data); err != nil {
			t.Fatal(err)
		}
		refused(t, s, o.c, o.subject)
	case "sub":
		sub, err := o.c.SubscribeSync(o.subject)
		if err != nil {
			t.Fatal(err)
		}
		refused(t, s, o.c, o.subject)
		if m, err := sub.NextMsg(50 * time.Millisecond); err == nil {
			t.Fatalf("received %s on %s", m.Data, o.subject)
		}
	case "req":
		jsRequest(t, s, o.c, o.subject, o.body)
	default:
		t.Fatalf("unknown op %q", o.op)
	}
}

// victim is a job of tenant default in pool gpu with what a tenant must
// not read and a worker of another pool must not write: its records, its
// result, its notices, an output stored as an object, its log, its
// input uploaded by its tenant.
type victim struct {
	id       string
	result   *job.Result
	output   job.Artifact
	upload   job.InputRef
	logChunk string // the subject of its log's first chunk
}

func newVictim(t *testing.T, f *fleet) *victim {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ref, err := f.client.Upload(ctx, "victim/in.bin", bytes.NewReader(bytes.Repeat([]byte("secret "), 50_000)))
	if err != nil {
		t.Fatalf("upload: %v", err)
	}
	id := f.submit(t, &job.Request{Pool: "gpu", Command: []string{"files"}, Outputs: []string{"out.bin"},
		InputRefs: map[string]job.InputRef{"in.bin": *ref}})
	r := f.result(t, id)
	if r.Status != job.StatusSucceeded {
		t.Fatalf("the victim job: %+v", r)
	}
	store := artifact.New(f.d.JetStream(), artifact.Config{})
	logChunk, err := store.ChunkSubject("fleet-artifacts-gpu", artifact.LogKey("default", id, 1), 0)
	if err != nil {
		t.Fatal(err)
	}
	return &victim{id: id, result: r, output: r.Artifacts["out.bin"], upload: *ref, logChunk: logChunk}
}

// newVictimSchedule makes a schedule of tenant default that fires on the
// 29th of February only (not during the test), and waits until a dispatcher holds the schedules'
// lease, so that the bucket holds what it will hold throughout; it returns
// the schedule's name.
func newVictimSchedule(t *testing.T, f *fleet) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := f.client.CreateSchedule(ctx, &job.Schedule{Name: "victim", Cron: "0 0 29 2 *",
		Template: &job.Request{Command: []string{"ok"}}}); err != nil {
		t.Fatalf("create a schedule: %v", err)
	}
	kv, err := f.d.JetStream().KeyValue(ctx, "fleet-schedules")
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := kv.Get(ctx, "leader"); err == nil {
			return "victim"
		}
		if ctx.Err() != nil {
			t.Fatal("no dispatcher took the schedules' lease")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// newVictimRun runs a run of tenant default whose one node runs in pool
// gpu, and returns its id.
func newVictimRun(t *testing.T, f *fleet) string {
	t.Helper()
	r := &job.RunRequest{ID: "victim-run", Nodes: []job.RunNode{{ID: "n", Job: &job.Request{Pool: "gpu", Command: []string{"ok"}}}}}
	if end := runToEnd(t, f, f.client, r); end.State != job.RunSucceeded {
		t.Fatalf("the victim run: %+v", end)
	}
	return r.ID
}

// newVictimFeed asks for a consumer of tenant default's feed, which
// holds the victim's result, and returns its name.
func newVictimFeed(t *testing.T, f *fleet) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := f.client.FeedConsumer(ctx, "victim", nil)
	if err != nil {
		t.Fatalf("a consumer of default's feed: %v", err)
	}
	return r.Consumer
}

// chunk is the subject of the first chunk of an object.
func chunk(t *testing.T, f *fleet, bucket, key string) string {
	t.Helper()
	s, err := artifact.New(f.d.JetStream(), artifact.Config{}).ChunkSubject(bucket, key, 0)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func meta(bucket, key string) string {
	return "$O." + bucket + ".M." + base64.URLEncoding.EncodeToString([]byte(key))
}

// TestRolesAreConfined checks, one test per operation, what each role of
// the shipped configuration must not do, on a fleet with two pools
// (default, gpu) and two tenants (default, acme): each is refused with a
// permissions violation, and nothing it aimed at changed.
func TestRolesAreConfined(t *testing.T) {
	f := startFleet(t)
	v := newVictim(t, f)
	op := connectAs(t, f.srv.url(), f.keys, roleOperator)
	acme, work := f.acmeConn, f.work
	s := f.srv

	sched := newVictimSchedule(t, f)
	run := newVictimRun(t, f)
	feed := newVictimFeed(t, f)
	outChunk := chunk(t, f, v.output.Bucket, v.output.Key)
	upChunk := chunk(t, f, v.upload.Bucket, v.upload.Key)
	before := map[string]uint64{}
	for _, st := range []string{"FLEET_POOL_gpu", "FLEET_POOL_default", "FLEET_DLQ", "FLEET_EVENTS", "FLEET_INTAKE",
		"OBJ_fleet-artifacts-gpu", "OBJ_fleet-uploads-default", "KV_fleet-schedules", "FLEET_RUNS"} {
		before[st] = s.streamMsgs(t, st)
	}
	var (
		rec    = map[string]any{"id": v.id, "tenant": "default", "pool": "gpu", "state": "succeeded"}
		pull   = map[string]any{"batch": 1, "expires": int64(time.Second)}
		lastOf = func(subject string) map[string]any { return map[string]any{"last_by_subj": subject} }
		doc    = map[string]any{"name": "forged", "every": "1s", "template": map[string]any{"command": []string{"ok"}}}
		holder = map[string]any{"holder": "forged"}
		ended  = map[string]any{"run_id": run, "node_id": "n", "job_id": run + ":n", "pool": "gpu", "round": 1, "state": "failed"}
		runDoc = map[string]any{"id": "forged", "nodes": []any{map[string]any{"id": "n", "job": map[string]any{"command": []string{"ok"}}}}}
	)

	for _, o := range []forbidden{
		// A worker of pool default, against a job of pool gpu.
		{"a default worker publishes a gpu job's result", work, "pub", "fleet.p.gpu.r.default." + v.id, rec},
		{"a default worker overwrites a gpu job's record", work, "pub", "fleet.p.gpu.s.default." + v.id, rec},
		{"a default worker publishes a gpu job's event", work, "pub", "fleet.t.default.ev.gpu." + v.id, rec},
		{"a default worker dead-letters a gpu job", work, "pub", "fleet.dlq.gpu.default." + v.id, rec},
		{"a default worker writes gpu's outputs (a chunk)", work, "pub", outChunk, "forged"},
		{"a default worker writes gpu's outputs (a description)", work, "pub", meta(v.output.Bucket, v.output.Key), rec},
		{"a default worker purges gpu's outputs", work, "req", "$JS.API.STREAM.PURGE.OBJ_fleet-artifacts-gpu", nil},
		{"a default worker deletes gpu's bucket", work, "req", "$JS.API.STREAM.DELETE.OBJ_fleet-artifacts-gpu", nil},
		{"a default worker pulls gpu's jobs", work, "req", "$JS.API.CONSUMER.MSG.NEXT.FLEET_POOL_gpu.jobs-gpu", pull},
		{"a default worker pulls a queue of gpu", work, "req", "$JS.API.CONSUMER.MSG.NEXT.FLEET_POOL_gpu.q1-acme", pull},
		{"a default worker makes a queue of gpu", work, "req", "$JS.API.CONSUMER.CREATE.FLEET_POOL_gpu.q1-acme.fleet.p.gpu.q1.acme.>", nil},
		{"a default worker hears what is queued in gpu", work, "sub", "fleet.t.acme.job.gpu.q1.>", nil},
		{"a default worker reads gpu's records", work, "req", "$JS.API.DIRECT.GET.FLEET_POOL_gpu", lastOf("fleet.p.gpu.>")},
		{"a default worker acknowledges gpu's messages", work, "pub", "$JS.ACK.FLEET_POOL_gpu.jobs-gpu.1.1.1.1.1", "+ACK"},
		{"a default worker hears gpu's stop notices", work, "sub", "fleet.stop.gpu.>", nil},
		{"a default worker queues a job", work, "pub", "fleet.p.default.q3.default.forged", rec},
		{"a default worker rejects a request", work, "pub", "fleet.p.default.x.default.forged", rec},
		{"a default worker writes a tenant's uploads", work, "pub", upChunk, "forged"},
		{"a default worker follows a tenant's records", work, "sub", "fleet.t.*.job.>", nil},
		{"a default worker changes its pool's stream", work, "req", "$JS.API.STREAM.UPDATE.FLEET_POOL_default", nil},

		// A worker has nothing to do with schedules: neither their
		// requests nor their bucket.
		{"a default worker creates a schedule", work, "req", "fleet.t.default.schedules.create.forged", doc},
		{"a default worker lists a tenant's schedules", work, "req", "fleet.t.default.schedules.list", nil},
		{"a default worker deletes a tenant's schedule", work, "req", "fleet.t.default.schedules.delete." + sched, nil},
		{"a default worker hears the schedules' requests", work, "sub", "fleet.t.*.schedules.>", nil},
		{"a default worker takes the schedules' lease", work, "pub", "$KV.fleet-schedules.leader", holder},
		{"a default worker writes a schedule into its bucket", work, "pub", "$KV.fleet-schedules.spec.default.forged", doc},
		{"a default worker reads a schedule from its bucket", work, "req", "$JS.API.DIRECT.GET.KV_fleet-schedules.$KV.fleet-schedules.spec.default." + sched, nil},
		{"a default worker reads the schedules' bucket", work, "req", "$JS.API.DIRECT.GET.KV_fleet-schedules", lastOf("$KV.fleet-schedules.leader")},
		{"a default worker follows the schedules' bucket", work, "req", "$JS.API.CONSUMER.CREATE.KV_fleet-schedules.peek.$KV.fleet-schedules.>", nil},
		{"a default worker looks up the schedules' bucket", work, "req", "$JS.API.STREAM.INFO.KV_fleet-schedules", nil},
		{"a default worker purges the schedules' bucket", work, "req", "$JS.API.STREAM.PURGE.KV_fleet-schedules", nil},

		// A worker of pool default, against runs: it says that a node of
		// its own pool ended, nothing else.
		{"a default worker says a gpu node ended", work, "pub", "fleet.r.default." + run + ".node.gpu.n", ended},
		{"a default worker writes a run's definition", work, "pub", "fleet.r.default.forged.def", runDoc},
		{"a default worker cancels a run", work, "pub", "fleet.r.default." + run + ".cancel.1", ended},
		{"a default worker retries a run", work, "pub", "fleet.r.default." + run + ".retry.2", ended},
		{"a default worker ends a run", work, "pub", "fleet.r.default." + run + ".end.1", ended},
		{"a default worker forges a run's live message", work, "pub", "fleet.t.default.run." + run + ".end.1", ended},
		{"a default worker hears runs", work, "sub", "fleet.t.*.run.>", nil},
		{"a default worker asks about a run", work, "req", "fleet.t.default.runs.status." + run, nil},
		{"a default worker submits a run", work, "req", "fleet.t.default.runs.submit", runDoc},
		{"a default worker reads a run from the stream's leader", work, "req", "$JS.API.STREAM.MSG.GET.FLEET_RUNS", lastOf("fleet.r.default." + run + ".def")},
		{"a default worker reads a run by direct get", work, "req", "$JS.API.DIRECT.GET.FLEET_RUNS.fleet.r.default." + run + ".def", nil},
		{"a default worker reads runs with a consumer", work, "req", "$JS.API.CONSUMER.CREATE.FLEET_RUNS.peek.fleet.r.>", nil},
		{"a default worker pulls the releaser's messages", work, "req", "$JS.API.CONSUMER.MSG.NEXT.FLEET_RUNS.releaser", pull},

		// The producer of tenant acme, against tenant default's job.
		{"acme submits as default", acme, "req", "fleet.t.default.submit", map[string]any{"command": []string{"ok"}}},
		{"acme submits as default through the intake", acme, "pub", "fleet.t.default.intake", map[string]any{"command": []string{"ok"}}},
		{"acme reads default's job state", acme, "req", "fleet.t.default.status." + v.id, nil},
		{"acme reads default's job history", acme, "req", "fleet.t.default.history." + v.id, nil},
		{"acme cancels default's job", acme, "req", "fleet.t.default.cancel." + v.id, nil},
		{"acme retries default's dead letter", acme, "req", "fleet.t.default.retry." + v.id, nil},
		{"acme follows default's records", acme, "sub", "fleet.t.default.job.>", nil},
		{"acme follows every tenant's records", acme, "sub", "fleet.t.*.job.>", nil},
		{"acme follows default's events", acme, "sub", "fleet.t.default.ev.>", nil},
		{"acme reads default's result by subject", acme, "req", "$JS.API.DIRECT.GET.FLEET_POOL_gpu.fleet.p.gpu.r.default." + v.id, nil},
		{"acme reads default's result by a direct get's body", acme, "req", "$JS.API.DIRECT.GET.FLEET_POOL_gpu", lastOf("fleet.p.gpu.r.default." + v.id)},
		{"acme reads default's result from the stream's leader", acme, "req", "$JS.API.STREAM.MSG.GET.FLEET_POOL_gpu", lastOf("fleet.p.gpu.r.default." + v.id)},
		{"acme reads default's records with a consumer", acme, "req", "$JS.API.CONSUMER.CREATE.FLEET_POOL_gpu.peek.fleet.p.gpu.*.default.>", nil},
		{"acme reads default's events from their stream", acme, "req", "$JS.API.DIRECT.GET.FLEET_EVENTS", lastOf("fleet.t.default.ev.gpu." + v.id)},
		{"acme reads default's output", acme, "req", "$JS.API.DIRECT.GET." + "OBJ_" + v.output.Bucket + "." + outChunk, nil},
		{"acme reads default's output's description", acme, "req", "$JS.API.DIRECT.GET.OBJ_" + v.output.Bucket + "." + meta(v.output.Bucket, v.output.Key), nil},
		{"acme reads default's output with a consumer", acme, "req", "$JS.API.CONSUMER.CREATE.OBJ_fleet-artifacts-gpu.peek.$O.fleet-artifacts-gpu.C.default.>", nil},
		{"acme reads default's log", acme, "req", "$JS.API.DIRECT.GET.OBJ_fleet-artifacts-gpu." + v.logChunk, nil},
		{"acme reads default's upload", acme, "req", "$JS.API.DIRECT.GET.OBJ_" + v.upload.Bucket + "." + upChunk, nil},
		{"acme overwrites default's upload", acme, "pub", upChunk, "forged"},
		{"acme writes default's uploads bucket in its own name", acme, "pub", "$O.fleet-uploads-default.C.acme.x.0", "forged"},
		{"acme purges default's uploads", acme, "req", "$JS.API.STREAM.PURGE.OBJ_fleet-uploads-default", nil},
		{"acme asks for default's uploads bucket", acme, "req", "fleet.t.default.uploads", nil},
		{"acme pulls a pool's jobs", acme, "req", "$JS.API.CONSUMER.MSG.NEXT.FLEET_POOL_gpu.jobs-gpu", pull},
		{"acme pulls its own queue", acme, "req", "$JS.API.CONSUMER.MSG.NEXT.FLEET_POOL_gpu.q3-acme", pull},
		{"acme makes a queue", acme, "req", "$JS.API.CONSUMER.CREATE.FLEET_POOL_gpu.q1-acme.fleet.p.gpu.q1.acme.>", nil},
		{"acme pulls the stored submissions", acme, "req", "$JS.API.CONSUMER.MSG.NEXT.FLEET_INTAKE.dispatcher", pull},
		{"acme reads the dead letters", acme, "req", "$JS.API.CONSUMER.CREATE.FLEET_DLQ.peek.fleet.dlq.>", nil},
		{"acme forges its own job's record", acme, "pub", "fleet.p.gpu.r.acme.forged", rec},
		{"acme forges its own job's live record", acme, "pub", "fleet.t.acme.job.gpu.r.forged", rec},
		{"acme forges its own job's event", acme, "pub", "fleet.t.acme.ev.gpu.forged", rec},
		{"acme pauses a pool", acme, "req", "fleet.pools.gpu.pause", nil},
		{"acme creates a stream", acme, "req", "$JS.API.STREAM.CREATE.OBJ_fleet-uploads-acme2", nil},
		{"acme overhears default's replies", acme, "sub", "_INBOX.producer.default.>", nil},
		{"acme overhears every reply", acme, "sub", "_INBOX.>", nil},

		// The producer of tenant acme, against tenant default's schedules.
		{"acme creates a schedule as default", acme, "req", "fleet.t.default.schedules.create.forged", doc},
		{"acme lists default's schedules", acme, "req", "fleet.t.default.schedules.list", nil},
		{"acme reads default's schedule", acme, "req", "fleet.t.default.schedules.show." + sched, nil},
		{"acme pauses default's schedule", acme, "req", "fleet.t.default.schedules.pause." + sched, nil},
		{"acme deletes default's schedule", acme, "req", "fleet.t.default.schedules.delete." + sched, nil},
		{"acme hears every tenant's schedule requests", acme, "sub", "fleet.t.*.schedules.>", nil},
		{"acme writes its own schedule into the bucket", acme, "pub", "$KV.fleet-schedules.spec.acme.forged", doc},
		{"acme takes the schedules' lease", acme, "pub", "$KV.fleet-schedules.leader", holder},
		{"acme reads default's schedule from the bucket", acme, "req", "$JS.API.DIRECT.GET.KV_fleet-schedules.$KV.fleet-schedules.spec.default." + sched, nil},
		{"acme follows the schedules' bucket", acme, "req", "$JS.API.CONSUMER.CREATE.KV_fleet-schedules.peek.$KV.fleet-schedules.>", nil},

		// The producer of tenant acme, against tenant default's run, and
		// the runs' stream, which only dispatchers and workers write.
		{"acme submits a run as default", acme, "req", "fleet.t.default.runs.submit", runDoc},
		{"acme reads default's run", acme, "req", "fleet.t.default.runs.status." + run, nil},
		{"acme lists default's runs", acme, "req", "fleet.t.default.runs.list", nil},
		{"acme cancels default's run", acme, "req", "fleet.t.default.runs.cancel." + run, nil},
		{"acme retries default's run", acme, "req", "fleet.t.default.runs.retry." + run, nil},
		{"acme follows default's run", acme, "sub", "fleet.t.default.run." + run + ".>", nil},
		{"acme follows every tenant's runs", acme, "sub", "fleet.t.*.run.>", nil},
		{"acme hears every tenant's run requests", acme, "sub", "fleet.t.*.runs.>", nil},
		{"acme reads default's run from the stream's leader", acme, "req", "$JS.API.STREAM.MSG.GET.FLEET_RUNS", lastOf("fleet.r.default." + run + ".def")},
		{"acme reads default's run by direct get", acme, "req", "$JS.API.DIRECT.GET.FLEET_RUNS.fleet.r.default." + run + ".def", nil},
		{"acme reads default's run by a direct get's body", acme, "req", "$JS.API.DIRECT.GET.FLEET_RUNS", lastOf("fleet.r.default." + run + ".def")},
		{"acme reads default's run with a consumer", acme, "req", "$JS.API.CONSUMER.CREATE.FLEET_RUNS.peek.fleet.r.default.>", nil},
		{"acme looks up the runs' stream", acme, "req", "$JS.API.STREAM.INFO.FLEET_RUNS", nil},
		{"acme pulls the releaser's messages", acme, "req", "$JS.API.CONSUMER.MSG.NEXT.FLEET_RUNS.releaser", pull},
		{"acme writes its own run's definition", acme, "pub", "fleet.r.acme.forged.def", runDoc},
		{"acme says its own run's node ended", acme, "pub", "fleet.r.acme.forged.node.gpu.n", ended},
		{"acme ends its own run", acme, "pub", "fleet.r.acme.forged.end.1", ended},
		{"acme forges its own run's live end", acme, "pub", "fleet.t.acme.run.forged.end.1", ended},

		// The producer of tenant acme, against tenant default's feed; and
		// its own feed's consumers are the dispatchers' to make: one that
		// delivers could deliver onto any subject (another tenant's cancel
		// requests, its live records).
		{"acme asks for a consumer of default's feed", acme, "req", "fleet.t.default.feed.peek", nil},
		{"acme pulls default's feed", acme, "req", "$JS.API.CONSUMER.MSG.NEXT.FLEET_FEED_default." + feed, pull},
		{"acme looks at default's feed consumer", acme, "req", "$JS.API.CONSUMER.INFO.FLEET_FEED_default." + feed, nil},
		{"acme deletes default's feed consumer", acme, "req", "$JS.API.CONSUMER.DELETE.FLEET_FEED_default." + feed, nil},
		{"acme acknowledges default's feed", acme, "pub", "$JS.ACK.FLEET_FEED_default." + feed + ".1.1.1.1.0", "+ACK"},
		{"acme reads default's feed by direct get", acme, "req", "$JS.API.DIRECT.GET.FLEET_FEED_default", lastOf("fleet.t.default.job.gpu.r." + v.id)},
		{"acme looks up default's feed", acme, "req", "$JS.API.STREAM.INFO.FLEET_FEED_default", nil},
		{"acme makes a consumer of its own feed", acme, "req", "$JS.API.CONSUMER.CREATE.FLEET_FEED_acme.mine.fleet.t.acme.job.>",
			map[string]any{"stream_name": "FLEET_FEED_acme", "config": map[string]any{"durable_name": "mine",
				"filter_subject": "fleet.t.acme.job.>", "deliver_subject": "fleet.t.default.cancel." + v.id}}},
		{"acme makes a durable consumer of its own feed", acme, "req", "$JS.API.CONSUMER.DURABLE.CREATE.FLEET_FEED_acme.mine", nil},
		{"acme changes its own feed", acme, "req", "$JS.API.STREAM.UPDATE.FLEET_FEED_acme", nil},
		{"acme purges its own feed", acme, "req", "$JS.API.STREAM.PURGE.FLEET_FEED_acme", nil},
		{"a default worker pulls a tenant's feed", work, "req", "$JS.API.CONSUMER.MSG.NEXT.FLEET_FEED_default." + feed, pull},
		{"a default worker asks for a tenant's feed consumer", work, "req", "fleet.t.default.feed.peek", nil},

		// The dispatcher takes no jobs and stores no files.
		{"the dispatcher pulls a pool's jobs", f.disp, "req", "$JS.API.CONSUMER.MSG.NEXT.FLEET_POOL_gpu.jobs-gpu", pull},
		{"the dispatcher pulls tenant default's queue", f.disp, "req", "$JS.API.CONSUMER.MSG.NEXT.FLEET_POOL_gpu.q3-default", pull},
		{"the dispatcher changes a pool's consumer", f.disp, "req", "$JS.API.CONSUMER.CREATE.FLEET_POOL_gpu.jobs-gpu.fleet.p.gpu.>", nil},
		{"the dispatcher deletes a pool's consumer", f.disp, "req", "$JS.API.CONSUMER.DELETE.FLEET_POOL_gpu.jobs-gpu", nil},
		{"the dispatcher deletes a stream", f.disp, "req", "$JS.API.STREAM.DELETE.FLEET_POOL_gpu", nil},
		{"the dispatcher purges a stream", f.disp, "req", "$JS.API.STREAM.PURGE.FLEET_POOL_gpu", nil},
		{"the dispatcher writes a pool's outputs", f.disp, "pub", outChunk, "forged"},
		{"the dispatcher writes a tenant's uploads", f.disp, "pub", upChunk, "forged"},
		{"the dispatcher answers what it was not asked", f.disp, "pub", nats.NewInbox(), map[string]any{"job_id": "forged"}},
		{"the dispatcher overhears a worker's replies", f.disp, "sub", "_INBOX.worker.gpu.>", nil},

		// Operators read and steer; they write no job's record or file.
		{"an operator writes a job's record", op, "pub", "fleet.p.gpu.r.default." + v.id, rec},
		{"an operator submits", op, "req", "fleet.t.default.submit", map[string]any{"command": []string{"ok"}}},
		{"an operator pulls a pool's jobs", op, "req", "$JS.API.CONSUMER.MSG.NEXT.FLEET_POOL_gpu.jobs-gpu", pull},
		{"an operator writes a pool's outputs", op, "pub", outChunk, "forged"},
		{"an operator purges a bucket", op, "req", "$JS.API.STREAM.PURGE.OBJ_fleet-artifacts-gpu", nil},
		{"an operator deletes a stream", op, "req", "$JS.API.STREAM.DELETE.FLEET_DLQ", nil},
		{"an operator writes a schedule into its bucket", op, "pub", "$KV.fleet-schedules.spec.default.forged", doc},
		{"an operator takes the schedules' lease", op, "pub", "$KV.fleet-schedules.leader", holder},
		{"an operator writes a run's message", op, "pub", "fleet.r.default." + run + ".end.1", ended},
		{"an operator submits a run", op, "req", "fleet.t.default.runs.submit", runDoc},
		{"an operator cancels a run", op, "req", "fleet.t.default.runs.cancel." + run, nil},

		// Contract v1 is off: none of its subjects is anyone's.
		{"v1: a producer submits", f.prod, "pub", "fleet.submit", map[string]any{"command": []string{"ok"}}},
		{"v1: a producer submits directly", f.prod, "req", "fleet.submit.direct", map[string]any{"command": []string{"ok"}}},
		{"v1: a producer follows results", f.prod, "sub", "fleet.results.>", nil},
		{"v1: a worker publishes a result", work, "pub", "fleet.results-in." + v.id, rec},
		{"v1: a worker writes a job state", work, "pub", "$KV.fleet-jobs." + v.id, rec},
		{"v1: the dispatcher takes direct submissions", f.disp, "sub", "fleet.submit.direct", nil},
	} {
		t.Run(o.name, func(t *testing.T) { o.run(t, s) })
	}

	t.Run("what they aimed at is as it was", func(t *testing.T) {
		for st, n := range before {
			if got := s.streamMsgs(t, st); got != n {
				t.Errorf("%s: %d messages, was %d", st, got, n)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r := f.result(t, v.id)
		if r.Status != job.StatusSucceeded || r.Artifacts["out.bin"] != v.output {
			t.Errorf("the victim's result: %+v", r)
		}
		l, err := f.client.Schedules(ctx)
		if err != nil || len(l.Schedules) != 1 || l.Schedules[0].Schedule.Name != sched || l.Schedules[0].Status != job.ScheduleActive {
			t.Errorf("tenant default's schedules: %+v, %v", l, err)
		}
		if l, err := f.acme.Schedules(ctx); err != nil || len(l.Schedules) != 0 {
			t.Errorf("tenant acme's schedules: %+v, %v", l, err)
		}
		if v, err := f.client.Run(ctx, run); err != nil || v.State != job.RunSucceeded || v.Round != 1 || v.CancelRequested {
			t.Errorf("tenant default's run: %+v, %v", v, err)
		}
		if l, err := f.acme.Runs(ctx); err != nil || len(l) != 0 {
			t.Errorf("tenant acme's runs: %q, %v", l, err)
		}
		if c, err := f.d.JetStream().Consumer(ctx, "FLEET_FEED_default", feed); err != nil || c.CachedInfo().Delivered.Consumer != 0 {
			t.Errorf("tenant default's feed consumer: %v; want it there, nothing delivered", err)
		}
		o, err := f.client.Output(ctx, v.id, "out.bin")
		if err != nil {
			t.Fatal(err)
		}
		defer o.Close()
		if n, err := bytes.NewBuffer(nil).ReadFrom(o); err != nil || n != v.output.Size {
			t.Errorf("the victim's output reads %d bytes, %v", n, err)
		}
	})

	t.Run("a worker's consumer reads its own pool only", func(t *testing.T) {
		// Its filters are in the request's body, but the stream is in the
		// subject: pointing its consumer at another pool's stream is refused.
		jsRequest(t, s, work, "$JS.API.CONSUMER.CREATE.FLEET_POOL_gpu.jobs-default",
			map[string]any{"stream_name": "FLEET_POOL_gpu", "config": map[string]any{"durable_name": "jobs-default",
				"filter_subjects": []string{"fleet.p.gpu.>"}, "ack_policy": "explicit"}})
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		wjs, _ := jetstream.New(work.Conn)
		if _, err := wjs.Consumer(ctx, "FLEET_POOL_gpu", "jobs-gpu"); err == nil {
			t.Fatal("a worker of pool default looked up the consumer of pool gpu")
		}
	})
}
