package dispatcher

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/internal/scheduler"
	"github.com/fleet-dev/fleet/job"
)

// DefaultScheduleLease is how long the dispatcher that fires the schedules
// holds its lease without renewing it (Config.ScheduleLease): after a
// SIGKILL, the firings resume within it and a second.
const DefaultScheduleLease time.Duration = scheduler.DefaultLease

// schedulerSide is the dispatcher as its scheduler sees it
// (scheduler.Dispatcher): its firings are submitted, and the jobs of the
// previous ones read and cancelled, as a producer's would be.
type schedulerSide struct{ d *Dispatcher }

func (s schedulerSide) Submit(ctx context.Context, tenant string, data []byte) (*job.SubmitReply, error) {
	return s.d.Submit(ctx, tenant, data)
}

func (s schedulerSide) SubmitValid(ctx context.Context, tenant string, req *job.Request) (*job.SubmitReply, error) {
	return s.d.submitValid(ctx, tenant, req)
}

func (s schedulerSide) SubmitBatch(subs []scheduler.Submission, answered func(int, *job.SubmitReply, error)) {
	bs := make([]*batched, len(subs))
	for i, sub := range subs {
		bs[i] = &batched{ctx: sub.Ctx, tenant: sub.Tenant, req: sub.Req}
	}
	s.d.submitBatch(bs, func(b *batched) { answered(b.index, b.reply, b.err) })
}

func (s schedulerSide) Cancel(ctx context.Context, tenant, id string) (*job.CancelReply, error) {
	return s.d.Cancel(ctx, tenant, id)
}

func (s schedulerSide) LastState(ctx context.Context, k queue.JobKey) (job.State, bool, error) {
	return s.d.jobs.LastState(ctx, k)
}

func (s schedulerSide) OpenSecrets(k queue.JobKey, r *job.Request, sealed string) error {
	return s.d.sealer.Open(k, r, sealed)
}

// conflict reports whether a key-value write lost a compare-and-set.
func conflict(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)
}
