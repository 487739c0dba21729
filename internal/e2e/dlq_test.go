package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/schematest"
	"github.com/fleet-dev/fleet/internal/testenv"
	"github.com/fleet-dev/fleet/internal/worker"
	"github.com/fleet-dev/fleet/job"
	"github.com/fleet-dev/fleet/schemas"
)

// TestADeadLetterCarriesItsFailure: a client that is not the fleet's Go
// client, the nats CLI, reads an exhausted job's dead letter from
// FLEET_DLQ, with `nats stream get --last-for` and with a direct get, and
// the body it prints is one document, as the contract says: the version of
// the job's record that queued it (a valid job-record.v2, its env value
// sealed), with the job's last failure in failure and its attempts in
// attempt, those of its result. The Go client reads the same.
func TestADeadLetterCarriesItsFailure(t *testing.T) {
	bin := testenv.NatsCLI(t)
	f := fleettest.Start(t)
	f.Worker(t, processExec(t), worker.Config{Slots: 2})
	const id = "dead-end"
	f.Submit(t, &job.Request{ID: id, Command: []string{"sh", "-c", "echo broken >&2; exit 3"}, Env: map[string]string{"TOKEN": "s3cret"},
		Retry: &job.RetryPolicy{MaxAttempts: 2, InitialBackoff: dur(50 * time.Millisecond)}})
	r := f.Await(t, id, 30*time.Second)
	if r.Status != job.StatusFailed || r.Attempts != 2 || r.Failure == nil || r.Failure.Code != job.CodeExitCode {
		t.Fatalf("result: %s after %d attempts, %+v", r.Status, r.Attempts, r.Failure)
	}

	schema := schematest.Compile(t, schemas.JobRecordV2)
	subject := "fleet.dlq.default.default." + id
	for _, read := range []struct {
		name string
		args []string
	}{
		{"nats stream get", []string{"stream", "get", "FLEET_DLQ", "--last-for", subject}},
		{"a direct get", []string{"request", "--raw", "$JS.API.DIRECT.GET.FLEET_DLQ." + subject, ""}},
	} {
		args := read.args
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cmd := exec.CommandContext(ctx, bin, append([]string{"--server", f.NATS.URL(), "--timeout", "10s"}, args...)...)
		home := t.TempDir()
		cmd.Env = append(os.Environ(), "HOME="+home, "XDG_CONFIG_HOME="+home, "NATS_CONTEXT=")
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("nats %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		// The body is the one line that is a JSON document (stream get
		// prints the message's sequence and headers before it).
		var body []byte
		for line := range strings.Lines(string(out)) {
			if strings.HasPrefix(line, "{") {
				body = []byte(strings.TrimSpace(line))
			}
		}
		if body == nil {
			t.Fatalf("%s printed no document:\n%s", read.name, out)
		}
		if err := schematest.Validate(schema, body); err != nil {
			t.Errorf("%s: the dead letter is not a job-record.v2: %v\n%s", read.name, err, body)
		}
		var dl job.Record
		if err := json.Unmarshal(body, &dl); err != nil {
			t.Fatal(err)
		}
		if dl.ID != id || dl.Tenant != "default" || dl.Pool != "default" || dl.State != job.StateQueued || dl.Request == nil ||
			dl.Secrets == "" || bytes.Contains(body, []byte("s3cret")) {
			t.Errorf("%s: the dead letter is not the job's queued version:\n%s", read.name, body)
		}
		if dl.Failure == nil || *dl.Failure != *r.Failure || dl.Attempt != r.Attempts {
			t.Errorf("%s: the dead letter's failure %+v and attempt %d; the result's %+v and %d:\n%s",
				read.name, dl.Failure, dl.Attempt, r.Failure, r.Attempts, body)
		}
	}

	dls, err := f.Client.DeadLetters(context.Background(), "default")
	if err != nil || len(dls) != 1 || dls[0].JobID != id || dls[0].Attempts != r.Attempts || dls[0].Failure != *r.Failure {
		t.Fatalf("the Go client's dead letters: %+v, %v", dls, err)
	}
}
