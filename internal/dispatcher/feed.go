package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/fleet-dev/fleet/internal/lifecycle"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/internal/telemetry"
	"github.com/fleet-dev/fleet/job"
)

// feedOf names a pool of a tenant's feed.
type feedOf struct{ tenant, pool string }

// feedReconcileEvery is how often a dispatcher checks that every feed
// sources every pool: a dispatcher that died between a tenant's first
// job of a pool and adding the pool to the tenant's feed leaves it to
// the others.
const feedReconcileEvery = time.Minute

// feeder keeps the tenants' feeds sourcing the pools their jobs are in,
// in the background: a submission never waits on a feed, nor fails with
// it (a NATS cluster with a server down cannot place a new feed's
// replicas), and a source added late still copies what the pool's stream
// holds, from its first message.
type feeder struct {
	d    *Dispatcher
	done sync.Map // feedOf → struct{}: the feed sources the pool
	mu   sync.Mutex
	// wanted are the tenants whose feeds may lack a pool, and those pools:
	// a set, since every submission of a pool not yet done notes it.
	wanted map[string]map[string]bool
	wake   chan struct{}
	lifecycle.Runner
}

func newFeeder(d *Dispatcher) *feeder {
	return &feeder{d: d, wanted: map[string]map[string]bool{}, wake: make(chan struct{}, 1)}
}

// ensureFeed has tenant's feed source pool, soon, once per tenant and pool
// in this dispatcher's life: it is called before the first version of a
// job of the tenant in the pool is written, and returns at once.
func (d *Dispatcher) ensureFeed(tenant, pool string) {
	if d.cfg.NoFeeds {
		return
	}
	f := d.feeder
	if _, ok := f.done.Load(feedOf{tenant, pool}); ok {
		return
	}
	f.want(tenant, pool)
	f.poke()
}

func (f *feeder) want(tenant string, pools ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.wanted[tenant] == nil {
		f.wanted[tenant] = map[string]bool{}
	}
	for _, p := range pools {
		f.wanted[tenant][p] = true
	}
}

func (f *feeder) poke() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// Start runs the feeder until Stop.
func (f *feeder) Start(ctx context.Context) error { return f.Go(ctx, f.run) }

func (f *feeder) run(ctx context.Context) error {
	wait := lifecycle.Backoff(ctx, time.Second, 30*time.Second)
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	reconcile := time.NewTicker(feedReconcileEvery)
	defer reconcile.Stop()
	f.reconcile(ctx)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-reconcile.C:
			f.reconcile(ctx)
			continue
		case <-f.wake:
		case <-retry.C:
		}
		if f.catchUp(ctx) {
			wait.Reset()
			continue
		}
		next := wait.NextBackOff()
		if next == backoff.Stop {
			return nil
		}
		retry.Reset(next)
	}
}

// catchUp sets up the feeds of the tenants wanted, and reports whether
// every one was; those that were not are wanted still.
func (f *feeder) catchUp(ctx context.Context) bool {
	f.mu.Lock()
	wanted := f.wanted
	f.wanted = map[string]map[string]bool{}
	f.mu.Unlock()
	ok := true
	for tenant, pools := range wanted {
		cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		err := f.d.setUpFeed(cctx, tenant)
		cancel()
		if err != nil {
			ok = false
			names := slices.Sorted(maps.Keys(pools))
			f.d.log.Warn("the feed of a tenant lacks a pool its jobs are in; trying again", "tenant", tenant, "pools", names, "err", err)
			f.want(tenant, names...)
			continue
		}
		for p := range pools {
			f.done.Store(feedOf{tenant, p}, struct{}{})
		}
	}
	return ok
}

// reconcile has every feed source every pool.
func (f *feeder) reconcile(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, feedReconcileEvery/2)
	defer cancel()
	prefix := f.d.names.FeedStream("")
	names := f.d.js.StreamNames(ctx)
	var tenants []string
	for n := range names.Name() {
		if t, ok := strings.CutPrefix(n, prefix); ok && job.ValidTenant(t) {
			tenants = append(tenants, t)
		}
	}
	if err := names.Err(); err != nil {
		f.d.log.Debug("listing the feeds", "err", err)
	}
	for _, t := range tenants {
		if err := f.d.setUpFeed(ctx, t); err != nil {
			f.d.log.Debug("reconciling a feed", "tenant", t, "err", err)
		}
	}
}

// setUpFeed makes sure tenant's feed exists and sources every pool that
// has a stream.
func (d *Dispatcher) setUpFeed(ctx context.Context, tenant string) (err error) {
	ctx, end := telemetry.Step(ctx, "fleet.feed.ensure")
	trace.SpanFromContext(ctx).SetAttributes(attribute.String("fleet.tenant", tenant))
	defer func() { end(err) }()
	pools := func(ctx context.Context) ([]string, error) { return d.poolList(ctx, true) }
	if err := queue.EnsureFeed(ctx, d.js, d.cfg.Queue, tenant, pools, d.log); err != nil {
		return fmt.Errorf("the feed of tenant %s: %w", tenant, err)
	}
	return nil
}

// FeedConsumer answers a tenant's request for a durable consumer of its
// feed, <prefix>.t.<tenant>.feed.<name>, whose body is a job.FeedRequest
// (or empty): it makes the feed if the tenant has none yet, sourcing every
// pool, then the consumer. The tenant comes from the subject, which the
// NATS permissions confine to the producer's own.
func (d *Dispatcher) FeedConsumer(ctx context.Context, tenant, name string, body []byte) (*job.FeedReply, error) {
	if d.cfg.NoFeeds {
		return nil, fmt.Errorf("%w: this fleet keeps no feeds (the dispatchers run with --feeds=false)", errInvalid)
	}
	if !job.ValidTenant(tenant) {
		return nil, fmt.Errorf("%w: %q is not a tenant", errInvalid, tenant)
	}
	if !job.ValidConsumerName(name) {
		return nil, fmt.Errorf("%w: the consumer's name %q must be 1 to 64 characters of [A-Za-z0-9_-] (the last token of the subject)", errInvalid, name)
	}
	r, err := job.DecodeFeedRequest(body)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errInvalid, err)
	}
	if err := d.setUpFeed(ctx, tenant); err != nil {
		return nil, err
	}
	reply, err := queue.FeedConsumer(ctx, d.js, d.cfg.Queue, tenant, name, r)
	if errors.Is(err, queue.ErrFeedConsumerExists) {
		return nil, fmt.Errorf("%w: %v", errInvalid, err)
	}
	if err != nil {
		return nil, err
	}
	d.m.feedConsumers.Add(ctx, 1)
	d.log.Info("feed consumer made", "tenant", tenant, "consumer", name, "stream", reply.Stream)
	return reply, nil
}
