package queue

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/job"
)

// A tenant's feed is a stream of its own, <PREFIX>_FEED_<tenant>, that
// keeps the final version and the rejection of every job of the tenant, in
// every pool, on the subjects the pools' streams republish them on live:
// <prefix>.t.<tenant>.job.<pool>.r.<id> and ….x.<id>. The live copies are
// core NATS messages, which a subscriber misses while it is away or while
// its server fails over; the feed is read with a JetStream consumer, from
// where it left off.
//
// The feed has no subjects of its own: nothing can publish into it. It
// sources each pool's stream, taking only the tenant's final versions and
// rejections and giving them their live subject; the servers copy each
// once, in order, through failures of either side, and a source added
// late starts from the first message the pool's stream still holds. Its
// consumers are the dispatchers' to create (on the tenant's request, see
// FeedConsumer); the tenant pulls and acknowledges them.

// FeedStream is the name of a tenant's feed stream.
func (n Names) FeedStream(tenant string) string { return n.stream("FEED_" + tenant) }

// FeedSubjects matches every message of a tenant's feed; FeedPoolSubjects
// those of one pool.
func (n Names) FeedSubjects(tenant string) string { return n.prefix() + ".t." + tenant + ".job.>" }

// FeedPoolSubjects matches the messages of one pool in a tenant's feed.
func (n Names) FeedPoolSubjects(tenant, pool string) string {
	return n.prefix() + ".t." + tenant + ".job." + pool + ".>"
}

// feedKinds are the versions a feed keeps: the final one, and a rejection.
var feedKinds = []string{KindResult, KindRejected}

// feedSource is how a tenant's feed sources one pool's stream.
func (c Config) feedSource(tenant, pool string) *jetstream.StreamSource {
	s := &jetstream.StreamSource{Name: c.Names.PoolStreamV2(pool)}
	for _, kind := range feedKinds {
		s.SubjectTransforms = append(s.SubjectTransforms, jetstream.SubjectTransformConfig{
			Source:      c.prefix() + ".p." + pool + "." + kind + "." + tenant + ".>",
			Destination: c.JobLive(tenant, pool, kind, ">"),
		})
	}
	return s
}

// FeedStreamConfig is the configuration of tenant's feed, sourcing the
// streams of pools.
func (c Config) FeedStreamConfig(tenant string, pools []string) jetstream.StreamConfig {
	c = c.WithDefaults()
	sc := jetstream.StreamConfig{
		Name:        c.FeedStream(tenant),
		Description: "Final versions and rejections of tenant " + tenant + "'s jobs, in every pool",
		Retention:   jetstream.LimitsPolicy, Discard: jetstream.DiscardOld, MaxAge: c.Retention,
		Storage: c.storage(), Replicas: c.Replicas, Duplicates: c.DuplicateWindow,
		MaxMsgs: -1, MaxBytes: -1, MaxMsgsPerSubject: -1, MaxConsumers: -1, AllowDirect: true,
	}
	for _, p := range slices.Sorted(slices.Values(pools)) {
		sc.Sources = append(sc.Sources, c.feedSource(tenant, p))
	}
	return sc
}

// EnsureFeed makes sure tenant's feed exists and sources every pool that
// pools lists. It never removes a source.
//
// Dispatchers add sources concurrently, and a stream's update replaces
// its whole configuration: one that read the configuration before
// another's update may write it back without the other's pool. So each
// update is followed by a fresh listing of the pools and a fresh read of
// the feed, until the feed holds every pool listed. A pool whose stream
// exists before EnsureFeed is called is in every listing after, so the
// last writer's check sees it, and puts it back if it was lost; the
// servers start a source put back where it left off.
func EnsureFeed(ctx context.Context, js jetstream.JetStream, c Config, tenant string, pools func(context.Context) ([]string, error), log *slog.Logger) error {
	c = c.WithDefaults()
	name := c.FeedStream(tenant)
	return retry(ctx, js, log, "stream "+name, func(ctx context.Context) error {
		for range 10 {
			want, err := pools(ctx)
			if err != nil {
				return err
			}
			s, err := js.Stream(ctx, name)
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				if _, err := js.CreateStream(ctx, c.FeedStreamConfig(tenant, want)); err != nil &&
					!errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) && !raced(err) {
					return err
				}
				continue
			}
			if err != nil {
				return err
			}
			have := feedPools(c, s.CachedInfo().Config.Sources)
			missing := false
			for _, p := range want {
				if !slices.Contains(have, p) {
					have, missing = append(have, p), true
				}
			}
			if !missing {
				return nil
			}
			sc := s.CachedInfo().Config
			sc.Sources = c.FeedStreamConfig(tenant, have).Sources
			if _, err := js.UpdateStream(ctx, sc); err != nil && !raced(err) {
				return err
			}
		}
		return fmt.Errorf("the feed of tenant %s: its sources changed under every update of ten", tenant)
	})
}

// raced reports an answer to a create or an update of a feed that shows
// another's update: the server answers with the stream's configuration
// as it is when it answers, and nats.go takes sources other than those
// it asked for for a server that cannot source. The next read tells.
func raced(err error) bool {
	return errors.Is(err, jetstream.ErrStreamSourceNotSupported) ||
		errors.Is(err, jetstream.ErrStreamSourceMultipleFilterSubjectsNotSupported)
}

// feedPools are the pools a feed's sources name.
func feedPools(c Config, sources []*jetstream.StreamSource) []string {
	var pools []string
	prefix := c.Names.PoolStreamV2("")
	for _, s := range sources {
		if p, ok := cutPrefix(s.Name, prefix); ok && p != "" {
			pools = append(pools, p)
		}
	}
	return pools
}

// ErrFeedConsumerExists is a feed consumer asked for that exists with
// another configuration.
var ErrFeedConsumerExists = errors.New("the consumer exists with another configuration: delete it first")

// FeedConsumerConfig is the configuration of the durable consumer name of
// tenant's feed that r asks for: pulled, each message acknowledged.
func (c Config) FeedConsumerConfig(tenant, name string, r *job.FeedRequest) jetstream.ConsumerConfig {
	cc := jetstream.ConsumerConfig{
		Durable: name, Description: "A consumer of tenant " + tenant + "'s feed, asked for by the tenant",
		AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: -1,
		AckWait:       cmp.Or(r.AckWait.Std(), job.DefaultFeedAckWait),
		MaxAckPending: cmp.Or(r.MaxAckPending, job.DefaultFeedMaxAckPending),
		DeliverPolicy: jetstream.DeliverAllPolicy, InactiveThreshold: r.Inactive.Std(),
	}
	switch {
	case r.From == "new":
		cc.DeliverPolicy = jetstream.DeliverNewPolicy
	case r.StartSeq > 0:
		cc.DeliverPolicy, cc.OptStartSeq = jetstream.DeliverByStartSequencePolicy, r.StartSeq
	case r.StartTime != nil:
		t := r.StartTime.UTC()
		cc.DeliverPolicy, cc.OptStartTime = jetstream.DeliverByStartTimePolicy, &t
	}
	cc.FilterSubject = c.feedFilter(tenant, r.Pool)
	return cc
}

// feedFilter is what a feed consumer of pool keeps: every subject of the
// feed, or those of pool. (One filter, so that the consumer's create
// request names it in its subject, where a permission can confine it.)
func (c Config) feedFilter(tenant, pool string) string {
	if pool == "" {
		return c.FeedSubjects(tenant)
	}
	return c.FeedPoolSubjects(tenant, pool)
}

// FeedConsumer creates the durable consumer name of tenant's feed as r
// asks, or finds it so: ErrFeedConsumerExists if it exists otherwise.
// The feed must exist (EnsureFeed).
func FeedConsumer(ctx context.Context, js jetstream.JetStream, c Config, tenant, name string, r *job.FeedRequest) (*job.FeedReply, error) {
	c = c.WithDefaults()
	cc := c.FeedConsumerConfig(tenant, name, r)
	stream := c.FeedStream(tenant)
	if _, err := js.CreateConsumer(ctx, stream, cc); err != nil {
		if errors.Is(err, jetstream.ErrConsumerExists) {
			return nil, fmt.Errorf("consumer %s of %s: %w", name, stream, ErrFeedConsumerExists)
		}
		return nil, fmt.Errorf("consumer %s of %s: %w", name, stream, err)
	}
	return &job.FeedReply{Stream: stream, Consumer: name, Subject: cc.FilterSubject}, nil
}
