package dispatcher

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/internal/telemetry"
	"github.com/fleet-dev/fleet/job"
)

// feedOf names a pool of a tenant's feed.
type feedOf struct{ tenant, pool string }

// ensureFeed makes sure tenant's feed sources pool before the first
// version of a job of the tenant in the pool is written, once per tenant
// and pool in this dispatcher's life. (A source added later would still
// copy what the pool's stream holds; added first, the feed never waits
// for it.)
func (d *Dispatcher) ensureFeed(ctx context.Context, tenant, pool string) error {
	if d.cfg.NoFeeds {
		return nil
	}
	k := feedOf{tenant, pool}
	if v, ok := d.feeds.Load(k); ok && v.(*poolSetup).done.Load() {
		return nil
	}
	v, _ := d.feeds.LoadOrStore(k, &poolSetup{})
	p := v.(*poolSetup)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done.Load() {
		return nil
	}
	if err := d.setUpFeed(ctx, tenant); err != nil {
		return err
	}
	p.done.Store(true)
	return nil
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
// (or empty): it makes the feed if the tenant has none yet, then the
// consumer. The tenant comes from the subject, which the NATS permissions
// confine to the producer's own.
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
