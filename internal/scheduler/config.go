// Package scheduler fires the schedules of every tenant, from the one
// dispatcher that holds the schedules' lease. It follows the schedules in
// their key-value bucket, and makes each firing through the few calls of
// the dispatcher it needs (Dispatcher): submit, cancel, read a job's last
// state, open a template's sealed secrets. The schedules' API (create,
// change, delete) stays in the dispatcher; both agree on the bucket's keys
// through SpecKey and StateKey.
package scheduler

import (
	"context"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// Dispatcher is what the scheduler needs of the dispatcher it runs in.
type Dispatcher interface {
	// Submit submits a request of tenant as a producer sends it.
	Submit(ctx context.Context, tenant string, data []byte) (*job.SubmitReply, error)
	// SubmitValid is Submit of a request already decoded and validated
	// (job.DecodeRequest, Request.Validate): what is left is its admission
	// and its queue write. req is the caller's no more.
	SubmitValid(ctx context.Context, tenant string, req *job.Request) (*job.SubmitReply, error)
	// SubmitBatch is SubmitValid of many requests at once, whose writes
	// share the connection's and the stream's. Each answer goes to
	// answered with its index in subs, from one goroutine, before
	// SubmitBatch returns.
	SubmitBatch(subs []Submission, answered func(i int, reply *job.SubmitReply, err error))
	// Cancel cancels a job of tenant.
	Cancel(ctx context.Context, tenant, id string) (*job.CancelReply, error)
	// LastState is the state of a job's last version, and whether it is
	// final; queue.ErrNotFound when there is no such job.
	LastState(ctx context.Context, k queue.JobKey) (state job.State, final bool, err error)
	// OpenSecrets opens the secrets sealed for k into r.
	OpenSecrets(k queue.JobKey, r *job.Request, sealed string) error
}

// Submission is one request of a batch (Dispatcher.SubmitBatch).
type Submission struct {
	// Ctx is the request's own: its firing's span, the batch's deadline.
	Ctx    context.Context
	Tenant string
	Req    *job.Request
}

// Bucket is the part of the schedules' key-value bucket the scheduler
// uses; a jetstream.KeyValue is one.
type Bucket interface {
	Bucket() string
	Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error)
	Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error)
	Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error)
	Delete(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error
	Watch(ctx context.Context, keys string, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error)
}

// Publisher sends writes without waiting for their answers: the states
// of many firings are recorded at once as messages to the bucket's
// subjects, each with a compare-and-set on its subject's last revision. A
// jetstream.JetStream is one.
type Publisher interface {
	PublishMsgAsync(m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error)
}

// Config is what a Scheduler is made of.
type Config struct {
	Dispatcher Dispatcher
	// Bucket is the schedules' bucket: the schedules (SpecKey), what their
	// firings did (StateKey) and the lease; JetStream writes to it.
	Bucket    Bucket
	JetStream Publisher
	// Self names this dispatcher in the lease.
	Self string
	// Lease is how long the lease is held without being renewed. Defaults
	// to DefaultLease.
	Lease time.Duration
	// Limits bound the firings' requests. Defaults to job.DefaultLimits.
	Limits job.Limits
	// Now is the schedules' clock. Defaults to time.Now.
	Now func() time.Time
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Lease <= 0 {
		c.Lease = DefaultLease
	}
	c.Limits = c.Limits.WithDefaults()
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}
