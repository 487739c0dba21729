package security_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// withPool copies the shipped configuration into a temporary folder and
// adds a pool with add-pool.sh, as an operator would.
func withPool(t *testing.T, pool string) string {
	t.Helper()
	conf := filepath.Join(t.TempDir(), "fleet.conf")
	data, err := os.ReadFile(shipped(t, "fleet.conf"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(conf, data, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("sh", shipped(t, "add-pool.sh"), pool, conf).CombinedOutput()
	if err != nil {
		t.Fatalf("add-pool.sh: %v\n%s", err, out)
	}
	return conf
}

// refused asserts that the server refused an operation of c on subject:
// the connection is told (asynchronously), and the server logs it. The
// server tells the client before it logs, so the log is waited for too.
func refused(t *testing.T, s *natsServer, c *conn, subject string) {
	t.Helper()
	c.errs.wait(t, "Permissions Violation", `"`+subject+`"`)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		for _, v := range s.log.violations() {
			if containsAll(v, `"`+subject+`"`) {
				return
			}
		}
	}
	t.Fatalf("the server logged no violation on %s: %q", subject, s.log.violations())
}

// jsRequest sends a JetStream API request that must be refused: the
// server reports the violation, and no answer comes.
func jsRequest(t *testing.T, s *natsServer, c *conn, subject string, body any) {
	t.Helper()
	data, _ := json.Marshal(body)
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

// TestRolesAreConfined checks what each role must not do, on a server with
// the shipped configuration and a second pool added by add-pool.sh.
func TestRolesAreConfined(t *testing.T) {
	k := makeKeys(t, roleDispatcher, roleProducer, roleWorker("default"), roleWorker("other"))
	s := startServer(t, withPool(t, "other"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	qc := queue.Config{AckWait: 5 * time.Second}

	// The dispatcher sets up the streams; each pool's worker creates its
	// consumer; a job waits for pool "other".
	disp := connectAs(t, s.url(), k, roleDispatcher)
	djs, _ := jetstream.New(disp.Conn)
	if err := queue.Setup(ctx, djs, qc, nil); err != nil {
		t.Fatal(err)
	}
	other := connectAs(t, s.url(), k, roleWorker("other"))
	ojs, _ := jetstream.New(other.Conn)
	otherCons, err := queue.PoolConsumer(ctx, ojs, qc, "other", nil)
	if err != nil {
		t.Fatalf("worker of pool other: %v", err)
	}
	if _, err := djs.Publish(ctx, "fleet.jobs.other", []byte(`{"id":"secret-job","command":["true"],"env":{"TOKEN":"s3cret"}}`)); err != nil {
		t.Fatal(err)
	}
	work := connectAs(t, s.url(), k, roleWorker("default"))
	wjs, _ := jetstream.New(work.Conn)
	if _, err := queue.PoolConsumer(ctx, wjs, qc, "default", nil); err != nil {
		t.Fatalf("worker of pool default: %v", err)
	}
	prod := connectAs(t, s.url(), k, roleProducer)
	pjs, _ := jetstream.New(prod.Conn)

	msgs := func(stream string) uint64 { return s.streamMsgs(t, stream) }

	t.Run("a producer cannot publish jobs, results, events, states or dead letters", func(t *testing.T) {
		before := map[string]uint64{}
		for _, st := range []string{"FLEET_JOBS_default", "FLEET_JOBS_other", "FLEET_RESULTS", "FLEET_EVENTS", "FLEET_DLQ", "KV_fleet-jobs"} {
			before[st] = msgs(st)
		}
		for _, subj := range []string{"fleet.jobs.default", "fleet.jobs.other", "fleet.results.j1", "fleet.events.j1",
			"fleet.dlq.default", "$KV.fleet-jobs.j1", "fleet.pools.default.pause", "fleet.pools.default.resume", "$KV.fleet-pools.default"} {
			if err := prod.Publish(subj, []byte(`{}`)); err != nil {
				t.Fatal(err)
			}
			refused(t, s, prod, subj)
		}
		// Through JetStream too: no acknowledgement comes.
		short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancel()
		if _, err := pjs.Publish(short, "fleet.jobs.default", []byte(`{}`)); err == nil {
			t.Fatal("a producer's job was stored")
		}
		for st, n := range before {
			if got := msgs(st); got != n {
				t.Errorf("%s: %d messages, was %d", st, got, n)
			}
		}
	})

	t.Run("no role can overhear another's inboxes", func(t *testing.T) {
		for _, tc := range []struct {
			c       *conn
			subject string
		}{
			{prod, "_INBOX.>"},
			{prod, "_INBOX.worker.default.>"},
			{work, "_INBOX.dispatcher.>"},
			{work, "_INBOX.worker.other.>"},
			{other, "_INBOX.producer.>"},
			{disp, "_INBOX.worker.default.>"},
		} {
			if _, err := tc.c.SubscribeSync(tc.subject); err != nil {
				t.Fatal(err)
			}
			refused(t, s, tc.c, tc.subject)
		}
	})

	t.Run("a producer cannot take jobs, read dead letters, or change streams", func(t *testing.T) {
		short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancel()
		if _, err := queue.PoolConsumer(short, pjs, qc, "default", nil); err == nil {
			t.Fatal("a producer created a pool's consumer")
		}
		jsRequest(t, s, prod, "$JS.API.CONSUMER.CREATE.FLEET_JOBS_default.jobs-default.fleet.jobs.default", nil)
		jsRequest(t, s, prod, "$JS.API.CONSUMER.MSG.NEXT.FLEET_JOBS_other.jobs-other", map[string]any{"batch": 1})
		if _, err := prod.SubscribeSync("fleet.jobs.>"); err != nil {
			t.Fatal(err)
		}
		refused(t, s, prod, "fleet.jobs.>")
		jsRequest(t, s, prod, "$JS.API.STREAM.DELETE.FLEET_JOBS_default", nil)
		jsRequest(t, s, prod, "$JS.API.STREAM.CREATE.FLEET_JOBS_new", nil)
		jsRequest(t, s, prod, "$JS.API.STREAM.PURGE.FLEET_RESULTS", nil)
		jsRequest(t, s, prod, "$JS.API.CONSUMER.CREATE.FLEET_DLQ.peek.fleet.dlq.>", map[string]any{"stream_name": "FLEET_DLQ"})
		c, err := client.New(prod.Conn)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.DeadLetters(short, ""); err == nil {
			t.Fatal("a producer read the dead letters")
		}
	})

	t.Run("a worker cannot submit, publish jobs, or touch streams", func(t *testing.T) {
		for _, subj := range []string{"fleet.submit", "fleet.jobs.default", "fleet.jobs.other", "fleet.dlq.other", "fleet.cancel.j1"} {
			if err := work.Publish(subj, []byte(`{}`)); err != nil {
				t.Fatal(err)
			}
			refused(t, s, work, subj)
		}
		for _, subj := range []string{"fleet.submit", "fleet.jobs.>", "fleet.events.>", "fleet.results.>"} {
			if _, err := work.SubscribeSync(subj); err != nil {
				t.Fatal(err)
			}
			refused(t, s, work, subj)
		}
		jsRequest(t, s, work, "$JS.API.STREAM.DELETE.FLEET_JOBS_default", nil)
		jsRequest(t, s, work, "$JS.API.STREAM.UPDATE.FLEET_JOBS_default", nil)
		jsRequest(t, s, work, "$JS.API.STREAM.CREATE.FLEET_JOBS_other", nil)
		jsRequest(t, s, work, "$JS.API.CONSUMER.DELETE.FLEET_JOBS_other.jobs-other", nil)
	})

	t.Run("a worker cannot read another pool's work", func(t *testing.T) {
		short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancel()
		// Not by creating or binding to that pool's consumer...
		if _, err := queue.PoolConsumer(short, wjs, qc, "other", nil); err == nil {
			t.Fatal("a worker of pool default created the consumer of pool other")
		}
		refused(t, s, work, "$JS.API.CONSUMER.CREATE.FLEET_JOBS_other.jobs-other.fleet.jobs.other")
		if _, err := wjs.Consumer(short, "FLEET_JOBS_other", "jobs-other"); err == nil {
			t.Fatal("a worker of pool default looked up the consumer of pool other")
		}
		// ...nor by pulling from it directly...
		jsRequest(t, s, work, "$JS.API.CONSUMER.MSG.NEXT.FLEET_JOBS_other.jobs-other", map[string]any{"batch": 1, "expires": int64(time.Second)})
		// ...nor by pointing its own consumer at the other pool's subject.
		jsRequest(t, s, work, "$JS.API.CONSUMER.CREATE.FLEET_JOBS_other.jobs-default.fleet.jobs.other",
			map[string]any{"stream_name": "FLEET_JOBS_other", "config": map[string]any{"durable_name": "jobs-default",
				"filter_subject": "fleet.jobs.other", "ack_policy": "explicit"}})
		jsRequest(t, s, work, "$JS.API.CONSUMER.CREATE.FLEET_JOBS_other.jobs-default",
			map[string]any{"stream_name": "FLEET_JOBS_other", "config": map[string]any{"durable_name": "jobs-default",
				"filter_subject": "fleet.jobs.>", "ack_policy": "explicit"}})
		jsRequest(t, s, work, "$JS.API.DIRECT.GET.FLEET_JOBS_other", map[string]any{"last_by_subj": "fleet.jobs.other"})
		// The job is still there, for its own pool's workers.
		batch, err := otherCons.Fetch(1, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for m := range batch.Messages() {
			var r job.Request
			_ = json.Unmarshal(m.Data(), &r)
			got = append(got, r.ID)
			if err := m.Ack(); err != nil {
				t.Fatal(err)
			}
		}
		if len(got) != 1 || got[0] != "secret-job" {
			t.Fatalf("pool other's worker fetched %q (%v)", got, batch.Error())
		}
	})

	t.Run("a worker cannot acknowledge another pool's messages", func(t *testing.T) {
		subj := "$JS.ACK.FLEET_JOBS_other.jobs-other.1.1.1.1.1"
		if err := work.Publish(subj, []byte("+ACK")); err != nil {
			t.Fatal(err)
		}
		refused(t, s, work, subj)
	})

	t.Run("each role writes only its own bucket", func(t *testing.T) {
		// Producers upload inputs, workers store outputs and logs: neither
		// may write, purge or drop the other's bucket; producers may not
		// read the uploads (each other's inputs).
		for _, tc := range []struct {
			c       *conn
			subject string
		}{
			{prod, "$O.fleet-artifacts.M.b3V0cHV0cy9qMS8xL291dA=="},
			{prod, "$O.fleet-artifacts.C.forged"},
			{work, "$O.fleet-uploads.M.aW4uYmlu"},
			{work, "$O.fleet-uploads.C.forged"},
		} {
			if err := tc.c.Publish(tc.subject, []byte(`{}`)); err != nil {
				t.Fatal(err)
			}
			refused(t, s, tc.c, tc.subject)
		}
		jsRequest(t, s, prod, "$JS.API.STREAM.PURGE.OBJ_fleet-artifacts", nil)
		jsRequest(t, s, work, "$JS.API.STREAM.PURGE.OBJ_fleet-uploads", nil)
		jsRequest(t, s, prod, "$JS.API.DIRECT.GET.OBJ_fleet-uploads.$O.fleet-uploads.M.aW4uYmlu", nil)
		jsRequest(t, s, prod, "$JS.API.CONSUMER.CREATE.OBJ_fleet-uploads.peek.$O.fleet-uploads.C.>", nil)
		for _, c := range []*conn{prod, work} {
			jsRequest(t, s, c, "$JS.API.STREAM.DELETE.OBJ_fleet-artifacts", nil)
			jsRequest(t, s, c, "$JS.API.STREAM.UPDATE.OBJ_fleet-uploads", nil)
		}
	})

	t.Run("the dispatcher cannot take jobs", func(t *testing.T) {
		jsRequest(t, s, disp, "$JS.API.CONSUMER.MSG.NEXT.FLEET_JOBS_default.jobs-default", map[string]any{"batch": 1})
		jsRequest(t, s, disp, "$JS.API.CONSUMER.CREATE.FLEET_JOBS_default.jobs-default.fleet.jobs.default", nil)
		jsRequest(t, s, disp, "$JS.API.STREAM.DELETE.FLEET_JOBS_default", nil)
		jsRequest(t, s, disp, "$JS.API.STREAM.PURGE.FLEET_SUBMIT", nil)
	})

	t.Run("the dispatcher answers only requests it received", func(t *testing.T) {
		// Publishing to a producer's inbox is an answer only when the
		// dispatcher received a request with that reply subject.
		inbox := nats.NewInbox()
		if err := disp.Publish(inbox, []byte(`{"job_id":"forged"}`)); err != nil {
			t.Fatal(err)
		}
		refused(t, s, disp, inbox)
	})
}
