package worker

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// The completer is the worker's third stage: it stores the final versions
// of the jobs whose attempts ended well, and acknowledges their messages,
// many at a time. A delivery hands it the version it would write and waits;
// the completer sends what every delivery handed it meanwhile in one go
// (the writes share the connection's flushes and the stream's), reads the
// answers, acknowledges the messages of the versions stored (the acks
// leave together too), and tells each delivery how its own went.
//
// It changes nothing of what a final version is or guarantees: each is the
// same message the delivery would have sent alone (the compare-and-set on
// the revision its decision was made on, the final message id), and the
// stream judges each on its own. What the completer does not know stored,
// because the answer is a refusal, a duplicate, or late, it hands back: the
// delivery then writes that same version itself (settle's save), which
// sorts a moved record from a lost answer and a second final version from
// its own first. A message is acknowledged only once its final version is
// stored.
//
// It is a lifecycle.Service (Start, Stop) built from what it needs: the
// journal's SendRecord and the worker's metrics; the attempt stage
// sees it as completerStage, and hands it each final version as a finalVersion.
type completer struct {
	send  sender
	m     *metrics
	in    chan *completion
	batch []*completion
	done  chan struct{} // closed when run returns
}

// sender sends a version of a record without waiting (journal.SendRecord).
type sender interface {
	SendRecord(rec *job.Record, rev uint64) (answer, error)
}

// completerStage is the worker's third stage, as the worker starts and
// stops it and the attempt stage hands it its final versions.
type completerStage interface {
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
	// complete stores f.rec against f.rev and acknowledges f.msg, and
	// returns the revision stored; 0 when it did not do both, and refused
	// then says what the stream's answer said for sure: queue.ErrConflict
	// (the record moved), queue.ErrFinal (the job has a final version),
	// nil when nothing is known.
	complete(f finalVersion) (stored uint64, refused error)
}

// A finalVersion is one for the completer: the record to store,
// the revision it is written against, the message to acknowledge once it
// is stored, and the delivery's log.
type finalVersion struct {
	msg jetstream.Msg
	rec *job.Record
	rev uint64
	log func() *slog.Logger
}

// A completion is one final version handed to the completer.
type completion struct {
	finalVersion
	answer answer
	err    error
	stored uint64 // the new revision once stored; 0: not known stored
	// refused, when not stored, is what the stream's answer said for
	// sure: queue.ErrConflict (the record moved), queue.ErrFinal (the job
	// has a final version); nil when nothing is known.
	refused error
	done    chan struct{} // closed once the completer is through with it
}

// completeBatch is the most final versions the completer sends at once.
const completeBatch = 256

// newCompleter returns a completer for a worker of slots slots, sending
// through send; Start starts it.
func newCompleter(send sender, slots int, m *metrics) *completer {
	return &completer{send: send, m: m, in: make(chan *completion, slots),
		batch: make([]*completion, 0, completeBatch), done: make(chan struct{})}
}

// Start starts taking final versions, in the background.
func (c *completer) Start(context.Context) error {
	go c.run()
	return nil
}

// Stop waits, until ctx ends, for what was handed on to be through, once
// every delivery is (the handlers have returned: nothing hands on any
// more).
func (c *completer) Stop(ctx context.Context) error {
	close(c.in)
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("stop the completer: %w", context.Cause(ctx))
	}
}

func (c *completer) complete(f finalVersion) (stored uint64, refused error) {
	x := &completion{finalVersion: f, done: make(chan struct{})}
	c.in <- x
	<-x.done
	if x.stored == 0 {
		return 0, x.refused
	}
	return x.stored, nil
}

// run takes what the deliveries hand on, a batch at a time, until Stop.
func (c *completer) run() {
	defer close(c.done)
	for x := range c.in {
		c.batch = append(c.batch[:0], x)
	more:
		for len(c.batch) < cap(c.batch) {
			select {
			case y, ok := <-c.in:
				if !ok {
					break more
				}
				c.batch = append(c.batch, y)
			default:
				break more
			}
		}
		c.settle(c.batch)
		clear(c.batch)
	}
}

// settle sends the batch's final versions, reads their answers until
// firstAnswer has passed since they were sent, and acknowledges the
// messages of those stored.
func (c *completer) settle(batch []*completion) {
	for _, x := range batch {
		x.answer, x.err = c.send.SendRecord(x.rec, x.rev)
	}
	late := time.NewTimer(firstAnswer)
	defer late.Stop()
	expired := false
	for _, x := range batch {
		if x.err != nil {
			continue
		}
		if expired {
			// Those answered meanwhile are still taken.
			select {
			case ack := <-x.answer.Ok():
				x.took(ack.Sequence, ack.Duplicate)
			default:
			}
			continue
		}
		select {
		case ack := <-x.answer.Ok():
			x.took(ack.Sequence, ack.Duplicate)
		case err := <-x.answer.Err():
			if queue.IsWrongLastSequence(err) {
				x.refused = queue.ErrConflict
			}
		case <-late.C:
			expired = true
		}
	}
	alone := 0
	for _, x := range batch {
		if x.stored == 0 {
			alone++
		} else {
			if err := x.msg.Ack(); err != nil {
				// The version is stored: a redelivery finds the job
				// finished and acknowledges it.
				x.log().Warn("the ack of a finished job was not sent; it comes back and is acknowledged then", "err", err)
			}
		}
		close(x.done)
	}
	ctx, m := context.Background(), c.m
	m.batch.Record(ctx, int64(len(batch)), m.poolAttrs)
	if alone > 0 {
		m.alone.Add(ctx, int64(alone), m.poolAttrs)
	}
}

// took records the stream's acknowledgement: a version stored, or a
// duplicate of the job's final version, which only one was sent as.
func (x *completion) took(seq uint64, duplicate bool) {
	if duplicate {
		x.refused = queue.ErrFinal
		return
	}
	x.stored = seq
}

// firstAnswer is how long the completer waits for a batch's answers before
// it hands back those not answered: as long as a write's first try waits
// (queue's firstWrite), far longer than a write takes on a busy cluster.
const firstAnswer = 500 * time.Millisecond
