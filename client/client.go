// Package client is the Go client of a fleet, for producers and event
// consumers: submit a request, watch a job's events, wait for its result,
// cancel it.
//
//	nc, _ := nats.Connect(nats.DefaultURL)
//	c, _ := client.New(nc)
//	sub, err := c.Submit(ctx, &job.Request{Command: []string{"echo", "hi"}})
//	res, err := c.Result(ctx, sub.JobID)
//
// Everything goes through NATS; the client needs no other address.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"

	"github.com/fleet-dev/fleet/internal/artifact"
	"github.com/fleet-dev/fleet/internal/lifecycle"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// Client talks to a fleet over a NATS connection.
type Client struct {
	nc    *nats.Conn
	js    jetstream.JetStream
	names queue.Names
	store *queue.Store
	arts  *artifact.Store
	once  sync.Once // makes arts
}

// Option configures a Client.
type Option func(*Client) error

// ErrInvalidOption wraps errors of options.
var ErrInvalidOption = errors.New("invalid option")

// WithPrefix sets the fleet's subject prefix. Defaults to "fleet".
func WithPrefix(p string) Option {
	return func(c *Client) error {
		if p == "" {
			return fmt.Errorf("%w: empty prefix", ErrInvalidOption)
		}
		c.names.Prefix = p
		return nil
	}
}

// New returns a Client using nc.
func New(nc *nats.Conn, opts ...Option) (*Client, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	c := &Client{nc: nc, js: js, names: queue.Names{Prefix: queue.DefaultPrefix}}
	for _, o := range opts {
		if err := o(c); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// Submission is the dispatcher's answer to an accepted request.
type Submission = job.SubmitReply

// RejectedError is a request the dispatcher refused, with its reason.
type RejectedError struct {
	JobID  string
	Reason string
}

func (e *RejectedError) Error() string { return "rejected: " + e.Reason }

// Submit sends a request and returns the dispatcher's answer. A refused
// request is a *RejectedError. A request without an id is given one, so
// that it can be sent again safely (see SubmitJSON). Without a deadline on
// ctx it tries for 30 seconds.
func (c *Client) Submit(ctx context.Context, r *job.Request) (*Submission, error) {
	if r.ID == "" {
		r.ID = job.NewID()
	}
	data, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encode request: %w", err)
	}
	return c.SubmitJSON(ctx, data)
}

// SubmitJSON sends a request document as is, so that the dispatcher, not
// the client, judges it; only a missing id is added.
//
// A submission whose answer does not come (a timeout, no dispatcher
// answering while NATS elects a leader, a reconnect) is sent again with
// the same id until ctx ends: the job is submitted at least once, and the
// fleet runs one job, with one result, per id. When the first try had been
// taken, the answer says Duplicate. Without a deadline on ctx it tries for
// 30 seconds.
func (c *Client) SubmitJSON(ctx context.Context, data []byte) (*Submission, error) {
	ctx, cancel := withDefaultTimeout(ctx, 30*time.Second)
	defer cancel()
	// The producer's trace, if it has one, goes on into the fleet.
	msg := nats.NewMsg(c.names.SubmitDirect())
	msg.Data = withID(data)
	otel.GetTextMapPropagator().Inject(ctx, queue.HeaderCarrier(msg.Header))
	if len(msg.Header) == 0 {
		msg.Header = nil
	}
	var m *nats.Msg
	err := queue.Retry(ctx, func(ctx context.Context) (err error) {
		m, err = c.nc.RequestMsgWithContext(ctx, msg)
		return err
	}, nil)
	if err != nil {
		return nil, fmt.Errorf("submit: %w", err)
	}
	var reply job.SubmitReply
	if err := json.Unmarshal(m.Data, &reply); err != nil {
		return nil, fmt.Errorf("submit: unreadable answer: %w", err)
	}
	if reply.Rejected() {
		return nil, &RejectedError{JobID: reply.JobID, Reason: reply.Error}
	}
	return &reply, nil
}

// withID gives a request document without an id a new one. A document
// that is not a JSON object is left as it is, for the dispatcher to refuse.
func withID(data []byte) []byte {
	var doc map[string]json.RawMessage
	if json.Unmarshal(data, &doc) != nil || doc == nil {
		return data
	}
	if id, ok := doc["id"]; ok && string(id) != `""` && string(id) != "null" {
		return data
	}
	doc["id"], _ = json.Marshal(job.NewID())
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false) // the document stays the size it was, but for the id
	if enc.Encode(doc) != nil {
		return data
	}
	return bytes.TrimRight(out.Bytes(), "\n")
}

// Status is a job's record and, once it has one, its result.
type Status = job.StatusReply

// ErrNotFound means the fleet knows no job with that id.
var ErrNotFound = queue.ErrNotFound

// Status reads a job's state from the jobs bucket, and its result.
func (c *Client) Status(ctx context.Context, id string) (*Status, error) {
	store, err := c.bucket(ctx)
	if err != nil {
		return nil, err
	}
	s, _, err := store.Status(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("status of %s: %w", id, err)
	}
	return s, nil
}

func (c *Client) bucket(ctx context.Context) (*queue.Store, error) {
	if c.store != nil {
		return c.store, nil
	}
	store, err := queue.BindStore(ctx, c.js, c.names)
	if err != nil {
		return nil, err
	}
	c.store = store
	return store, nil
}

// Result waits for a job's result. It listens for the result as it is
// published and reads it directly from the results stream, again every two
// seconds, so that it rides through the loss of a NATS server: a result
// published while the client reconnects is read from the stream.
func (c *Client) Result(ctx context.Context, id string) (*job.Result, error) {
	if !job.ValidID(id) {
		return nil, fmt.Errorf("%w: %q is not a job id", ErrNotFound, id)
	}
	// Listen before the first read, so that no result falls in between.
	published := make(chan *nats.Msg, 4)
	sub, err := c.nc.ChanSubscribe(c.names.Results(id), published)
	if err != nil {
		return nil, fmt.Errorf("await result of %s: %w", id, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	// Between reads, a backoff up to two seconds: a result is usually
	// heard long before that.
	wait := lifecycle.Backoff(ctx, 250*time.Millisecond, 2*time.Second)
	var heard *nats.Msg
	for {
		gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		r, err := queue.LastResult(gctx, c.js, c.names, id)
		cancel()
		switch {
		case r != nil:
			return r, nil
		case heard != nil:
			// Published but not readable yet (a replica behind): the
			// stream takes the first result of a job and refuses others,
			// and the first published is the first heard.
			return job.DecodeResult(heard.Data)
		case err != nil && !retryable(ctx, err):
			return nil, fmt.Errorf("await result of %s: %w", id, err)
		}
		next := wait.NextBackOff()
		if next == backoff.Stop {
			return nil, ctx.Err()
		}
		select {
		case heard = <-published:
		case <-time.After(next):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// retryable reports an error that a NATS cluster electing a leader or
// losing a server causes, while ctx still runs.
func retryable(ctx context.Context, err error) bool {
	return ctx.Err() == nil && (errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, jetstream.ErrNoHeartbeat) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, jetstream.ErrJetStreamNotEnabled))
}

// Events yields a job's lifecycle events from the first, live, and ends
// after its final event (succeeded, failed, timed_out, cancelled or
// rejected), which is always a job's last. Stop early by breaking out of
// the loop or ending ctx.
func (c *Client) Events(ctx context.Context, id string) iter.Seq2[*job.Event, error] {
	return func(yield func(*job.Event, error) bool) {
		if !job.ValidID(id) {
			yield(nil, fmt.Errorf("%w: %q is not a job id", ErrNotFound, id))
			return
		}
		cons, err := c.js.OrderedConsumer(ctx, c.names.EventsStream(), jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{c.names.Events(id)},
		})
		if err != nil {
			yield(nil, fmt.Errorf("watch %s: %w", id, err))
			return
		}
		msgs, err := cons.Messages()
		if err != nil {
			yield(nil, fmt.Errorf("watch %s: %w", id, err))
			return
		}
		defer msgs.Stop()
		stop := context.AfterFunc(ctx, msgs.Stop)
		defer stop()
		for {
			m, err := msgs.Next()
			if err != nil {
				if ctx.Err() != nil {
					err = ctx.Err()
				}
				yield(nil, fmt.Errorf("watch %s: %w", id, err))
				return
			}
			e, err := job.DecodeEvent(m.Data())
			if err != nil {
				// Not ours to judge further: report it and go on.
				if !yield(nil, err) {
					return
				}
				continue
			}
			if !yield(e, nil) || e.Type.Final() {
				return
			}
		}
	}
}

// CancelReply says what a cancel did.
type CancelReply = job.CancelReply

// Cancel asks the dispatcher to cancel a job, in whatever state it is.
func (c *Client) Cancel(ctx context.Context, id string) (*CancelReply, error) {
	if !job.ValidID(id) {
		return nil, fmt.Errorf("%w: %q is not a job id", ErrNotFound, id)
	}
	ctx, cancel := withDefaultTimeout(ctx, 10*time.Second)
	defer cancel()
	m, err := c.nc.RequestWithContext(ctx, c.names.Cancel(id), nil)
	if err != nil {
		return nil, fmt.Errorf("cancel %s: %w", id, err)
	}
	var reply struct {
		job.CancelReply
		job.ErrorReply
	}
	if err := json.Unmarshal(m.Data, &reply); err != nil {
		return nil, fmt.Errorf("cancel %s: unreadable answer: %w", id, err)
	}
	if reply.NotFound {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if reply.Error != "" {
		return nil, fmt.Errorf("cancel %s: %s", id, reply.Error)
	}
	return &reply.CancelReply, nil
}

func withDefaultTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}
