package queue

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/job"
)

// DeadLetters reads the dead letters of pool, or of every pool when pool is
// empty, oldest first. Messages that are not dead letters are skipped.
func DeadLetters(ctx context.Context, js jetstream.JetStream, n Names, pool string) ([]*job.DeadLetter, error) {
	subject := n.AllDLQ()
	if pool != "" {
		subject = n.DLQ(pool)
	}
	cons, err := js.OrderedConsumer(ctx, n.DLQStream(), jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
	if err != nil {
		return nil, fmt.Errorf("dead letters: %w", err)
	}
	var out []*job.DeadLetter
	for {
		batch, err := cons.FetchNoWait(256)
		if err != nil {
			return nil, fmt.Errorf("dead letters: %w", err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			if dl, err := decodeDeadLetter(m); err == nil {
				out = append(out, dl)
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return nil, fmt.Errorf("dead letters: %w", err)
		}
		if got == 0 {
			return out, nil
		}
	}
}

func decodeDeadLetter(m jetstream.Msg) (*job.DeadLetter, error) {
	// The request passed the dispatcher's limits when it was submitted.
	req, err := job.DecodeRequest(m.Data(), job.Limits{MaxRequestBytes: math.MaxInt})
	if err != nil {
		return nil, err
	}
	meta, err := m.Metadata()
	if err != nil {
		return nil, err
	}
	h := m.Headers()
	attempts, _ := strconv.Atoi(h.Get(HeaderAttempts))
	return &job.DeadLetter{JobID: req.ID, Pool: req.Pool, Attempts: attempts, Time: meta.Timestamp, Seq: meta.Sequence.Stream,
		Failure: job.Failure{Class: job.FailureClass(h.Get(HeaderFailureClass)), Code: job.FailureCode(h.Get(HeaderFailureCode)),
			Message: h.Get(HeaderFailureMessage)},
		Request: req, Document: m.Data()}, nil
}

// RetryDeadLetter submits the dead-lettered request of job id again with
// submit, as a new job: the old id keeps its result and history, the new
// one is job.RetryID(id, n), n the first number not taken.
func RetryDeadLetter(ctx context.Context, js jetstream.JetStream, n Names, id string,
	submit func(context.Context, []byte) (*job.SubmitReply, error)) (*job.SubmitReply, error) {
	all, err := DeadLetters(ctx, js, n, "")
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
	for k := 1; k <= 1000; k++ {
		newID := job.RetryID(id, k)
		if !job.ValidID(newID) {
			return nil, fmt.Errorf("job id %s is too long to retry under a new id", id)
		}
		data, err := dl.Resubmission(newID)
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
