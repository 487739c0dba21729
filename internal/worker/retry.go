package worker

import (
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/fleet-dev/fleet/job"
)

// RetryDelayFunc returns how long to wait before the attempt after attempt
// n (counted from 1) failed.
type RetryDelayFunc func(p *job.RetryPolicy, n int) time.Duration

// BackoffDelay is the default RetryDelayFunc: exponential backoff from
// initial_backoff, multiplied by multiplier after each attempt, capped at
// max_backoff, then randomized by jitter: the delay after attempt n is a
// random value in [d*(1-jitter), d*(1+jitter)] where
// d = min(initial_backoff * multiplier^(n-1), max_backoff).
func BackoffDelay(p *job.RetryPolicy, n int) time.Duration {
	b := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(p.InitialBackoff.Std()),
		backoff.WithMultiplier(p.Multiplier),
		backoff.WithMaxInterval(p.MaxBackoff.Std()),
		backoff.WithRandomizationFactor(*p.Jitter),
		backoff.WithMaxElapsedTime(0),
	)
	d := b.NextBackOff()
	for i := 1; i < n; i++ {
		d = b.NextBackOff()
	}
	return d
}
