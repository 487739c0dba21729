package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Publishing through elections.
//
// On a cluster, a stream answers nothing while it elects a leader (no
// responders), and an answer can be lost with the node that would have
// sent it (a timeout) although the message was stored. Each of the fleet's
// own messages carries a message id, so sending it again is safe: a stream
// that already has it answers "duplicate" and does not store it twice.
// Publish sends it again promptly, rather than leaving the work it belongs
// to for the ack wait.

// A try of a publish waits for its answer firstTry at first: far longer
// than a quorum write takes on a busy cluster, and short enough that a
// publish sent while a stream elects its leader (it gets no answer), or
// lost with the server it went through, is sent again soon after. Each
// unanswered try gives the next one half as long again, up to lastTry: a
// longer wait would let an election end unnoticed.
const (
	firstTry = 500 * time.Millisecond
	lastTry  = 1500 * time.Millisecond
)

// AsyncPublishTimeout bounds the wait for the answer to an asynchronous
// publish of the fleet's processes: an answer lost with a server ends as
// jetstream.ErrAsyncPublishTimeout, which is ambiguous, and the message
// is sent again (see Await).
const AsyncPublishTimeout = 2 * time.Second

// errUnsettled says that what the fleet reads is not settled yet, and a
// moment later it will be: a step that meets it is tried again.
var errUnsettled = errors.New("not settled yet")

// Ambiguous reports whether a publish or a read failed in a way that
// leaves it unknown whether the stream stored the message, or that will
// pass: timeouts, no responders while a stream elects its leader, a
// connection that is reconnecting, a cluster that says it is not available
// now. It is what the fleet's setup waits out too (see classify).
func Ambiguous(err error) bool { return err != nil && classify(err) == transient }

// retrying returns the backoff of a step that must eventually succeed:
// quick at first, then at most every two seconds, until ctx ends.
func retrying(ctx context.Context) backoff.BackOff {
	b := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(50*time.Millisecond),
		backoff.WithMaxInterval(250*time.Millisecond),
		backoff.WithMaxElapsedTime(0),
	)
	return backoff.WithContext(b, ctx)
}

// Retry runs op until it succeeds, fails with an error Ambiguous does not
// accept, or ctx ends. Each try gets its own deadline (see firstTry), within
// ctx's. onRetry, if not nil, is told of each failure that is tried again.
// The first try costs nothing more than op: the backoff is set up only
// when it fails.
func Retry(ctx context.Context, op func(ctx context.Context) error, onRetry func(err error, wait time.Duration)) error {
	timeout := firstTry
	tries := 0
	b := &woken{BackOff: retrying(ctx)}
	try := func() error {
		tries++
		parent, stop := ctx, func() {}
		if tries > 1 {
			// Unanswered before: a stream's election, announced, wakes it.
			parent, stop = untilElected(ctx)
		}
		defer stop()
		tctx, cancel := context.WithTimeout(parent, timeout)
		defer cancel()
		err := op(tctx)
		if err != nil && ctx.Err() == nil && parent.Err() != nil {
			b.now = true // sent again at once
			return errWoken
		}
		if err != nil && (!Ambiguous(err) || ctx.Err() != nil) {
			return backoff.Permanent(err)
		}
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) {
			timeout = min(timeout*3/2, lastTry)
		}
		return err
	}
	err := try()
	var perm *backoff.PermanentError
	if err == nil || errors.As(err, &perm) {
		if perm != nil {
			return perm.Err
		}
		return nil
	}
	if onRetry != nil {
		onRetry(err, 0)
	}
	return backoff.RetryNotify(try, b, onRetry)
}

// errWoken is a try cut short by a stream's election: the next goes at
// once.
var errWoken = errors.New("a stream elected a leader")

// woken is a backoff that waits nothing after a try cut short by an
// election (see Retry).
type woken struct {
	backoff.BackOff
	now bool
}

// NextBackOff is the backoff's, but after a try an election cut short,
// when it is none.
func (w *woken) NextBackOff() time.Duration {
	if w.now {
		w.now = false
		return 0
	}
	return w.BackOff.NextBackOff()
}

// Publish stores m in its stream, sending it again while the answer is
// ambiguous (see Ambiguous) until ctx ends. m must carry a message id
// (Nats-Msg-Id), which makes a second copy a duplicate the stream drops.
// The answer is the last try's: Duplicate when a try whose answer was lost
// had stored m (m is stored once either way).
func Publish(ctx context.Context, js jetstream.JetStream, m *nats.Msg) (*jetstream.PubAck, error) {
	if m.Header.Get(HeaderMsgID) == "" {
		return nil, fmt.Errorf("publish %s: the message has no id, so it cannot be sent again safely", m.Subject)
	}
	var ack *jetstream.PubAck
	err := Retry(ctx, func(ctx context.Context) (err error) {
		ack, err = js.PublishMsg(ctx, m)
		return err
	}, nil)
	if err != nil {
		return nil, fmt.Errorf("publish %s: %w", m.Subject, err)
	}
	return ack, nil
}

// Await waits for an asynchronous publish; if it failed ambiguously, it
// publishes the message again with Publish.
func Await(ctx context.Context, js jetstream.JetStream, f jetstream.PubAckFuture) (*jetstream.PubAck, error) {
	select {
	case ack := <-f.Ok():
		return ack, nil
	case err := <-f.Err():
		if !Ambiguous(err) {
			return nil, fmt.Errorf("publish %s: %w", f.Msg().Subject, err)
		}
		return Publish(ctx, js, f.Msg())
	case <-ctx.Done():
		return nil, fmt.Errorf("publish %s: %w", f.Msg().Subject, ctx.Err())
	}
}
