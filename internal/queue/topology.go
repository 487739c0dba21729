package queue

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Defaults of Config, and of the commands' flags.
const (
	DefaultReplicas        = 1
	DefaultRetention       = 7 * 24 * time.Hour
	DefaultDLQRetention    = 30 * 24 * time.Hour
	DefaultDuplicateWindow = 2 * time.Minute
	// DefaultAckWait is short, so that a job whose delivery was lost (with
	// the NATS node that carried it) runs within seconds; a running
	// attempt tells JetStream it is alive every third of it.
	DefaultAckWait       = 5 * time.Second
	DefaultMaxDeliver    = 300
	DefaultMaxAckPending = 20000
)

// Config describes the streams and consumers the fleet creates.
type Config struct {
	Names
	// Replicas of every stream. Defaults to DefaultReplicas (1); use 3 on
	// a cluster.
	Replicas int
	// MemoryStorage keeps streams in memory instead of files (tests).
	MemoryStorage bool
	// Retention is how long events, results and job states are kept.
	// Defaults to DefaultRetention (7 days).
	Retention time.Duration
	// DLQRetention is how long dead letters are kept. Defaults to
	// DefaultDLQRetention (30 days).
	DLQRetention time.Duration
	// DuplicateWindow is how long JetStream remembers message ids for
	// de-duplication. Defaults to DefaultDuplicateWindow (2 minutes).
	DuplicateWindow time.Duration
	// AckWait is how long a consumer waits for an ack or progress before
	// delivering a message again. Defaults to DefaultAckWait (5 seconds).
	AckWait time.Duration
	// MaxDeliver is a safety net above the largest max_attempts (deliveries
	// handed back by draining workers count too). Defaults to
	// DefaultMaxDeliver (300).
	MaxDeliver int
	// MaxAckPending bounds the unacknowledged messages of one pool.
	// Defaults to DefaultMaxAckPending (20000).
	MaxAckPending int
	// V1 keeps contract v1 working beside v2: its streams and bucket
	// (FLEET_SUBMIT, FLEET_RESULTS, fleet-jobs, fleet-intake) are set up,
	// and the dispatchers take v1 submissions and write v1 events, results
	// and records (see the dispatcher's bridge). Off by default in the
	// production profiles.
	V1 bool
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.Prefix = cmp.Or(c.Prefix, DefaultPrefix)
	c.Replicas = cmp.Or(c.Replicas, DefaultReplicas)
	c.Retention = cmp.Or(c.Retention, DefaultRetention)
	c.DLQRetention = cmp.Or(c.DLQRetention, DefaultDLQRetention)
	c.DuplicateWindow = cmp.Or(c.DuplicateWindow, DefaultDuplicateWindow)
	c.AckWait = cmp.Or(c.AckWait, DefaultAckWait)
	c.MaxDeliver = cmp.Or(c.MaxDeliver, DefaultMaxDeliver)
	c.MaxAckPending = cmp.Or(c.MaxAckPending, DefaultMaxAckPending)
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
	// Contract v2's stored submissions, for producers that do not wait
	// for an answer: a publish acknowledgement says it is kept.
	intake := base(c.IntakeStream(), "Submitted execution requests, until a dispatcher has taken them", c.AllIntake())
	intake.Retention = jetstream.WorkQueuePolicy
	intake.MaxAge = c.Retention

	// Heartbeat and log events; v1 also kept every lifecycle event here.
	events := base(c.EventsStream(), "Heartbeat and log events of every job", c.AllNotices())
	events.MaxAge = c.Retention
	events.AllowDirect = true

	dlq := base(c.DLQStream(), "Requests whose attempts are exhausted", c.AllDLQ())
	dlq.MaxAge = c.DLQRetention
	dlq.AllowDirect = true
	streams := []jetstream.StreamConfig{intake, events, dlq, c.RunsStream()}
	if !c.V1 {
		return streams
	}

	submit := base(c.SubmitStream(), "Submitted execution requests (contract v1), until a dispatcher has taken them", c.Submit())
	submit.Retention = jetstream.WorkQueuePolicy
	// The stream must not answer a publish with a reply subject: the
	// dispatcher answers with the job id instead (see dispatcher.Intake).
	submit.NoAck = true
	submit.MaxAge = c.Retention
	events.Subjects = append(events.Subjects, c.AllEvents())
	events.Description = "Heartbeat and log events of every job, and every lifecycle event of contract v1"
	streams[1] = events

	// Results are published on <prefix>.results-in.<id>, stored as
	// <prefix>.results.<id>, and only once stored republished there for
	// subscribers: a result the stream refuses (a second one, or one sent
	// again after its answer was lost) reaches no one.
	results := base(c.ResultsStream(), "The one final result of every job (contract v1)", c.AllResultsIn())
	results.SubjectTransform = &jetstream.SubjectTransformConfig{Source: c.AllResultsIn(), Destination: c.AllResults()}
	results.RePublish = &jetstream.RePublish{Source: c.AllResults(), Destination: c.AllResults()}
	results.MaxAge = c.Retention
	results.AllowDirect = true
	// One result per job, enforced by the server: a second is refused.
	results.MaxMsgsPerSubject = 1
	results.Discard = jetstream.DiscardNew
	results.DiscardNewPerSubject = true
	return append(streams, submit, results)
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

// Setup creates or updates the streams and the buckets (key-value and
// object stores). It is idempotent
// and safe to run from several dispatchers at once, and it waits (logging
// why to log) while the cluster elects its leaders; it fails at once on what
// waiting cannot fix, such as replicas a single server cannot hold, or
// permissions.
//
// The streams and buckets are set up at the same time, not one after the
// other: a cluster may leave unanswered a create that races an identical
// one from another process (the stream is created, but the answer is
// lost), and each such loss costs a call's deadline before the next try
// finds the stream. Dispatchers that start together race on every asset,
// so in parallel the fleet pays that once, not once per asset.
func Setup(ctx context.Context, js jetstream.JetStream, c Config, log *slog.Logger) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	run := func(f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil {
				mu.Lock()
				if first == nil {
					first = err
					cancel() // the others stop waiting
				}
				mu.Unlock()
			}
		}()
	}
	for _, sc := range c.Streams() {
		run(func() error {
			if err := retry(ctx, js, log, "stream "+sc.Name, func(ctx context.Context) error {
				_, err := ensureStream(ctx, js, sc)
				return err
			}); err != nil {
				return fmt.Errorf("create stream %s: %w", sc.Name, err)
			}
			return nil
		})
	}
	buckets := []jetstream.KeyValueConfig{c.PoolsKeyValue(), c.KeysKeyValue(), c.SchedulesKeyValue()}
	if c.V1 {
		buckets = append(buckets, c.KeyValue(), c.IntakeKeyValue())
	}
	for _, kv := range buckets {
		run(func() error {
			if err := retry(ctx, js, log, "bucket "+kv.Bucket, func(ctx context.Context) error {
				// Updated only when it exists with another
				// configuration (see ensureStream).
				_, err := js.CreateKeyValue(ctx, kv)
				if errors.Is(err, jetstream.ErrBucketExists) {
					_, err = js.UpdateKeyValue(ctx, kv)
				}
				return err
			}); err != nil {
				return fmt.Errorf("create bucket %s: %w", kv.Bucket, err)
			}
			return nil
		})
	}
	for _, oc := range c.ObjectStores() {
		run(func() error { return EnsureObjectStore(ctx, js, oc, log) })
	}
	wg.Wait()
	return first
}

// OpenBucket binds to a key-value bucket, waiting while it does not exist
// yet (a dispatcher creates it) or the cluster elects its leaders.
func OpenBucket(ctx context.Context, js jetstream.JetStream, bucket string, log *slog.Logger) (jetstream.KeyValue, error) {
	var kv jetstream.KeyValue
	err := retry(ctx, js, log, "bucket "+bucket, func(ctx context.Context) (err error) {
		kv, err = js.KeyValue(ctx, bucket)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", bucket, err)
	}
	return kv, nil
}

// PoolsKeyValue returns the configuration of the pools bucket: what
// operators set about each pool (paused or not), kept until changed.
func (c Config) PoolsKeyValue() jetstream.KeyValueConfig {
	c = c.WithDefaults()
	return jetstream.KeyValueConfig{
		Bucket:      c.PoolsBucket(),
		Description: "What operators set about each pool, by pool",
		History:     5,
		Storage:     c.storage(),
		Replicas:    c.Replicas,
	}
}

// SchedulesKeyValue returns the configuration of the schedules bucket:
// each schedule (spec.<tenant>.<name>), what its firings did
// (state.<tenant>.<name>), and the lease of the dispatcher that fires
// them (leader), kept until changed.
func (c Config) SchedulesKeyValue() jetstream.KeyValueConfig {
	c = c.WithDefaults()
	return jetstream.KeyValueConfig{
		Bucket:      c.SchedulesBucket(),
		Description: "Schedules, their firings, and the lease of the dispatcher that fires them",
		History:     1,
		Storage:     c.storage(),
		Replicas:    c.Replicas,
	}
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
// stream (contract v1), waiting as Setup does.
func IntakeConsumer(ctx context.Context, js jetstream.JetStream, c Config, log *slog.Logger) (jetstream.Consumer, error) {
	c = c.WithDefaults()
	return intakeConsumer(ctx, js, c, c.SubmitStream(), "Dispatchers validating submissions", log)
}

// IntakeConsumerV2 creates or updates the dispatchers' consumer on the
// intake stream (contract v2's stored submissions), waiting as Setup does.
func IntakeConsumerV2(ctx context.Context, js jetstream.JetStream, c Config, log *slog.Logger) (jetstream.Consumer, error) {
	c = c.WithDefaults()
	return intakeConsumer(ctx, js, c, c.IntakeStream(), "Dispatchers taking stored submissions", log)
}

// RunsConsumer creates or updates the dispatchers' consumer on the runs'
// stream, waiting as Setup does.
func RunsConsumer(ctx context.Context, js jetstream.JetStream, c Config, pinnedTTL time.Duration, log *slog.Logger) (jetstream.Consumer, error) {
	c = c.WithDefaults()
	cc := c.RunsConsumerConfig(pinnedTTL)
	var cons jetstream.Consumer
	err := retry(ctx, js, log, "consumer "+cc.Durable, func(ctx context.Context) (err error) {
		cons, err = bindConsumer(ctx, js, c.Names.RunsStream(), cc)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("create consumer %s on %s: %w", cc.Durable, c.Names.RunsStream(), err)
	}
	return cons, nil
}

func intakeConsumer(ctx context.Context, js jetstream.JetStream, c Config, stream, desc string, log *slog.Logger) (jetstream.Consumer, error) {
	cc := jetstream.ConsumerConfig{
		Durable:       c.Names.IntakeConsumer(),
		Description:   desc,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       c.AckWait,
		MaxDeliver:    -1,
		MaxAckPending: c.MaxAckPending,
	}
	var cons jetstream.Consumer
	err := retry(ctx, js, log, "consumer "+cc.Durable, func(ctx context.Context) (err error) {
		cons, err = bindConsumer(ctx, js, stream, cc)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("create consumer %s on %s: %w", cc.Durable, stream, err)
	}
	return cons, nil
}

// JobsStream returns the configuration of a pool's jobs stream: each pool
// has a stream of its own, so that on a cluster the pools' leaders spread
// over the servers (see the dispatcher's balancer) instead of one server
// leading every job.
func (c Config) JobsStream(pool string) jetstream.StreamConfig {
	c = c.WithDefaults()
	return jetstream.StreamConfig{
		Name: c.Names.JobsStream(pool), Description: "Accepted jobs of pool " + pool + ", until a worker finishes them",
		Subjects: []string{c.Jobs(pool)}, Retention: jetstream.WorkQueuePolicy, Discard: jetstream.DiscardOld,
		Storage: c.storage(), Replicas: c.Replicas, Duplicates: c.DuplicateWindow,
		MaxMsgs: -1, MaxBytes: -1, MaxMsgsPerSubject: -1, MaxConsumers: -1,
	}
}

// PoolStreamV2 returns the configuration of a pool's stream (contract v2):
// the versions of its jobs' records (see Jobs), kept for the retention,
// each republished once stored on its tenant's subject
// <prefix>.t.<tenant>.job.<pool>.<kind>.<id>, where the tenant's
// producers follow their jobs.
func (c Config) PoolStreamV2(pool string) jetstream.StreamConfig {
	c = c.WithDefaults()
	p := c.prefix()
	return jetstream.StreamConfig{
		Name: c.Names.PoolStreamV2(pool), Description: "Jobs of pool " + pool + " and every version of their records",
		Subjects: []string{c.PoolSubjects(pool)}, Retention: jetstream.LimitsPolicy, Discard: jetstream.DiscardOld,
		MaxAge: c.Retention, Storage: c.storage(), Replicas: c.Replicas, Duplicates: c.DuplicateWindow,
		MaxMsgs: -1, MaxBytes: -1, MaxMsgsPerSubject: -1, MaxConsumers: -1, AllowDirect: true,
		RePublish: &jetstream.RePublish{
			Source:      p + ".p." + pool + ".*.*.>",
			Destination: p + ".t.{{wildcard(2)}}.job." + pool + ".{{wildcard(1)}}.>",
		},
	}
}

// ensureStream creates a stream, and updates it only when it exists with
// another configuration. The servers answer a create of a stream that
// exists as asked with the stream, changing nothing, where an update is a
// change each time (on a cluster, one every server applies): a dispatcher
// that starts, or queues a pool's first job, leaves the streams alone
// unless their configuration changed.
func ensureStream(ctx context.Context, js jetstream.JetStream, sc jetstream.StreamConfig) (jetstream.Stream, error) {
	s, err := js.CreateStream(ctx, sc)
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return js.UpdateStream(ctx, sc)
	}
	return s, err
}

// EnsurePoolStream creates or updates a pool's stream and its artifacts
// bucket (what its workers store: see ArtifactsStore), waiting as Setup
// does. Dispatchers call it before they queue a pool's first job, so that
// a pool's bucket is there before any of its workers stores in it.
func EnsurePoolStream(ctx context.Context, js jetstream.JetStream, c Config, pool string, log *slog.Logger) (jetstream.Stream, error) {
	c = c.WithDefaults()
	sc := c.PoolStreamV2(pool)
	var stream jetstream.Stream
	err := retry(ctx, js, log, "stream "+sc.Name, func(ctx context.Context) (err error) {
		stream, err = ensureStream(ctx, js, sc)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("stream of pool %s: %w", pool, err)
	}
	if err := EnsureObjectStore(ctx, js, c.ArtifactsStore(pool), log); err != nil {
		return nil, fmt.Errorf("pool %s: %w", pool, err)
	}
	return stream, nil
}

// WorkerPoolStream makes sure a pool's stream exists before a worker
// binds to its queues, waiting as Setup does.
//
// A worker may start before any job of its pool was queued: then it
// creates the pool's stream, with the replicas of the fleet's events
// stream (which the dispatchers set up; a worker has no say in replicas),
// but never updates one.
func WorkerPoolStream(ctx context.Context, js jetstream.JetStream, c Config, pool string, log *slog.Logger) error {
	c = c.WithDefaults()
	sc := c.PoolStreamV2(pool)
	err := retry(ctx, js, log, "stream "+sc.Name, func(ctx context.Context) (err error) {
		if _, err = js.Stream(ctx, sc.Name); err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrStreamNotFound) {
			return err
		}
		events, err := js.Stream(ctx, c.Names.EventsStream())
		if err != nil {
			return err // no dispatcher has set the fleet up yet: wait
		}
		sc.Replicas = events.CachedInfo().Config.Replicas
		_, err = js.CreateStream(ctx, sc)
		return err
	})
	if err != nil {
		return fmt.Errorf("stream of pool %s: %w", pool, err)
	}
	return nil
}

// QueueKey names one queue of a pool: the jobs one tenant queued at one
// priority.
type QueueKey struct {
	Priority int
	Tenant   string
}

// QueueConsumer is the configuration of a queue's consumer. Its ack wait
// is the workers': the dispatcher that creates a queue for its first job
// takes it from the queues the pool already has, and every worker sets
// its own when it binds.
func (c Config) QueueConsumer(pool string, q QueueKey) jetstream.ConsumerConfig {
	c = c.WithDefaults()
	return jetstream.ConsumerConfig{
		Durable:       c.Names.QueueConsumer(q.Priority, q.Tenant),
		Description:   fmt.Sprintf("Workers of pool %s: tenant %s, priority %d", pool, q.Tenant, q.Priority),
		FilterSubject: c.PoolQueue(pool, q.Priority, q.Tenant),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       c.AckWait,
		MaxDeliver:    c.MaxDeliver,
		MaxAckPending: c.MaxAckPending,
		MaxWaiting:    4096,
		// With its stream's replicas, led by its stream's leader (see
		// Placed).
	}
}

// EnsureQueue creates the consumer of a pool's queue if it has none; a
// dispatcher calls it before it queues the first job of a tenant at a
// priority. It delivers from the start of the stream: the first job of
// the queue is never stored before its consumer exists, and a consumer
// deleted by hand finds again what was queued (a job already ended is
// acknowledged by the worker that reads its record). The ack wait is the
// dispatcher's until a worker binds with its own; a queue a worker has
// bound already is left as it is. One create, no listing: a listing of a
// stream's consumers may not answer while a server of the cluster is down.
func EnsureQueue(ctx context.Context, js jetstream.JetStream, c Config, pool string, q QueueKey) error {
	c = c.WithDefaults()
	_, err := js.CreateConsumer(ctx, c.Names.PoolStreamV2(pool), c.QueueConsumer(pool, q))
	if err != nil && !errors.Is(err, jetstream.ErrConsumerExists) {
		return fmt.Errorf("create queue %s of pool %s: %w", c.Names.QueueConsumer(q.Priority, q.Tenant), pool, err)
	}
	return nil
}

// BindQueue returns the consumer of a pool's queue, made with the worker's
// configuration if it has none, its ack wait and bounds set to the
// worker's if it has; its replicas and where it delivers from are left as
// they are.
func BindQueue(ctx context.Context, js jetstream.JetStream, c Config, pool string, q QueueKey) (jetstream.Consumer, error) {
	c = c.WithDefaults()
	cons, err := bindConsumer(ctx, js, c.Names.PoolStreamV2(pool), c.QueueConsumer(pool, q))
	if err != nil {
		return nil, fmt.Errorf("bind to queue %s of pool %s: %w", c.Names.QueueConsumer(q.Priority, q.Tenant), pool, err)
	}
	return cons, nil
}

// bindConsumer returns the durable consumer want names on stream: made as
// want says when there is none; else with want's ack wait, deliveries
// and bounds, and what the consumer has of the rest (its replicas, where it
// delivers from), which a placer or a remake may have changed.
func bindConsumer(ctx context.Context, js jetstream.JetStream, stream string, want jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	cons, err := js.Consumer(ctx, stream, want.Durable)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		cons, err = js.CreateConsumer(ctx, stream, want)
		if !errors.Is(err, jetstream.ErrConsumerExists) {
			return cons, err
		}
		cons, err = js.Consumer(ctx, stream, want.Durable) // another made it a moment ago
	}
	if err != nil {
		return nil, err
	}
	have := cons.CachedInfo().Config
	if have.AckWait == want.AckWait && have.MaxDeliver == want.MaxDeliver && have.MaxAckPending == want.MaxAckPending &&
		have.Description == want.Description {
		return cons, nil
	}
	have.AckWait, have.MaxDeliver, have.MaxAckPending, have.Description = want.AckWait, want.MaxDeliver, want.MaxAckPending, want.Description
	return js.UpdateConsumer(ctx, stream, have)
}

// Queues lists a pool's queues, with what their consumers last said of
// themselves (pending, delivered and not acknowledged).
func Queues(ctx context.Context, js jetstream.JetStream, c Config, pool string) (map[QueueKey]*jetstream.ConsumerInfo, error) {
	c = c.WithDefaults()
	out := map[QueueKey]*jetstream.ConsumerInfo{}
	st, err := js.Stream(ctx, c.Names.PoolStreamV2(pool))
	if err != nil {
		return nil, fmt.Errorf("queues of pool %s: %w", pool, err)
	}
	lister := st.ListConsumers(ctx)
	for info := range lister.Info() {
		if p, t, ok := c.Names.ParseQueueConsumer(info.Name); ok {
			out[QueueKey{p, t}] = info
		}
	}
	if err := lister.Err(); err != nil {
		return nil, fmt.Errorf("queues of pool %s: %w", pool, err)
	}
	return out, nil
}
