package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Config describes the streams and consumers the fleet creates.
type Config struct {
	Names
	// Replicas of every stream. Defaults to 1; use 3 on a cluster.
	Replicas int
	// MemoryStorage keeps streams in memory instead of files (tests).
	MemoryStorage bool
	// Retention is how long events, results and job states are kept.
	// Defaults to 7 days.
	Retention time.Duration
	// DLQRetention is how long dead letters are kept. Defaults to 30 days.
	DLQRetention time.Duration
	// DuplicateWindow is how long JetStream remembers message ids for
	// de-duplication. Defaults to 2 minutes.
	DuplicateWindow time.Duration
	// AckWait is how long a pool's consumer waits for a worker's ack or
	// progress before redelivering. Defaults to 30 seconds.
	AckWait time.Duration
	// MaxDeliver is a safety net above the largest max_attempts (deliveries
	// handed back by draining workers count too). Defaults to 300.
	MaxDeliver int
	// MaxAckPending bounds the unacknowledged messages of one pool.
	// Defaults to 20000.
	MaxAckPending int
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.Retention == 0 {
		c.Retention = 7 * 24 * time.Hour
	}
	if c.DLQRetention == 0 {
		c.DLQRetention = 30 * 24 * time.Hour
	}
	if c.DuplicateWindow == 0 {
		c.DuplicateWindow = 2 * time.Minute
	}
	if c.AckWait == 0 {
		c.AckWait = 30 * time.Second
	}
	if c.MaxDeliver == 0 {
		c.MaxDeliver = 300
	}
	if c.MaxAckPending == 0 {
		c.MaxAckPending = 20000
	}
	return c
}

func (c Config) storage() jetstream.StorageType {
	if c.MemoryStorage {
		return jetstream.MemoryStorage
	}
	return jetstream.FileStorage
}

// Streams returns the configurations of the fleet's streams.
func (c Config) Streams() []jetstream.StreamConfig {
	c = c.WithDefaults()
	base := func(name, desc string, subjects ...string) jetstream.StreamConfig {
		return jetstream.StreamConfig{
			Name: name, Description: desc, Subjects: subjects,
			Storage: c.storage(), Replicas: c.Replicas, Duplicates: c.DuplicateWindow,
			Retention: jetstream.LimitsPolicy, Discard: jetstream.DiscardOld,
			MaxMsgs: -1, MaxBytes: -1, MaxMsgsPerSubject: -1, MaxConsumers: -1,
		}
	}
	submit := base(c.SubmitStream(), "Submitted execution requests, until a dispatcher has taken them", c.Submit())
	submit.Retention = jetstream.WorkQueuePolicy
	// The stream must not answer a publish with a reply subject: the
	// dispatcher answers with the job id instead (see dispatcher.Intake).
	submit.NoAck = true
	submit.MaxAge = c.Retention

	jobs := base(c.JobsStream(), "Accepted jobs, one subject per pool, until a worker finishes them", c.AllJobs())
	jobs.Retention = jetstream.WorkQueuePolicy

	events := base(c.EventsStream(), "Lifecycle events of every job", c.AllEvents())
	events.MaxAge = c.Retention
	events.AllowDirect = true

	results := base(c.ResultsStream(), "The one final result of every job", c.AllResults())
	results.MaxAge = c.Retention
	results.AllowDirect = true
	// One result per job, enforced by the server: a second is refused.
	results.MaxMsgsPerSubject = 1
	results.Discard = jetstream.DiscardNew
	results.DiscardNewPerSubject = true

	dlq := base(c.DLQStream(), "Requests whose attempts are exhausted", c.AllDLQ())
	dlq.MaxAge = c.DLQRetention
	dlq.AllowDirect = true

	return []jetstream.StreamConfig{submit, jobs, events, results, dlq}
}

// KeyValue returns the configuration of the job-state bucket.
func (c Config) KeyValue() jetstream.KeyValueConfig {
	c = c.WithDefaults()
	return jetstream.KeyValueConfig{
		Bucket:      c.Bucket(),
		Description: "Latest state of each job, by id",
		History:     1,
		TTL:         c.Retention,
		Storage:     c.storage(),
		Replicas:    c.Replicas,
	}
}

// Setup creates or updates the streams and the bucket. It is idempotent and
// safe to run from several dispatchers at once.
func Setup(ctx context.Context, js jetstream.JetStream, c Config) error {
	for _, sc := range c.Streams() {
		if err := retry(ctx, func() error {
			_, err := js.CreateOrUpdateStream(ctx, sc)
			return err
		}); err != nil {
			return fmt.Errorf("create stream %s: %w", sc.Name, err)
		}
	}
	for _, kv := range []jetstream.KeyValueConfig{c.KeyValue(), c.IntakeKeyValue()} {
		if err := retry(ctx, func() error {
			_, err := js.CreateOrUpdateKeyValue(ctx, kv)
			return err
		}); err != nil {
			return fmt.Errorf("create bucket %s: %w", kv.Bucket, err)
		}
	}
	return nil
}

// IntakeKeyValue returns the configuration of the dispatchers' claims
// bucket: small, in memory, each claim gone after two minutes.
func (c Config) IntakeKeyValue() jetstream.KeyValueConfig {
	c = c.WithDefaults()
	return jetstream.KeyValueConfig{
		Bucket:      c.IntakeBucket(),
		Description: "Dispatchers' claims on the reply subjects of requests",
		History:     1,
		TTL:         2 * time.Minute,
		Storage:     jetstream.MemoryStorage,
		Replicas:    c.Replicas,
	}
}

// IntakeConsumer creates or updates the dispatchers' consumer on the submit
// stream.
func IntakeConsumer(ctx context.Context, js jetstream.JetStream, c Config) (jetstream.Consumer, error) {
	c = c.WithDefaults()
	cc := jetstream.ConsumerConfig{
		Durable:       c.Names.IntakeConsumer(),
		Description:   "Dispatchers validating submissions",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       c.AckWait,
		MaxDeliver:    -1,
		MaxAckPending: c.MaxAckPending,
	}
	var cons jetstream.Consumer
	err := retry(ctx, func() (err error) {
		cons, err = js.CreateOrUpdateConsumer(ctx, c.SubmitStream(), cc)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("create consumer %s: %w", cc.Durable, err)
	}
	return cons, nil
}

// PoolConsumer creates or updates the consumer a pool's workers share.
func PoolConsumer(ctx context.Context, js jetstream.JetStream, c Config, pool string) (jetstream.Consumer, error) {
	c = c.WithDefaults()
	cc := jetstream.ConsumerConfig{
		Durable:       c.Names.PoolConsumer(pool),
		Description:   "Workers of pool " + pool,
		FilterSubject: c.Jobs(pool),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       c.AckWait,
		MaxDeliver:    c.MaxDeliver,
		MaxAckPending: c.MaxAckPending,
		MaxWaiting:    4096,
	}
	var cons jetstream.Consumer
	err := retry(ctx, func() (err error) {
		cons, err = js.CreateOrUpdateConsumer(ctx, c.JobsStream(), cc)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("create consumer %s: %w", cc.Durable, err)
	}
	return cons, nil
}

// retry runs op until it succeeds, the context ends, or it fails with an
// error other than a transient one (JetStream not ready yet, a concurrent
// update from another process).
func retry(ctx context.Context, op func() error) error {
	delay := 50 * time.Millisecond
	for {
		err := op()
		if err == nil || !transient(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(delay):
		}
		delay = min(2*delay, 2*time.Second)
	}
}

func transient(err error) bool {
	return errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) || errors.Is(err, jetstream.ErrConsumerExists) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, jetstream.ErrNoHeartbeat)
}
