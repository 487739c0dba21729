package dispatcher

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// Contract v1, kept for one release behind --v1 (queue.Config.V1): v1
// producers submit on <prefix>.submit and <prefix>.submit.direct and cancel
// on <prefix>.cancel.<id>, as the default tenant; v1 consumers read
// <prefix>.events.<id>, <prefix>.results.<id> and the jobs bucket, which
// the bridge (bridge.go) writes from the v2 records.

// startV1 sets up what v1 producers use: the submit stream's intake, its
// replies, and the v1 subjects, added to subscribe (queue group) or
// subscribed here (every dispatcher hears the core copy of a submission).
func (d *Dispatcher) startV1(ctx context.Context, subscribe map[string]nats.MsgHandler, direct nats.MsgHandler) error {
	store, err := queue.NewStore(ctx, d.js, d.names, d.log)
	if err != nil {
		return err
	}
	d.store = store
	cons, err := queue.IntakeConsumer(ctx, d.js, d.cfg.Queue, d.log)
	if err != nil {
		return err
	}
	claims, err := queue.OpenBucket(ctx, d.js, d.names.IntakeBucket(), d.log)
	if err != nil {
		return err
	}
	d.replies.peers, d.replies.claim = d.peers.any, claimer(claims)
	// Every dispatcher sees the core copy of every request sent with a reply
	// subject; the one that processes its stream copy answers it.
	core, err := d.nc.Subscribe(d.names.Submit(), d.replies.onRequest)
	if err != nil {
		return fmt.Errorf("subscribe to %s: %w", d.names.Submit(), err)
	}
	d.subs = append(d.subs, core)
	subscribe[d.names.SubmitDirect()] = direct
	subscribe[d.names.AllCancels()] = d.onCancelV1
	msgs, err := cons.Messages(d.intakePull()...)
	if err != nil {
		return fmt.Errorf("consume %s: %w", d.names.SubmitStream(), err)
	}
	d.intakes = append(d.intakes, msgs)
	return d.startBridge(ctx)
}

// onCancelV1 serves v1 cancel requests, <prefix>.cancel.<id>, as the
// default tenant's.
func (d *Dispatcher) onCancelV1(m *nats.Msg) {
	d.answer(m, func(ctx context.Context) ([]byte, error) {
		r, err := d.Cancel(ctx, job.DefaultTenant, d.names.JobID(m.Subject))
		return d.replyOf(r, err, "cancel", m.Subject)
	})
}
