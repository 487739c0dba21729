package lifecycle

import (
	"context"
	"log/slog"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Backoff returns the fleet's wait between tries of something that must
// work eventually: first, then half as long again each time, randomized by
// a fifth, at most max. It never gives up by itself; ctx ends it.
func Backoff(ctx context.Context, first, max time.Duration) backoff.BackOff {
	b := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(first),
		backoff.WithMultiplier(1.5),
		backoff.WithRandomizationFactor(0.2),
		backoff.WithMaxInterval(max),
		backoff.WithMaxElapsedTime(0),
	)
	return backoff.WithContext(b, ctx)
}

// Retry runs op until it succeeds, returns a backoff.Permanent error, or b
// stops (its context ended): then it returns op's last error. The first
// failure is logged at warn level with what is being tried, later ones at
// debug level, so that a long outage costs one line.
func Retry(log *slog.Logger, what string, b backoff.BackOff, op func() error) error {
	tries := 0
	return backoff.RetryNotify(op, b, func(err error, wait time.Duration) {
		tries++
		if tries == 1 {
			log.Warn(what+" failed; trying again", "err", err, "in", wait.Round(time.Millisecond))
			return
		}
		log.Debug(what+" failed again", "err", err, "tries", tries, "in", wait.Round(time.Millisecond))
	})
}

// Again runs fn until ctx ends, and again each time it returns (a feed that
// broke off, a connection lost), waiting between runs from first up to
// max; a run that lasted longer than max starts the wait over. A run that
// ends with an error is logged: the first of a series at warn level, the
// rest at debug.
func Again(ctx context.Context, log *slog.Logger, what string, first, max time.Duration, fn func(context.Context) error) {
	b := Backoff(ctx, first, max)
	failures := 0
	for ctx.Err() == nil {
		began := time.Now()
		err := fn(ctx)
		if time.Since(began) > max {
			b.Reset()
			failures = 0
		}
		wait := b.NextBackOff()
		if err != nil && ctx.Err() == nil {
			if failures++; failures == 1 {
				log.Warn(what+" stopped; starting again", "err", err, "in", wait.Round(time.Millisecond))
			} else {
				log.Debug(what+" stopped again", "err", err, "failures", failures, "in", wait.Round(time.Millisecond))
			}
		}
		if wait == backoff.Stop {
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
}
