package client

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/lifecycle"
	"github.com/fleet-dev/fleet/job"
)

// FeedConsumer asks a dispatcher for the durable consumer name of the
// tenant's feed: the stream that keeps the final version (<prefix>.t.<tenant>.job.<pool>.r.<id>)
// and the rejection (….x.<id>) of every job of the tenant, which the
// tenant pulls with any JetStream client and acknowledges (the live
// copies of the same subjects are core NATS messages, which a subscriber
// may miss). r may be nil: the consumer then starts with the first message
// the feed holds. Asking again as before answers the same; a consumer of
// that name that exists otherwise, or a request the fleet cannot honour,
// is a *RejectedError.
func (c *Client) FeedConsumer(ctx context.Context, name string, r *job.FeedRequest) (*job.FeedReply, error) {
	if r == nil {
		r = &job.FeedRequest{}
	}
	if err := checkConsumerName(name); err != nil {
		return nil, err
	}
	if err := r.Validate(); err != nil {
		return nil, &RejectedError{Reason: fmt.Sprintf("feed consumer %s: %v", name, err)}
	}
	body, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("feed consumer %s: %w", name, err)
	}
	ctx, cancel := withDefaultTimeout(ctx, 10*time.Second)
	defer cancel()
	// Asked again alike, the same answer: sent again while none comes.
	m, err := c.ask(ctx, c.names.Request(c.tenant, "feed", name), body, sendAgain)
	if err != nil {
		return nil, fmt.Errorf("feed consumer %s: %w", name, err)
	}
	var e job.ErrorReply
	if json.Unmarshal(m.Data, &e) == nil && e.Error != "" {
		if e.Invalid {
			return nil, &RejectedError{Reason: e.Error}
		}
		return nil, fmt.Errorf("feed consumer %s: %s", name, e.Error)
	}
	var reply job.FeedReply
	if err := json.Unmarshal(m.Data, &reply); err != nil {
		return nil, fmt.Errorf("feed consumer %s: unreadable answer: %w", name, err)
	}
	return &reply, nil
}

// FeedEntry is one message of a tenant's feed: the final version of a job,
// or its rejection.
type FeedEntry struct {
	// Seq is the entry's sequence in the feed's stream: a consumer asked
	// for with StartSeq Seq+1 starts after it.
	Seq uint64
	// Time is when the feed stored it.
	Time time.Time
	// Subject is the entry's subject, <prefix>.t.<tenant>.job.<pool>.r.<id>
	// for a final version, ….x.<id> for a rejection.
	Subject string
	Record  *job.Record
	// Data is the record as the feed keeps it: its JSON document
	// (schema job-record.v2).
	Data []byte
	// Delivered counts the deliveries of the entry: above 1, an earlier
	// delivery was not acknowledged in time (or its acknowledgement was
	// lost on its way).
	Delivered uint64
	// Pending counts the entries the consumer held after this one when
	// it was delivered.
	Pending uint64
	msg     jetstream.Msg
}

// AckNoWait tells the feed the entry is taken, without waiting for the
// feed to store that: a reader that acknowledges each entry as it goes
// keeps up with a fleet of thousands of jobs a second, where Ack waits a
// round trip for each. An acknowledgement lost on its way (its server
// failing, the process killed with it unsent) delivers the entry again.
func (e *FeedEntry) AckNoWait() error {
	if err := e.msg.Ack(); err != nil {
		return fmt.Errorf("ack feed entry %d: %w", e.Seq, err)
	}
	return nil
}

// FeedOption changes how Feed reads.
type FeedOption func(*feedOptions)

type feedOptions struct{ untilCaughtUp bool }

// UntilCaughtUp ends Feed once it has yielded every entry the consumer
// held (when it has none, at once), rather than waiting for more.
func UntilCaughtUp() FeedOption { return func(o *feedOptions) { o.untilCaughtUp = true } }

// Ack tells the feed the entry is taken, and waits for the feed to say it
// stored that: once Ack returns nil, the consumer never delivers the entry
// again. An entry not acknowledged within the consumer's ack wait (30 s by
// default) is delivered again. Ack sends the acknowledgement again while
// no answer comes (the consumer's leader lost with it, another being
// elected), until ctx ends: the feed answers each copy once it stored the
// first.
func (e *FeedEntry) Ack(ctx context.Context) error {
	wait := lifecycle.Backoff(ctx, 100*time.Millisecond, time.Second)
	for {
		tctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := e.msg.DoubleAck(tctx)
		cancel()
		if err == nil || errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
			return nil
		}
		next := wait.NextBackOff()
		if next == backoff.Stop || ctx.Err() != nil {
			return fmt.Errorf("ack feed entry %d: %w", e.Seq, err)
		}
		select {
		case <-time.After(next):
		case <-ctx.Done():
			return fmt.Errorf("ack feed entry %d: %w", e.Seq, err)
		}
	}
}

// feedBatch is the most a pull of Feed asks for: entries pulled wait for
// the loop, and their ack wait runs meanwhile, so that a loop that takes
// a while over each would see the last of a large batch delivered again.
const feedBatch = 64

// Feed yields the entries of the tenant's durable feed consumer name. A
// consumer of that name that exists goes on where it is; when there is
// none, a dispatcher is asked to make it, as FeedConsumer does, starting
// where r says (r is only read then, and may be nil). Each
// entry is the next one the consumer has not had acknowledged: a process
// that acknowledges each entry it has taken (FeedEntry.Ack) and is
// restarted goes on from the first it had not, and misses none.
//
// Feed waits through what a NATS cluster's failures do (a server lost, a
// leader elected) and ends only when ctx ends, the loop breaks, or the
// consumer is refused or deleted, with the error.
func (c *Client) Feed(ctx context.Context, name string, r *job.FeedRequest, opts ...FeedOption) iter.Seq2[*FeedEntry, error] {
	var o feedOptions
	for _, opt := range opts {
		opt(&o)
	}
	return func(yield func(*FeedEntry, error) bool) {
		wait := lifecycle.Backoff(ctx, 250*time.Millisecond, 2*time.Second)
		pause := func() bool {
			next := wait.NextBackOff()
			if next == backoff.Stop {
				return false
			}
			select {
			case <-time.After(next):
				return true
			case <-ctx.Done():
				return false
			}
		}
		var cons jetstream.Consumer
		for cons == nil {
			var err error
			cons, err = c.feedConsumer(ctx, name, r)
			if err != nil && !c.feedRetryable(ctx, err) {
				yield(nil, err)
				return
			}
			if err != nil && !pause() {
				yield(nil, fmt.Errorf("feed %s: %w", name, cmp.Or(ctx.Err(), err)))
				return
			}
		}
		if o.untilCaughtUp && cons.CachedInfo().NumPending == 0 {
			return
		}
		wait.Reset()
		for {
			fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			batch, err := cons.Fetch(feedBatch, jetstream.FetchContext(fctx), jetstream.FetchHeartbeat(time.Second))
			if err == nil {
				n := 0
				for m := range batch.Messages() {
					n++
					e, err := c.feedEntry(m)
					if !yield(e, err) || (o.untilCaughtUp && e.Pending == 0) {
						cancel()
						return
					}
				}
				err = batch.Error()
				if n > 0 {
					wait.Reset()
				}
			}
			cancel()
			switch {
			case ctx.Err() != nil:
				yield(nil, fmt.Errorf("feed %s: %w", name, ctx.Err()))
				return
			case err == nil, errors.Is(err, nats.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
				continue // nothing new
			case errors.Is(err, jetstream.ErrConsumerDeleted), errors.Is(err, jetstream.ErrConsumerNotFound):
				// Deleted, or so it seemed to a server in an election.
				if _, err := c.js.Consumer(ctx, c.names.FeedStream(c.tenant), name); errors.Is(err, jetstream.ErrConsumerNotFound) {
					yield(nil, fmt.Errorf("feed %s: the consumer was deleted: %w", name, err))
					return
				}
			}
			// A server lost, a consumer's leader elected: pull again.
			if !pause() {
				yield(nil, fmt.Errorf("feed %s: %w", name, cmp.Or(ctx.Err(), err)))
				return
			}
		}
	}
}

// feedConsumer finds the tenant's feed consumer name, or has a dispatcher
// make it as r asks when there is none.
func (c *Client) feedConsumer(ctx context.Context, name string, r *job.FeedRequest) (jetstream.Consumer, error) {
	if err := checkConsumerName(name); err != nil {
		return nil, err
	}
	lctx, cancel := context.WithTimeout(ctx, tryWait)
	defer cancel()
	cons, err := c.js.Consumer(lctx, c.names.FeedStream(c.tenant), name)
	if err == nil || (!errors.Is(err, jetstream.ErrConsumerNotFound) && !errors.Is(err, jetstream.ErrStreamNotFound)) {
		return cons, err
	}
	reply, err := c.FeedConsumer(ctx, name, r)
	if err != nil {
		return nil, err
	}
	return c.js.Consumer(ctx, reply.Stream, reply.Consumer)
}

// feedRetryable reports an error of asking for a feed's consumer that a
// NATS cluster's failure causes.
func (c *Client) feedRetryable(ctx context.Context, err error) bool {
	var r *RejectedError
	return !errors.As(err, &r) && ctx.Err() == nil && !errors.Is(err, jetstream.ErrConsumerNotFound) &&
		!errors.Is(err, jetstream.ErrStreamNotFound) && !errors.Is(err, nats.ErrPermissionViolation) &&
		!errors.Is(err, nats.ErrAuthorization)
}

// feedEntry reads a message of a feed.
func (c *Client) feedEntry(m jetstream.Msg) (*FeedEntry, error) {
	e := &FeedEntry{Subject: m.Subject(), Data: m.Data(), msg: m}
	if md, err := m.Metadata(); err == nil {
		e.Seq, e.Time, e.Delivered, e.Pending = md.Sequence.Stream, md.Timestamp, md.NumDelivered, md.NumPending
	}
	rec, err := job.DecodeRecord(m.Data())
	if err != nil {
		return e, fmt.Errorf("feed entry %d (%s): %w", e.Seq, e.Subject, err)
	}
	e.Record = rec
	return e, nil
}

// DeleteFeedConsumer deletes the tenant's feed consumer name: what it had
// not had acknowledged is no longer kept for it.
func (c *Client) DeleteFeedConsumer(ctx context.Context, name string) error {
	if err := checkConsumerName(name); err != nil {
		return err
	}
	ctx, cancel := withDefaultTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.js.DeleteConsumer(ctx, c.names.FeedStream(c.tenant), name); err != nil {
		return fmt.Errorf("delete feed consumer %s: %w", name, err)
	}
	return nil
}

// checkConsumerName refuses a name no feed consumer may have.
func checkConsumerName(name string) error {
	if !job.ValidConsumerName(name) {
		return &RejectedError{Reason: fmt.Sprintf("feed consumer %q: a name is 1 to 64 characters of [A-Za-z0-9_-]", name)}
	}
	return nil
}
