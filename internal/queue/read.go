package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/lifecycle"
)

// readAll reads what a consumer of stream with cfg's filter and deliver
// policy delivers, up to the stream's end as it was when the read began,
// and hands each message to take, in order, once the read is whole.
//
// The consumer is one, ephemeral, kept in memory on one server, and the
// server removes it a few seconds after the read (inactive): an ordered
// consumer would create one a fetch and leave the last for five minutes,
// and every consumer left costs the server work on each message the
// stream stores (enough of them, read by a client that polls, and a
// cluster refuses new ones). It is not deleted by the reader: the NATS
// roles let a worker or a producer create a consumer to read what it may
// read, not delete consumers.
//
// A read is checked whole: the consumer says at its creation how many
// messages it has for the reader, and a read that gets fewer (a fetch
// that nobody answers, a server that died with the consumer, a cluster
// electing a leader) is read again from its start with a new consumer,
// until ctx ends (readWithin without a deadline). take never sees part of
// a read: a job's history, a run's messages or its notices that came back
// short would be taken for whole.
func readAll(ctx context.Context, js jetstream.JetStream, stream string, cfg jetstream.ConsumerConfig, batch int,
	take func(jetstream.Msg) error) error {
	cfg.AckPolicy, cfg.MemoryStorage, cfg.Replicas = jetstream.AckNonePolicy, true, 1
	cfg.InactiveThreshold = readInactive
	if len(cfg.FilterSubjects) == 1 {
		// One filter goes in the API's subject too
		// ($JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>), where the
		// NATS roles grant a client the reads of what it may read.
		cfg.FilterSubject, cfg.FilterSubjects = cfg.FilterSubjects[0], nil
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, readWithin)
		defer cancel()
	}
	var msgs []jetstream.Msg
	err := backoff.Retry(func() (err error) {
		msgs, err = readOnce(ctx, js, stream, cfg, batch)
		if err != nil && (ctx.Err() != nil || final(err)) {
			return backoff.Permanent(err)
		}
		return err
	}, lifecycle.Backoff(ctx, 50*time.Millisecond, time.Second))
	if err != nil {
		return fmt.Errorf("read %s: %w", stream, err)
	}
	for _, m := range msgs {
		if err := take(m); err != nil {
			return err
		}
	}
	return nil
}

// errShortRead: a read's consumer delivered fewer messages than it said
// it had.
var errShortRead = errors.New("the read ended before the messages its consumer announced")

// readOnce reads with one consumer, whole or not at all.
func readOnce(ctx context.Context, js jetstream.JetStream, stream string, cfg jetstream.ConsumerConfig, batch int) ([]jetstream.Msg, error) {
	cctx, cancel := context.WithTimeout(ctx, readTry)
	cons, err := js.CreateConsumer(cctx, stream, cfg)
	cancel()
	if err != nil {
		return nil, err
	}
	want := int(cons.CachedInfo().NumPending)
	out := make([]jetstream.Msg, 0, want)
	for len(out) < want {
		// A fetch asks for no more than is left, so it ends as soon as
		// those came; one whose messages do not come within readTry
		// ends short, and the read is made again.
		fctx, cancel := context.WithTimeout(ctx, readTry)
		fetch, err := cons.Fetch(min(batch, want-len(out)), jetstream.FetchContext(fctx))
		if err != nil {
			cancel()
			return nil, err
		}
		got := 0
		for m := range fetch.Messages() {
			got++
			out = append(out, m)
		}
		err = fetch.Error()
		cancel()
		if err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return nil, err
		}
		if got == 0 {
			return nil, fmt.Errorf("%w (%d of %d)", errShortRead, len(out), want)
		}
	}
	return out, nil
}

// final reports an error that a new consumer would meet again: the stream
// is not there, or the server refused the consumer as asked.
func final(err error) bool {
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return true
	}
	var api *jetstream.APIError
	return errors.As(err, &api) && api.Code == 400
}

const (
	// readInactive is how long the server keeps a reader's consumer after
	// its last fetch: far longer than a read's fetches are apart.
	readInactive = 5 * time.Second
	// readTry bounds a consumer's creation and each fetch of a read: a
	// server answers in milliseconds, and one that does not is frozen,
	// dead, or electing a leader, and the read is made again.
	readTry = 2 * time.Second
	// readWithin bounds a read whose context has no deadline.
	readWithin = 30 * time.Second
)
