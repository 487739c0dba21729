package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// DeadLetter is a request whose job ended failed or timed out, as the
// dead-letter stream keeps it.
type DeadLetter struct {
	JobID    string       `json:"job_id"`
	Pool     string       `json:"pool"`
	Attempts int          `json:"attempts"`
	Failure  job.Failure  `json:"failure"`
	Time     time.Time    `json:"time"`
	Seq      uint64       `json:"seq"`
	Request  *job.Request `json:"-"`
	raw      []byte
}

// DeadLetters lists the dead letters of pool, or of every pool when pool is
// empty, oldest first.
func (c *Client) DeadLetters(ctx context.Context, pool string) ([]*DeadLetter, error) {
	subject := c.names.AllDLQ()
	if pool != "" {
		subject = c.names.DLQ(pool)
	}
	cons, err := c.js.OrderedConsumer(ctx, c.names.DLQStream(), jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
	if err != nil {
		return nil, fmt.Errorf("dead letters: %w", err)
	}
	var out []*DeadLetter
	for {
		batch, err := cons.FetchNoWait(256)
		if err != nil {
			return nil, fmt.Errorf("dead letters: %w", err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			dl, err := decodeDeadLetter(m)
			if err != nil {
				continue // not one of ours
			}
			out = append(out, dl)
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return nil, fmt.Errorf("dead letters: %w", err)
		}
		if n == 0 {
			return out, nil
		}
	}
}

func decodeDeadLetter(m jetstream.Msg) (*DeadLetter, error) {
	req, err := job.DecodeRequest(m.Data(), job.Limits{MaxRequestBytes: math.MaxInt})
	if err != nil {
		return nil, err
	}
	meta, err := m.Metadata()
	if err != nil {
		return nil, err
	}
	h := m.Headers()
	attempts, _ := strconv.Atoi(h.Get(queue.HeaderAttempts))
	return &DeadLetter{JobID: req.ID, Pool: req.Pool, Attempts: attempts, Time: meta.Timestamp, Seq: meta.Sequence.Stream,
		Failure: job.Failure{Class: job.FailureClass(h.Get(queue.HeaderFailureClass)), Code: h.Get(queue.HeaderFailureCode),
			Message: h.Get(queue.HeaderFailureMessage)},
		Request: req, raw: m.Data()}, nil
}

// RetryDeadLetter submits the dead-lettered request of job id again, as a
// new job: the old id keeps its result and history, the new one is id with
// "-retry-N" appended, N the first number not taken.
func (c *Client) RetryDeadLetter(ctx context.Context, id string) (*Submission, error) {
	all, err := c.DeadLetters(ctx, "")
	if err != nil {
		return nil, err
	}
	var dl *DeadLetter
	for _, d := range all {
		if d.JobID == id {
			dl = d // the latest wins
		}
	}
	if dl == nil {
		return nil, fmt.Errorf("%w: no dead letter for job %s", ErrNotFound, id)
	}
	// Change only the id: the rest of the document, env included, is
	// submitted as it was.
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(dl.raw, &doc); err != nil {
		return nil, fmt.Errorf("dead letter of %s: %w", id, err)
	}
	for n := 1; n <= 1000; n++ {
		newID := fmt.Sprintf("%s-retry-%d", id, n)
		if len(newID) > 128 {
			return nil, fmt.Errorf("job id %s is too long to retry under a new id", id)
		}
		doc["id"], _ = json.Marshal(newID)
		data, err := json.Marshal(doc)
		if err != nil {
			return nil, err
		}
		sub, err := c.SubmitJSON(ctx, data)
		if err != nil {
			return nil, err
		}
		if !sub.Duplicate {
			return sub, nil
		}
	}
	return nil, fmt.Errorf("job %s was retried too many times", id)
}
