package queue_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/natstest"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// queuedVersion is the version of a record that queues job id, with a
// field of a later release and a request whose strings are not escaped.
func queuedVersion(id string) []byte {
	return []byte(`{"id": "` + id + `", "tenant": "acme", "pool": "default", "priority": 3, "state": "queued", "event": "queued",
		"attempt": 0, "max_attempts": 2, "submitted_at": "2026-12-01T09:30:00Z", "updated_at": "2026-12-01T09:30:00Z",
		"request": {"id": "` + id + `", "command": ["sh", "-c", "a && b < c"]}, "later": {"kept": true}}`)
}

// TestDeadLetterBodyCarriesTheFailure: the body is the queued version with
// the failure and attempts, all else as it was (a field Go does not know,
// the request's strings unescaped); it is a valid record.
func TestDeadLetterBodyCarriesTheFailure(t *testing.T) {
	f := &job.Failure{Class: job.ClassExecution, Code: job.CodeExitCode, Message: "exit status 3 & more"}
	body, err := queue.DeadLetterBody(queuedVersion("j1"), f, 2)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatal(err)
	}
	if string(doc["request"]) != `{"id":"j1","command":["sh","-c","a && b < c"]}` || string(doc["later"]) != `{"kept":true}` {
		t.Errorf("the queued version changed: %s", body)
	}
	delete(doc, "later")
	known, _ := json.Marshal(doc)
	rec, err := job.DecodeRecord(known)
	if err != nil {
		t.Fatalf("the dead letter is not a record: %v\n%s", err, known)
	}
	if rec.Failure == nil || *rec.Failure != *f || rec.Attempt != 2 || rec.State != job.StateQueued || rec.Request == nil {
		t.Errorf("dead letter: %+v", rec)
	}
	for _, bad := range []string{``, `[]`, `null`, `{`} {
		if _, err := queue.DeadLetterBody([]byte(bad), f, 1); err == nil {
			t.Errorf("a dead letter of %q", bad)
		}
	}
}

// TestDeadLettersOfBeforeAreRead: a dead letter with its failure in the
// body is read from the body; one of before, with its failure and
// attempts in headers only, from its headers.
func TestDeadLettersOfBeforeAreRead(t *testing.T) {
	s := natstest.Run(t)
	nc := s.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := queue.Config{}.WithDefaults()
	if err := queue.Setup(ctx, js, c, slog.Default()); err != nil {
		t.Fatal(err)
	}
	f := &job.Failure{Class: job.ClassTimeout, Code: job.CodeAttemptTimeout, Message: "ran over 1s"}

	old := nats.NewMsg(c.Names.DLQV2("default", "acme", "before"))
	old.Data = queuedVersion("before")
	old.Header.Set(queue.HeaderFailureClass, string(f.Class))
	old.Header.Set(queue.HeaderFailureCode, string(f.Code))
	old.Header.Set(queue.HeaderFailureMessage, f.Message)
	old.Header.Set(queue.HeaderAttempts, "3")
	// As the contract has it: the queued version with the failure and the
	// attempts, no header.
	now := nats.NewMsg(c.Names.DLQV2("default", "acme", "now"))
	now.Data = bytes.Replace(queuedVersion("now"), []byte(`"attempt": 0,`),
		[]byte(`"attempt": 2, "failure": {"class": "timeout", "code": "attempt_timeout", "message": "ran over 1s"},`), 1)
	for _, m := range []*nats.Msg{old, now} {
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	dls, err := queue.DeadLetters(ctx, js, c.Names, "acme", "default")
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 2 {
		t.Fatalf("%d dead letters, want 2", len(dls))
	}
	for i, want := range []struct {
		id       string
		attempts int
	}{{"before", 3}, {"now", 2}} {
		dl := dls[i]
		if dl.JobID != want.id || dl.Tenant != "acme" || dl.Pool != "default" || dl.Attempts != want.attempts ||
			dl.Failure != *f || dl.Request == nil {
			t.Errorf("dead letter %s: job %s/%s/%s, %d attempts, failure %+v, request %v", want.id,
				dl.Tenant, dl.Pool, dl.JobID, dl.Attempts, dl.Failure, dl.Request != nil)
		}
	}
}
