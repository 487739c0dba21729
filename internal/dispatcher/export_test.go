package dispatcher

import (
	"context"

	"github.com/fleet-dev/fleet/job"
)

// SubmitBatch submits reqs of tenant in one batch, as the scheduler does
// its firings, and returns each answer in order.
func (d *Dispatcher) SubmitBatch(ctx context.Context, tenant string, reqs []*job.Request) ([]*job.SubmitReply, []error) {
	subs := make([]*batched, len(reqs))
	for i, r := range reqs {
		subs[i] = &batched{ctx: ctx, tenant: tenant, req: r}
	}
	replies, errs := make([]*job.SubmitReply, len(reqs)), make([]error, len(reqs))
	answered := 0
	d.submitBatch(subs, func(b *batched) {
		replies[b.index], errs[b.index] = b.reply, b.err
		answered++
	})
	if answered != len(reqs) {
		panic("submitBatch returned before every request was answered")
	}
	return replies, errs
}

// ReconcileFeeds has every feed source every pool at once, as each
// dispatcher does every minute.
func (d *Dispatcher) ReconcileFeeds(ctx context.Context) { d.feeder.reconcile(ctx) }
