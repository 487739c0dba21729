package dispatcher

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/lifecycle"
	"github.com/fleet-dev/fleet/job"
)

// peers tracks the other dispatchers: each says it runs every two seconds
// on the dispatchers subject, and is forgotten after three silent ones.
type peers struct {
	self string
	mu   sync.Mutex
	seen map[string]time.Time
}

const pingEvery = 2 * time.Second

// startPeers announces the dispatcher and starts hearing the others; it
// returns the service that keeps announcing it every pingEvery and stops
// hearing them when stopped.
func (d *Dispatcher) startPeers() (*peers, lifecycle.Service, error) {
	p := &peers{self: job.NewID(), seen: map[string]time.Time{}}
	ping := func(context.Context) { _ = d.nc.Publish(d.names.Dispatchers(), []byte(p.self)) }
	sub, err := d.nc.Subscribe(d.names.Dispatchers(), func(m *nats.Msg) {
		id := string(m.Data)
		if id == p.self {
			return
		}
		p.mu.Lock()
		_, known := p.seen[id]
		p.seen[id] = time.Now()
		p.mu.Unlock()
		if !known {
			ping(nil) // a newcomer learns of this dispatcher at once
		}
	})
	if err != nil {
		return nil, nil, err
	}
	// Say so before taking any submission, and give the others a moment to
	// answer: from then on, every dispatcher knows it is not alone.
	ping(nil)
	if err := d.nc.FlushTimeout(5 * time.Second); err != nil {
		_ = sub.Unsubscribe()
		return nil, nil, err
	}
	time.Sleep(250 * time.Millisecond)
	pinging := lifecycle.NewEvery(pingEvery, ping)
	return p, lifecycle.Func{
		StartFunc: pinging.Start,
		StopFunc: func(ctx context.Context) error {
			err := pinging.Stop(ctx)
			_ = sub.Unsubscribe()
			return err
		},
	}, nil
}

// any reports whether another dispatcher was heard from recently.
func (p *peers) any() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, at := range p.seen {
		if time.Since(at) < 3*pingEvery {
			return true
		}
		delete(p.seen, id)
	}
	return false
}

// first reports whether this dispatcher has the smallest id among those
// heard from recently: it does what one dispatcher at a time should do.
func (p *peers) first() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, at := range p.seen {
		if time.Since(at) < 3*pingEvery && id < p.self {
			return false
		}
	}
	return true
}

// claimer returns the function that claims a reply subject in the intake
// bucket. When the bucket cannot answer, it lets the dispatcher answer:
// a rare answer twice is better than none.
func claimer(kv jetstream.KeyValue) func(string) bool {
	return func(subject string) bool {
		sum := sha256.Sum256([]byte(subject))
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := kv.Create(ctx, hex.EncodeToString(sum[:16]), nil)
		return !errors.Is(err, jetstream.ErrKeyExists)
	}
}
