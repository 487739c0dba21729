package capacity

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric"

	"github.com/fleet-dev/fleet/internal/lifecycle"
	"github.com/fleet-dev/fleet/internal/telemetry"
)

// ErrUnavailable is the error of a call to Redis that was not sent: an
// earlier call found Redis unreachable, and no probe has had an answer
// since. It comes at once, without a network wait.
var ErrUnavailable = errors.New("redis is unavailable")

// Defaults of the Breaker's probe: the first comes this long after Redis
// was found unreachable, each later one half as long again after the last,
// at most ProbeMax apart.
const (
	DefaultProbeFirst = 50 * time.Millisecond
	DefaultProbeMax   = time.Second
)

// Breaker stands between the fleet and Redis, so that an outage costs one
// failed call and then nothing. While it is closed every call goes to
// Redis. The first call that fails for want of Redis (a refused or timed-out
// connection, a closed one, a Cluster or a Sentinel master that is down)
// opens it: from then on calls fail at once with ErrUnavailable, and one
// goroutine probes Redis in the background, with backoff (lifecycle.Backoff,
// DefaultProbeFirst then up to DefaultProbeMax apart), until it answers;
// then the breaker closes and the functions given to OnUp run. Errors that
// Redis itself answers (a missing key, NOSCRIPT, a script's error) leave it
// closed.
//
// A Store has one, shared by everything that uses the Store: the worker's
// ledger, the dispatcher's admission and reaper, the console.
type Breaker struct {
	probe      func(context.Context) error
	first, max time.Duration
	log        *slog.Logger

	mu     sync.Mutex
	open   bool
	since  time.Time
	cause  error
	ups    map[int]func()
	nextUp int
	prober *lifecycle.Runner
	closed bool
}

// newBreaker returns a closed breaker whose probe is probe, first probing
// after first and then at most every most (DefaultProbeFirst and
// DefaultProbeMax when zero).
func newBreaker(probe func(context.Context) error, first, most time.Duration, log *slog.Logger) *Breaker {
	if log == nil {
		log = slog.Default()
	}
	first = cmp.Or(first, DefaultProbeFirst)
	most = max(cmp.Or(most, DefaultProbeMax), first)
	return &Breaker{probe: probe, first: first, max: most, log: log.With("component", "capacity"),
		ups: map[int]func(){}}
}

// Up reports whether the breaker is closed: calls go to Redis.
func (b *Breaker) Up() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return !b.open
}

// Down returns when Redis was found unreachable and why, while the breaker
// is open; the zero time while it is closed.
func (b *Breaker) Down() (since time.Time, cause error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.open {
		return time.Time{}, nil
	}
	return b.since, b.cause
}

// OnUp adds fn, called (in the probe's goroutine) each time the breaker
// closes after an outage; the returned function removes it.
func (b *Breaker) OnUp(fn func()) (remove func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	id := b.nextUp
	b.nextUp++
	b.ups[id] = fn
	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		delete(b.ups, id)
	}
}

// allow returns nil while the breaker is closed, and an ErrUnavailable that
// says since when and why while it is open.
func (b *Breaker) allow() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.open {
		return nil
	}
	return &unavailableError{since: b.since, cause: b.cause}
}

// observe looks at the error of a call that went to Redis, and opens the
// breaker if it says Redis is away.
func (b *Breaker) observe(ctx context.Context, err error) {
	if !Outage(ctx, err) {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.open || b.closed {
		return
	}
	b.open, b.since, b.cause = true, time.Now(), err
	b.log.Debug("Redis is unreachable: calls to it fail at once until a probe gets an answer", "err", err)
	r := &lifecycle.Runner{}
	b.prober = r
	_ = r.Go(context.Background(), b.probeUntilUp)
}

// probeUntilUp probes Redis with backoff until it answers or ctx ends, and
// then closes the breaker. Each failed probe is logged at debug level: the
// users of the Store report the outage once, each in its own terms.
func (b *Breaker) probeUntilUp(ctx context.Context) error {
	tries := 0
	err := backoff.RetryNotify(func() error {
		pctx, cancel := context.WithTimeout(ctx, b.max)
		defer cancel()
		return b.probe(withProbe(pctx))
	}, lifecycle.Backoff(ctx, b.first, b.max), func(err error, wait time.Duration) {
		tries++
		b.log.Debug("Redis probe failed", "err", err, "tries", tries, "next_in", wait.Round(time.Millisecond))
	})
	if err != nil {
		return nil // stopped: the Store closed
	}
	b.mu.Lock()
	since := b.since
	b.open, b.cause, b.prober = false, nil, nil
	ups := make([]func(), 0, len(b.ups))
	for _, fn := range b.ups {
		ups = append(ups, fn)
	}
	b.mu.Unlock()
	b.log.Debug("Redis answers again", "down_for", time.Since(since).Round(time.Millisecond), "probes", tries+1)
	for _, fn := range ups {
		fn()
	}
	return nil
}

// stop ends the probe, if one runs, and keeps the breaker from opening
// again: the Store is closing.
func (b *Breaker) stop(ctx context.Context) {
	b.mu.Lock()
	b.closed = true
	r := b.prober
	b.mu.Unlock()
	if r != nil {
		_ = r.Stop(ctx)
	}
}

// unavailableError is ErrUnavailable with what opened the breaker.
type unavailableError struct {
	since time.Time
	cause error
}

func (e *unavailableError) Error() string {
	return fmt.Sprintf("redis is unavailable (unreachable for %s, not called): %v",
		time.Since(e.since).Round(time.Millisecond), e.cause)
}

func (e *unavailableError) Is(target error) bool { return target == ErrUnavailable }

// Outage reports whether err, the error of a call made with ctx, says that
// Redis is away rather than that it answered: any error but Redis' own
// replies (except those of a Cluster or a Sentinel-managed master that is
// down, or a server still loading its data), the caller's cancellation, and
// a closed client. A call whose deadline passed counts: Redis did not
// answer in time.
func Outage(ctx context.Context, err error) bool {
	switch {
	case err == nil, errors.Is(err, redis.Nil), errors.Is(err, redis.ErrClosed), errors.Is(err, ErrUnavailable):
		return false
	case errors.Is(err, context.Canceled) && ctx.Err() != nil:
		return false
	case redis.IsClusterDownError(err), redis.IsMasterDownError(err), redis.IsLoadingError(err), redis.IsReadOnlyError(err):
		return true
	}
	var re redis.Error
	if errors.As(err, &re) {
		// Redis answered. go-redis reports a cluster without a node for a
		// slot, or a dead slot owner, as its own (not Redis') errors.
		return strings.HasPrefix(re.Error(), "CLUSTERDOWN")
	}
	return true
}

type probeKey struct{}

// withProbe marks ctx as a probe's: the breaker lets it through.
func withProbe(ctx context.Context) context.Context { return context.WithValue(ctx, probeKey{}, true) }

func isProbe(ctx context.Context) bool { v, _ := ctx.Value(probeKey{}).(bool); return v }

// breakerHook puts the Breaker in front of every command and pipeline of a
// go-redis client.
type breakerHook struct{ b *Breaker }

func (h breakerHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h breakerHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !isProbe(ctx) {
			if err := h.b.allow(); err != nil {
				cmd.SetErr(err)
				return err
			}
		}
		err := next(ctx, cmd)
		h.b.observe(ctx, err)
		return err
	}
}

func (h breakerHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !isProbe(ctx) {
			if err := h.b.allow(); err != nil {
				for _, c := range cmds {
					c.SetErr(err)
				}
				return err
			}
		}
		err := next(ctx, cmds)
		seen := err
		if !Outage(ctx, seen) {
			// A pipeline returns its first failed command's error; a
			// Cluster's may fail on one node only, after a reply of
			// another.
			for _, c := range cmds {
				if Outage(ctx, c.Err()) {
					seen = c.Err()
					break
				}
			}
		}
		h.b.observe(ctx, seen)
		return err
	}
}

// observeUp reports the breaker's state as the gauge fleet.capacity.redis.up:
// 1 while calls go to Redis, 0 while it is away.
func (b *Breaker) observeUp() metric.Registration {
	m := telemetry.Meter()
	up, err := m.Int64ObservableGauge("fleet.capacity.redis.up",
		metric.WithDescription("1 while this process's capacity calls go to Redis, 0 while Redis is away and they fail at once"))
	if err != nil {
		return nil
	}
	reg, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		v := int64(0)
		if b.Up() {
			v = 1
		}
		o.ObserveInt64(up, v)
		return nil
	}, up)
	if err != nil {
		return nil
	}
	return reg
}

// WaitHistogram is fleet.capacity.redis.wait: how long a job waited on
// Redis for its capacity, once per call, by operation (op: reserve, holds
// and peers on the worker; admit on the dispatcher). While Redis is away it
// records zeros: nothing waits for it.
func WaitHistogram() metric.Float64Histogram {
	h, _ := telemetry.Meter().Float64Histogram("fleet.capacity.redis.wait", metric.WithUnit("s"),
		metric.WithDescription("Time a job waited on Redis for its capacity (a lease, whether another worker holds it, "+
			"the pool's images, admission), by operation"),
		metric.WithExplicitBucketBoundaries(0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2, 5))
	return h
}
