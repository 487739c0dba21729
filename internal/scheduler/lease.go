package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// lease is the schedules' lease: the one dispatcher that holds it fires
// every schedule. It is the leader key of the schedules bucket, written
// with a compare-and-set on its revision: the holder renews it every third
// of ttl; the others read it as often, and one takes it over when it has
// seen the same revision for ttl, that is on its third look after the one
// that first saw it (a compare-and-set too, so one wins). After its
// holder's last renewal, the lease is free within ttl and a third. The
// holder that cannot renew for two thirds of ttl stops firing, before any
// other can take over; a dispatcher that stops gives the lease up, so that
// another takes it within a third of ttl.
//
// Time is each dispatcher's own monotonic clock, never compared across
// machines. Should two dispatchers fire for a moment all the same (a
// paused process, a partition), a firing still runs once: its job's id is
// the compare-and-set of its pool's stream.
type lease struct {
	kv   Bucket
	self leaseValue
	ttl  time.Duration
	log  *slog.Logger

	held    bool
	rev     uint64    // of the holder's last write
	renewed time.Time // when the last renewal that succeeded was sent
	seen    uint64    // the last revision a non-holder saw
	seenAt  time.Time // when it first saw it
}

// leaderKey is the lease's key in the schedules bucket.
const leaderKey = "leader"

// leaseValue says who holds the lease, for people looking at the bucket.
type leaseValue struct {
	Holder string `json:"holder"`
	Host   string `json:"host,omitempty"`
}

func newLease(kv Bucket, self string, ttl time.Duration, log *slog.Logger) *lease {
	host, _ := os.Hostname()
	return &lease{kv: kv, self: leaseValue{Holder: self, Host: host}, ttl: ttl, log: log}
}

// every is how often keep is called.
func (l *lease) every() time.Duration { return l.ttl / 3 }

// keep renews the lease, or takes it if it is free or its holder stopped
// renewing it, and reports whether this dispatcher holds it.
func (l *lease) keep(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, l.every())
	defer cancel()
	sent := time.Now()
	value, _ := json.Marshal(l.self)
	if l.held {
		rev, err := l.kv.Update(ctx, leaderKey, value, l.rev)
		switch {
		case err == nil:
			l.rev, l.renewed = rev, sent
		case conflict(err):
			l.held = false
			l.log.Warn("the schedules' lease was taken over; no longer firing schedules")
		case time.Since(l.renewed) > l.ttl-l.every():
			l.held = false
			l.log.Warn("the schedules' lease cannot be renewed; no longer firing schedules", "err", err)
		default:
			l.log.Debug("renewing the schedules' lease", "err", err)
		}
		return l.held
	}
	e, err := l.kv.Get(ctx, leaderKey)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return l.take(ctx, value, sent, 0)
	case err != nil:
		l.log.Debug("reading the schedules' lease", "err", err)
		return false
	}
	var holder leaseValue
	_ = json.Unmarshal(e.Value(), &holder)
	if e.Revision() != l.seen {
		l.seen, l.seenAt = e.Revision(), sent
	}
	// Its own lease, which it stopped renewing while the bucket could not
	// be written and no one took over; or a lease its holder left.
	// The looks come every third of ttl, each a little early or late: the
	// third after the first is ttl later, give or take that jitter, which
	// must not cost one more look (a third of ttl more to take over).
	if holder.Holder == l.self.Holder || sent.Sub(l.seenAt) >= l.ttl-l.every()/2 {
		return l.take(ctx, value, sent, e.Revision())
	}
	return false
}

// take writes the lease over revision rev (0: none).
func (l *lease) take(ctx context.Context, value []byte, sent time.Time, rev uint64) bool {
	var err error
	if rev == 0 {
		rev, err = l.kv.Create(ctx, leaderKey, value)
	} else {
		rev, err = l.kv.Update(ctx, leaderKey, value, rev)
	}
	if err != nil {
		if !conflict(err) {
			l.log.Debug("taking the schedules' lease", "err", err)
		}
		return false
	}
	l.held, l.rev, l.renewed = true, rev, sent
	return true
}

// release gives the lease up, if this dispatcher holds it.
func (l *lease) release(ctx context.Context) {
	if !l.held {
		return
	}
	l.held = false
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := l.kv.Delete(ctx, leaderKey, jetstream.LastRevision(l.rev)); err != nil && !conflict(err) {
		l.log.Debug("giving up the schedules' lease", "err", err)
	}
}

// conflict reports whether a key-value write lost a compare-and-set.
func conflict(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)
}
