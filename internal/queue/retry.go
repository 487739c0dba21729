package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Setting up waits out a cluster that is electing leaders, one that is
// restarting a node, and a dispatcher that has not created the streams
// yet; it gives up at once on what waiting does not fix.
const (
	// firstCallTimeout bounds one JetStream API request. A request that
	// reaches the cluster while it has no meta leader is dropped, not
	// answered, so without a bound of its own it would wait for as long
	// as the caller's context, however soon a leader is elected.
	firstCallTimeout = time.Second
	// maxCallTimeout caps the bound, which grows after each timeout so
	// that a busy cluster still gets the time it needs.
	maxCallTimeout = 10 * time.Second
	// placementGrace is how long a stream that no servers can hold is
	// retried: long enough for a restarting node to come back, short
	// enough that a cluster smaller than the replicas fails clearly.
	placementGrace = time.Minute
	// quietWait is how long each try is logged, at info level; after it, a
	// warning is logged every logEvery.
	quietWait = 10 * time.Second
	logEvery  = 30 * time.Second
)

// kind is what retry does with an error.
type kind int

const (
	permanent kind = iota // give up
	transient             // wait and try again
	placement             // try again for placementGrace
)

// classify says whether an error of a JetStream API call goes away by
// waiting.
func classify(err error) kind {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout),
		errors.Is(err, nats.ErrNoResponders), errors.Is(err, nats.ErrDisconnected),
		errors.Is(err, nats.ErrConnectionReconnecting), errors.Is(err, nats.ErrReconnectBufExceeded),
		errors.Is(err, jetstream.ErrAsyncPublishTimeout), errors.Is(err, errUnsettled):
		// No answer: no meta or stream leader yet, or the connection is
		// between servers; or what was read is not settled yet.
		return transient
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		// The server or the account has no JetStream: a configuration to fix.
		return permanent
	case errors.Is(err, jetstream.ErrStreamNotFound), errors.Is(err, jetstream.ErrBucketNotFound):
		// Not created yet: a dispatcher creates the streams and buckets.
		return transient
	case errors.Is(err, jetstream.ErrStreamNameAlreadyInUse), errors.Is(err, jetstream.ErrConsumerExists):
		// Another process created it between our update and our create:
		// the next try updates it.
		return transient
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, jetstream.ErrNoHeartbeat):
		return transient
	case errors.As(err, &apiErr):
		switch apiErr.ErrorCode {
		case 10008, // JetStream system temporarily unavailable: no meta leader
			10009, // the server that got the request is not the leader
			10158: // a copy of this message is being stored: it will be, or not
			return transient
		case 10005, // no suitable peers for placement
			10023: // insufficient resources
			return placement
		}
	}
	return permanent
}

// retry runs op until it succeeds, ctx ends, or it fails for a reason that
// waiting will not fix: a permanent error, a permissions violation on the
// connection, or servers missing for longer than placementGrace. Each call
// of op gets its own deadline; while it waits, retry logs why, with
// exponential backoff between tries.
func retry(ctx context.Context, js jetstream.JetStream, log *slog.Logger, what string, op func(ctx context.Context) error) error {
	if log == nil {
		log = slog.Default()
	}
	nc := js.Conn()
	// A refused publish or subscribe is reported on the connection, not to
	// the request, which only times out: a violation that appears while we
	// wait means we are not allowed, and is final.
	seen := nc.LastError()
	timeout := firstCallTimeout
	start := time.Now()
	var last error
	var placing, logged time.Time
	b := backoff.WithContext(backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(100*time.Millisecond),
		backoff.WithMultiplier(2),
		backoff.WithRandomizationFactor(0.3),
		backoff.WithMaxInterval(5*time.Second),
		backoff.WithMaxElapsedTime(0)), ctx)
	err := backoff.RetryNotify(func() error {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		err := op(cctx)
		cancel()
		if err == nil {
			return nil
		}
		last = err
		if ctx.Err() != nil {
			return backoff.Permanent(err)
		}
		if denied := nc.LastError(); denied != seen && errors.Is(denied, nats.ErrPermissionViolation) {
			return backoff.Permanent(fmt.Errorf("%w (%w)", err, denied))
		}
		switch classify(err) {
		case permanent:
			return backoff.Permanent(err)
		case placement:
			if placing.IsZero() {
				placing = time.Now()
			} else if time.Since(placing) > placementGrace {
				return backoff.Permanent(fmt.Errorf("%w (for %s: are fewer JetStream servers up than the replicas asked for?)",
					err, placementGrace))
			}
		default:
			placing = time.Time{}
		}
		if errors.Is(err, context.DeadlineExceeded) {
			timeout = min(timeout*3/2, maxCallTimeout)
		}
		return err
	}, b, func(err error, next time.Duration) {
		// Every try while it is short; then a warning every 30s.
		level := slog.LevelInfo
		if waited := time.Since(start); waited > quietWait {
			if time.Since(logged) < logEvery {
				return
			}
			level = slog.LevelWarn
		}
		logged = time.Now()
		log.Log(ctx, level, "waiting for JetStream", "for", what, "err", err,
			"waited", time.Since(start).Round(time.Millisecond), "retry_in", next.Round(time.Millisecond))
	})
	if err != nil && ctx.Err() != nil && last != nil {
		return fmt.Errorf("%w; gave up after %s: %w", last, time.Since(start).Round(time.Millisecond), context.Cause(ctx))
	}
	return err
}
