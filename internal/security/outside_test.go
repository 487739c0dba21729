package security_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/schematest"
	"github.com/fleet-dev/fleet/internal/testenv"
	"github.com/fleet-dev/fleet/job"
	"github.com/fleet-dev/fleet/schemas"
)

// schemaCheck returns a check of documents against the fleet's schema
// ref (a file of package schemas, with a #/$defs/... fragment).
func schemaCheck(t *testing.T, ref string) func(what string, data []byte) {
	t.Helper()
	s := schematest.Compile(t, ref)
	return func(what string, data []byte) {
		t.Helper()
		if err := schematest.Validate(s, data); err != nil {
			t.Errorf("%s is not a valid %s: %v\n%s", what, ref, err, data)
		}
	}
}

// natsRunner runs the nats CLI as a role, with its key and inbox prefix, and a
// configuration folder of the test's own.
type natsRunner struct {
	bin, url, home string
	keys           keys
}

func (c natsRunner) cmd(ctx context.Context, role string, args ...string) *exec.Cmd {
	timeout := "10s"
	if len(args) > 1 && args[0] == "--timeout" {
		timeout, args = args[1], args[2:]
	}
	all := append([]string{"--server", c.url, "--nkey", c.keys[role], "--inbox-prefix", inboxPrefix(role),
		"--timeout", timeout}, args...)
	cmd := exec.CommandContext(ctx, c.bin, all...)
	cmd.Env = append(os.Environ(), "HOME="+c.home, "XDG_CONFIG_HOME="+c.home, "NATS_CONTEXT=")
	return cmd
}

func (c natsRunner) run(t *testing.T, role string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var stderr bytes.Buffer
	cmd := c.cmd(ctx, role, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("nats %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.Bytes())
	}
	return out
}

// TestAnOutsideClientFollowsAJob: a client that is not the fleet's Go
// client, the nats CLI, with tenant acme's key and the shipped roles,
// follows a job through contract v2 by the documented subjects: it
// submits on fleet.t.acme.submit, finds the pool's stream by subject,
// follows the job's records on fleet.t.acme.job.<pool>.*.<id>, and reads
// its result by direct get of fleet.p.<pool>.r.acme.<id>. It cannot ask
// about another tenant's job. An operator reads the job's output with
// `nats object get`.
func TestAnOutsideClientFollowsAJob(t *testing.T) {
	bin := testenv.NatsCLI(t)
	f := startFleet(t)
	c := natsRunner{bin: bin, url: f.srv.url(), home: t.TempDir(), keys: f.keys}
	const id = "from-the-cli"

	// Follow the job's records before submitting it: the pool's stream
	// republishes each version on the tenant's subject.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	subs := f.srv.NumSubscriptions()
	var followed, followErr bytes.Buffer
	follow := c.cmd(ctx, roleTenant("acme"), "sub", "--raw", "--wait", "3s", "fleet.t.acme.job.gpu.*."+id)
	follow.Stdout, follow.Stderr = &followed, &followErr
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	for f.srv.NumSubscriptions() <= subs {
		if ctx.Err() != nil {
			t.Fatalf("nats sub did not subscribe: %s", followErr.Bytes())
		}
		time.Sleep(10 * time.Millisecond)
	}

	// An input uploaded beforehand, so that the job stores an output as
	// an object.
	ref, err := f.acme.Upload(ctx, "cli/in.bin", bytes.NewReader(bytes.Repeat([]byte("outside "), 40_000)))
	if err != nil {
		t.Fatal(err)
	}
	req, _ := json.Marshal(&job.Request{ID: id, Pool: "gpu", Command: []string{"files"}, Outputs: []string{"out.bin"},
		InputRefs: map[string]job.InputRef{"in.bin": *ref}})
	var reply job.SubmitReply
	if err := json.Unmarshal(c.run(t, roleTenant("acme"), "request", "--raw", "fleet.t.acme.submit", string(req)), &reply); err != nil ||
		reply.JobID != id || reply.Tenant != "acme" || reply.Pool != "gpu" || reply.Rejected() {
		t.Fatalf("submit: %+v, %v", reply, err)
	}

	// The pool's stream, found by subject (STREAM.NAMES with a subject
	// filter; `nats stream find` lists whole streams, which a tenant may not).
	found := strings.Fields(string(c.run(t, roleTenant("acme"), "stream", "ls", "--names", "--subject", "fleet.p.gpu.r.acme."+id)))
	if len(found) != 1 || found[0] != "FLEET_POOL_gpu" {
		t.Fatalf("stream ls --subject: %q", found)
	}

	// Every version of the record, live, until the final one.
	if err := follow.Wait(); err != nil {
		t.Fatalf("nats sub: %v\n%s", err, followErr.Bytes())
	}
	var states []job.State
	sc := bufio.NewScanner(&followed)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var rec job.Record
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("a record as republished: %q: %v", sc.Text(), err)
		}
		if rec.ID != id || rec.Tenant != "acme" {
			t.Fatalf("a record of another job: %+v", rec)
		}
		states = append(states, rec.State)
	}
	if len(states) < 3 || states[0] != job.StateQueued || states[len(states)-1] != job.StateSucceeded {
		t.Fatalf("followed states %v", states)
	}

	// The result, by direct get of its subject.
	var rec job.Record
	data := c.run(t, roleTenant("acme"), "request", "--raw", "$JS.API.DIRECT.GET."+found[0]+".fleet.p.gpu.r.acme."+id, "")
	if err := json.Unmarshal(data, &rec); err != nil || rec.Result == nil || rec.Result.Status != job.StatusSucceeded {
		t.Fatalf("the result by direct get: %q, %v", data, err)
	}
	out := rec.Result.Artifacts["out.bin"]

	// The result from the tenant's feed, which misses nothing: a consumer
	// a dispatcher makes on the tenant's request, pulled and acknowledged
	// with the CLI, then nothing left on it. The tenant may not make one.
	var fr job.FeedReply
	if err := json.Unmarshal(c.run(t, roleTenant("acme"), "request", "--raw", "fleet.t.acme.feed.cli", `{"pool": "gpu"}`), &fr); err != nil ||
		fr.Stream != "FLEET_FEED_acme" || fr.Consumer != "cli" || fr.Subject != "fleet.t.acme.job.gpu.>" {
		t.Fatalf("feed consumer: %+v, %v", fr, err)
	}
	next := c.run(t, roleTenant("acme"), "consumer", "next", fr.Stream, fr.Consumer, "--count", "1")
	if !strings.Contains(string(next), "fleet.t.acme.job.gpu.r."+id) || !strings.Contains(string(next), `"state":"succeeded"`) {
		t.Fatalf("nats consumer next: %s", next)
	}
	info := c.run(t, roleTenant("acme"), "consumer", "info", fr.Stream, fr.Consumer, "--json")
	var ci struct {
		NumPending    uint64 `json:"num_pending"`
		NumAckPending int    `json:"num_ack_pending"`
	}
	if err := json.Unmarshal(info, &ci); err != nil || ci.NumPending != 0 || ci.NumAckPending != 0 {
		t.Fatalf("nats consumer info: %s, %v", info, err)
	}
	var addErr bytes.Buffer
	add := c.cmd(ctx, roleTenant("acme"), "--timeout", "1s", "consumer", "add", fr.Stream, "mine", "--pull", "--defaults")
	add.Stderr = &addErr
	if out, err := add.Output(); err == nil || !strings.Contains(addErr.String(), "Permissions Violation") {
		t.Fatalf("nats consumer add by the tenant: %v: %s%s", err, out, addErr.Bytes())
	}
	refused(t, f.srv, nil, "$JS.API.CONSUMER.CREATE."+fr.Stream+".mine")
	f.srv.log.forget("$JS.API.CONSUMER.CREATE." + fr.Stream + ".mine")

	// Another tenant's job is not acme's to ask about.
	var stderr bytes.Buffer
	asked := c.cmd(ctx, roleTenant("acme"), "--timeout", "1s", "request", "fleet.t.default.status."+id, "")
	asked.Stderr = &stderr
	answer, _ := asked.Output()
	if !strings.Contains(stderr.String(), `Permissions Violation for Publish to "fleet.t.default.status.`+id+`"`) || len(answer) > 0 {
		t.Fatalf("acme asked about default's job: %q, %s", answer, stderr.Bytes())
	}
	refused(t, f.srv, nil, "fleet.t.default.status."+id)
	f.srv.log.forget("fleet.t.default.status." + id)

	// An operator reads the output as any object: the fleet's object
	// store format is the object store's own.
	file := filepath.Join(t.TempDir(), "out.bin")
	c.run(t, roleOperator, "object", "get", out.Bucket, out.Key, "--output", file, "--force")
	got, err := os.ReadFile(file)
	if err != nil || int64(len(got)) != out.Size || hexSHA256(got) != out.SHA256 {
		t.Fatalf("nats object get: %d bytes, %v; want %d bytes, SHA-256 %s", len(got), err, out.Size, out.SHA256)
	}
	f.noViolations(t)
}

func hexSHA256(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestAnOutsideClientFollowsARun: the nats CLI, with tenant acme's key and
// the shipped roles, submits a run of two nodes (the second, in another
// pool, taking the first's output as its input) on
// fleet.t.acme.runs.submit, follows it on fleet.t.acme.run.<run>.> until
// its end, and reads how it stands on fleet.t.acme.runs.status.<run> and
// its nodes' results by their job ids. An operator reads the stored end
// with `nats stream get FLEET_RUNS --last-for fleet.r.acme.<run>.end.1`,
// which the tenant may not (it reads the runs' stream through a
// dispatcher). Each answer and message it reads is valid as its schema
// says (run-answer.v1, run-record.v1). Tenant default's producer has no
// such run, and may neither ask about acme's nor hear it.
func TestAnOutsideClientFollowsARun(t *testing.T) {
	bin := testenv.NatsCLI(t)
	f := startFleet(t)
	c := natsRunner{bin: bin, url: f.srv.url(), home: t.TempDir(), keys: f.keys}
	acme := roleTenant("acme")
	const run = "from-the-cli"

	// Follow the run's messages before submitting it: the runs' stream
	// republishes each on the tenant's subject. Each message comes as a
	// JSON document with its subject, each ended by a NUL.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	subs := f.srv.NumSubscriptions()
	follow := c.cmd(ctx, acme, "sub", "--dump=-", "fleet.t.acme.run."+run+".>")
	var followErr bytes.Buffer
	follow.Stderr = &followErr
	stdout, err := follow.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	for f.srv.NumSubscriptions() <= subs {
		if ctx.Err() != nil {
			t.Fatalf("nats sub did not subscribe: %s", followErr.Bytes())
		}
		time.Sleep(10 * time.Millisecond)
	}

	req := `{"id":"` + run + `","nodes":[` +
		`{"id":"a","job":{"pool":"gpu","command":["ok"],"outputs":["out.txt"]}},` +
		`{"id":"b","after":["a"],"inputs_from":{"in.txt":{"node":"a","output":"out.txt"}},` +
		`"job":{"pool":"default","command":["copy"],"outputs":["out.txt"]}}]}`
	submitted := c.run(t, acme, "req", "--raw", "fleet.t.acme.runs.submit", req)
	schemaCheck(t, schemas.RunAnswer+"#/$defs/submit_reply")("the submission's reply", submitted)
	var reply job.RunSubmitReply
	if err := json.Unmarshal(submitted, &reply); err != nil ||
		reply.RunID != run || reply.Tenant != "acme" || reply.Nodes != 2 || reply.Duplicate || reply.Rejected() {
		t.Fatalf("submit: %+v, %v", reply, err)
	}

	// Every message of the run, live, until its end.
	var subjects []string
	var end job.RunEnd
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	sc.Split(func(data []byte, atEOF bool) (int, []byte, error) {
		if i := bytes.IndexByte(data, 0); i >= 0 {
			return i + 1, data[:i], nil
		}
		if atEOF && len(data) > 0 {
			return len(data), data, nil
		}
		return 0, nil, nil
	})
	for end.RunID == "" && sc.Scan() {
		var m struct {
			Subject string
			Data    []byte
		}
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("a message as nats sub dumps it: %q: %v", sc.Text(), err)
		}
		subjects = append(subjects, m.Subject)
		schemaCheck(t, schemas.RunRecord)(m.Subject, m.Data)
		if m.Subject == "fleet.t.acme.run."+run+".end.1" {
			if err := json.Unmarshal(m.Data, &end); err != nil {
				t.Fatalf("the end: %q: %v", m.Data, err)
			}
		}
	}
	_ = follow.Process.Kill()
	_ = follow.Wait()
	if end.RunID == "" {
		t.Fatalf("no end; heard %q (%v) %s", subjects, sc.Err(), followErr.Bytes())
	}
	slices.Sort(subjects)
	if want := []string{"fleet.t.acme.run." + run + ".def", "fleet.t.acme.run." + run + ".end.1",
		"fleet.t.acme.run." + run + ".node.default.b", "fleet.t.acme.run." + run + ".node.gpu.a"}; !slices.Equal(subjects, want) {
		t.Fatalf("heard %q, want %q", subjects, want)
	}
	want := []job.NodeState{
		{ID: "a", JobID: run + ":a", Pool: "gpu", State: job.StateSucceeded},
		{ID: "b", JobID: run + ":b", Pool: "default", State: job.StateSucceeded},
	}
	if end.Tenant != "acme" || end.Round != 1 || end.State != job.RunSucceeded || !slices.Equal(end.Nodes, want) {
		t.Fatalf("the run's end: %+v", end)
	}

	// How the run stands, and node b's result by its job id: a's output
	// was its input.
	status := c.run(t, acme, "req", "--raw", "fleet.t.acme.runs.status."+run, "")
	schemaCheck(t, schemas.RunAnswer+"#/$defs/view")("the run's status", status)
	var v job.RunView
	if err := json.Unmarshal(status, &v); err != nil ||
		v.State != job.RunSucceeded || len(v.Nodes) != 2 || v.Nodes[0].JobID != run+":a" || v.Nodes[1].JobID != run+":b" ||
		v.Nodes[0].State != job.StateSucceeded || v.Nodes[1].State != job.StateSucceeded {
		t.Fatalf("the run's status: %+v, %v", v, err)
	}
	// The tenant's runs, and a retry of a run that succeeded: nothing to
	// run again.
	var l job.RunList
	list := c.run(t, acme, "req", "--raw", "fleet.t.acme.runs.list", "")
	schemaCheck(t, schemas.RunAnswer+"#/$defs/list")("the runs list", list)
	if err := json.Unmarshal(list, &l); err != nil || !slices.Equal(l.Runs, []string{run}) {
		t.Fatalf("the runs list: %s, %v", list, err)
	}
	var rr job.RunReply
	retried := c.run(t, acme, "req", "--raw", "fleet.t.acme.runs.retry."+run, "")
	schemaCheck(t, schemas.RunAnswer+"#/$defs/reply")("the retry's reply", retried)
	if err := json.Unmarshal(retried, &rr); err != nil || rr.RunID != run || rr.Round != 1 || len(rr.Retried) != 0 {
		t.Fatalf("a retry of a run that succeeded: %s, %v", retried, err)
	}

	var rec job.Record
	data := c.run(t, acme, "req", "--raw", "$JS.API.DIRECT.GET.FLEET_POOL_default.fleet.p.default.r.acme."+run+":b", "")
	if err := json.Unmarshal(data, &rec); err != nil || rec.Result == nil || rec.Result.Outputs["out.txt"] != "hi" {
		t.Fatalf("node b's result by direct get: %q, %v", data, err)
	}

	// An operator reads the stored end from the runs' stream.
	var stored struct {
		Subject string `json:"subject"`
		Data    []byte `json:"data"`
	}
	data = c.run(t, roleOperator, "stream", "get", "FLEET_RUNS", "--last-for", "fleet.r.acme."+run+".end.1", "--json")
	var got job.RunEnd
	if err := json.Unmarshal(data, &stored); err != nil || stored.Subject != "fleet.r.acme."+run+".end.1" ||
		json.Unmarshal(stored.Data, &got) != nil || got.State != job.RunSucceeded || !slices.Equal(got.Nodes, want) {
		t.Fatalf("nats stream get as an operator: %s, %v", data, err)
	}
	// The tenant may not: the stream is every tenant's.
	var stderr bytes.Buffer
	get := c.cmd(ctx, acme, "--timeout", "2s", "stream", "get", "FLEET_RUNS", "--last-for", "fleet.r.acme."+run+".end.1", "--json")
	get.Stderr = &stderr
	if out, err := get.Output(); err == nil || !strings.Contains(stderr.String(), "Permissions Violation") {
		t.Fatalf("nats stream get as the tenant: %s, %v: %s", out, err, stderr.Bytes())
	}
	refused(t, f.srv, nil, "$JS.API.STREAM.INFO.FLEET_RUNS")
	f.srv.log.forget("$JS.API.STREAM.INFO.FLEET_RUNS")

	// Tenant default has no run of that id, may not ask about acme's,
	// nor hear it.
	var e job.ErrorReply
	notFound := c.run(t, roleProducer, "req", "--raw", "fleet.t.default.runs.status."+run, "")
	schemaCheck(t, schemas.RunAnswer+"#/$defs/error")("the answer about a run the tenant does not have", notFound)
	if err := json.Unmarshal(notFound, &e); err != nil || !e.NotFound {
		t.Fatalf("tenant default asked about its own run %s: %+v, %v", run, e, err)
	}
	for _, args := range [][]string{
		{"req", "fleet.t.acme.runs.status." + run, ""},
		{"sub", "--count", "1", "fleet.t.acme.run." + run + ".>"},
	} {
		subject := args[len(args)-1]
		verb := "Publish"
		if args[0] == "req" {
			subject = args[1]
		} else {
			verb = "Subscription"
		}
		stderr.Reset()
		cmd := c.cmd(ctx, roleProducer, append([]string{"--timeout", "2s"}, args...)...)
		cmd.Stderr = &stderr
		out, _ := cmd.Output()
		if !strings.Contains(stderr.String(), `Permissions Violation for `+verb+` to "`+subject+`"`) || len(out) > 0 {
			t.Fatalf("tenant default: nats %s: %q, %s", strings.Join(args, " "), out, stderr.Bytes())
		}
		refused(t, f.srv, nil, subject)
		f.srv.log.forget(subject)
	}
	f.noViolations(t)
}
