package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// readAll reads what a consumer of stream with cfg's filter and deliver
// policy delivers, up to the stream's end as it was when the read began,
// and hands each message to take. The consumer is one, ephemeral, kept
// in memory on one server, and the server removes it a few seconds after
// the read (inactive): an ordered consumer would create one a fetch and
// leave the last for five minutes, and every consumer left costs the
// server work on each message the stream stores (enough of them, read by
// a client that polls, and a cluster refuses new ones). It is not
// deleted by the reader: the NATS roles let a worker or a producer
// create a consumer to read what it may read, not delete consumers.
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
	cons, err := js.CreateConsumer(ctx, stream, cfg)
	if err != nil {
		return fmt.Errorf("read %s: %w", stream, err)
	}
	for {
		msgs, err := cons.FetchNoWait(batch)
		if err != nil {
			return fmt.Errorf("read %s: %w", stream, err)
		}
		got := 0
		for m := range msgs.Messages() {
			got++
			if err := take(m); err != nil {
				return err
			}
			// Each message says how many more the consumer has: the
			// last says none.
			if md, err := m.Metadata(); err == nil && md.NumPending == 0 {
				return nil
			}
		}
		if err := msgs.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return fmt.Errorf("read %s: %w", stream, err)
		}
		if got == 0 {
			return nil
		}
	}
}

// readInactive is how long the server keeps a reader's consumer after its
// last fetch: far longer than a read's fetches are apart.
const readInactive = 5 * time.Second
