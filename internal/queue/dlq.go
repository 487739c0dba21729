package queue

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/job"
)

// DeadLetters reads the dead letters of pool and tenant, oldest first: an
// empty pool or tenant is every one. Messages that are not dead letters
// are skipped. A dead letter is the message that queued its job (contract
// v2), with the job's last failure and attempts: its request's secrets are
// sealed, and only a dispatcher can submit it again (see RetryDeadLetter).
func DeadLetters(ctx context.Context, js jetstream.JetStream, n Names, tenant, pool string) ([]*job.DeadLetter, error) {
	subject := n.prefix() + ".dlq." + cmp.Or(pool, "*") + "." + cmp.Or(tenant, "*") + ".>"
	var out []*job.DeadLetter
	err := readAll(ctx, js, n.DLQStream(), jetstream.ConsumerConfig{FilterSubjects: []string{subject}}, 256,
		func(m jetstream.Msg) error {
			if dl, err := decodeDeadLetter(m); err == nil {
				out = append(out, dl)
			}
			return nil
		})
	if err != nil {
		return nil, fmt.Errorf("dead letters: %w", err)
	}
	return out, nil
}

// DeadLetterBody is the body of a job's dead letter (contract v2): the
// version of its record that queued it, as its message carried it, with
// the job's last failure in failure and its attempts in attempt, as the
// job's final version has them (schema job-record.v2). What else the
// queued version holds is kept as it was (but for its spacing), fields
// this release does not know included.
func DeadLetterBody(queued []byte, f *job.Failure, attempts int) ([]byte, error) {
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(queued, &doc); err != nil {
		return nil, fmt.Errorf("dead letter: the queued version: %w", err)
	}
	if doc == nil {
		return nil, errors.New("dead letter: the queued version is not a record")
	}
	if f != nil {
		var err error
		if doc["failure"], err = json.Marshal(f); err != nil {
			return nil, fmt.Errorf("dead letter: %w", err)
		}
	}
	doc["attempt"] = json.RawMessage(strconv.Itoa(attempts))
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false) // the request's strings stay as they were
	if err := enc.Encode(doc); err != nil {
		return nil, fmt.Errorf("dead letter: %w", err)
	}
	return bytes.TrimRight(out.Bytes(), "\n"), nil
}

// DecodeDeadLetter reads a message of the dead-letter stream (contract
// v2): the message that queued its job, with its last failure and its
// attempts (see DeadLetterBody). A dead letter of before has them in its
// headers only, where they are read.
func DecodeDeadLetter(m jetstream.Msg) (*job.DeadLetter, error) { return decodeDeadLetter(m) }

func decodeDeadLetter(m jetstream.Msg) (*job.DeadLetter, error) {
	var rec job.Record
	if err := json.Unmarshal(m.Data(), &rec); err != nil {
		return nil, err
	}
	req := rec.Request
	if req == nil {
		return nil, errors.New("a dead letter without a request")
	}
	meta, err := m.Metadata()
	if err != nil {
		return nil, err
	}
	dl := &job.DeadLetter{JobID: rec.ID, Tenant: rec.Tenant, Pool: rec.Pool, Attempts: rec.Attempt, Secrets: rec.Secrets,
		Time: meta.Timestamp, Seq: meta.Sequence.Stream, Request: req, Document: m.Data()}
	if rec.Failure != nil {
		dl.Failure = *rec.Failure
		return dl, nil
	}
	h := m.Headers()
	dl.Attempts, _ = strconv.Atoi(h.Get(HeaderAttempts))
	dl.Failure = job.Failure{Class: job.FailureClass(h.Get(HeaderFailureClass)), Code: job.FailureCode(h.Get(HeaderFailureCode)),
		Message: h.Get(HeaderFailureMessage)}
	return dl, nil
}

// RetryDeadLetter submits the dead-lettered request of a tenant's job id
// again with submit, as a new job: the old id keeps its result and
// history, the new one is job.RetryID(id, n), n the first number not
// taken. sealer opens the request's secrets.
func RetryDeadLetter(ctx context.Context, js jetstream.JetStream, n Names, sealer *Sealer, tenant, id string,
	submit func(context.Context, []byte) (*job.SubmitReply, error)) (*job.SubmitReply, error) {
	all, err := DeadLetters(ctx, js, n, tenant, "")
	if err != nil {
		return nil, err
	}
	var dl *job.DeadLetter
	for _, d := range all {
		if d.JobID == id {
			dl = d // the latest wins
		}
	}
	if dl == nil {
		return nil, fmt.Errorf("%w: no dead letter for job %s", ErrNotFound, id)
	}
	if err := sealer.Open(JobKey{Tenant: dl.Tenant, Pool: dl.Pool, ID: dl.JobID}, dl.Request, dl.Secrets); err != nil {
		return nil, fmt.Errorf("dead letter of %s: %w", id, err)
	}
	for k := 1; k <= 1000; k++ {
		newID := job.RetryID(id, k)
		if !job.ValidID(newID) {
			return nil, fmt.Errorf("job id %s is too long to retry under a new id", id)
		}
		r := *dl.Request
		r.ID = newID
		data, err := json.Marshal(&r)
		if err != nil {
			return nil, err
		}
		reply, err := submit(ctx, data)
		if err != nil {
			return nil, err
		}
		if !reply.Duplicate {
			return reply, nil
		}
	}
	return nil, fmt.Errorf("job %s was retried too many times", id)
}
