package console

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/capacity"
	"github.com/fleet-dev/fleet/internal/capacity/monitor"
	"github.com/fleet-dev/fleet/internal/lifecycle"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// workers keeps the live workers and the recently lost ones, read from
// Redis every interval by one loop, whatever the number of open pages.
type workers struct {
	caps  *capacity.Store
	every time.Duration
	log   *slog.Logger

	refreshing sync.Mutex // one read at a time: the loop's, or the one when Redis returns

	mu      sync.RWMutex
	live    []*job.Heartbeat
	pools   []job.PoolCapacity
	lost    []capacity.LostWorker
	read    time.Time
	err     error
	version uint64
}

// service reads the workers now and then every interval, until stopped;
// without Redis, it does nothing. While Redis is away the Store's Breaker
// fails each read at once: the console shows what it read last, with the
// error, and logs the outage once; as soon as Redis answers again it reads
// them without waiting for the next round.
func (w *workers) service() lifecycle.Service {
	if w.caps == nil {
		return lifecycle.Func{}
	}
	var r lifecycle.Runner
	return lifecycle.Func{
		StartFunc: func(ctx context.Context) error {
			return r.Go(ctx, func(ctx context.Context) error {
				w.refresh(ctx, true)
				n := 1
				stopUp := w.caps.Breaker().OnUp(func() { w.refresh(ctx, true) })
				defer stopUp()
				lifecycle.Tick(ctx, w.every, func(ctx context.Context) {
					w.refresh(ctx, n%4 == 0) // the lost workers change rarely: every fourth round
					n++
				})
				return nil
			})
		},
		StopFunc: r.Stop,
	}
}

func (w *workers) refresh(ctx context.Context, withLost bool) {
	w.refreshing.Lock()
	defer w.refreshing.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	hbs, err := w.caps.Workers(ctx, "")
	var lost []capacity.LostWorker
	if err == nil && withLost {
		lost, err = w.caps.Lost(ctx, 50)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		if w.err == nil {
			w.log.Warn("console cannot read the workers; it shows the last it read until Redis answers", "err", err)
		}
		w.err = err
		return
	}
	if w.err != nil {
		w.log.Info("console reads the workers again")
	}
	w.err, w.live, w.pools, w.read = nil, hbs, monitor.Summarize(hbs), time.Now()
	if withLost {
		w.lost = lost
	}
	w.version++
}

// snapshot returns what was last read.
func (w *workers) snapshot() (live []*job.Heartbeat, pools []job.PoolCapacity, lost []capacity.LostWorker, read time.Time, err error) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	return w.live, w.pools, w.lost, w.read, w.err
}

// deadLetter is what the console keeps of a dead letter: never the
// request's env values, only their names.
type deadLetter struct {
	JobID    string
	Pool     string
	Attempts int
	Failure  job.Failure
	Time     time.Time
	Seq      uint64
	Request  *RequestView
}

// deadLetters keeps the newest dead letters, followed on their stream.
type deadLetters struct {
	max     int
	mu      sync.RWMutex
	list    []*deadLetter // by sequence, oldest first
	version uint64
}

func (d *deadLetters) add(dl *deadLetter) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.list = append(d.list, dl)
	if len(d.list) > d.max {
		d.list = slices.Delete(d.list, 0, len(d.list)-d.max)
	}
	d.version++
}

// byPool returns the dead letters of pool (every pool when empty), newest
// first, and the count per pool.
func (d *deadLetters) byPool(pool string) ([]*deadLetter, map[string]int) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	counts := map[string]int{}
	var out []*deadLetter
	for i := len(d.list) - 1; i >= 0; i-- {
		dl := d.list[i]
		counts[dl.Pool]++
		if pool == "" || dl.Pool == pool {
			out = append(out, dl)
		}
	}
	return out, counts
}

// find returns the newest dead letter of a job.
func (d *deadLetters) find(id string) *deadLetter {
	d.mu.RLock()
	defer d.mu.RUnlock()
	for i := len(d.list) - 1; i >= 0; i-- {
		if d.list[i].JobID == id {
			return d.list[i]
		}
	}
	return nil
}

// followDeadLetters reads the dead-letter stream from its start, then
// follows it.
func (c *Console) followDeadLetters(ctx context.Context) {
	var last uint64
	lifecycle.Again(ctx, c.log, "following the dead letters", time.Second, 10*time.Second,
		func(ctx context.Context) error { return c.readDeadLetters(ctx, &last) })
}

func (c *Console) readDeadLetters(ctx context.Context, last *uint64) error {
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{c.names.AllDLQ()}}
	if *last > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, *last+1
	}
	cons, err := c.cfg.JS.OrderedConsumer(ctx, c.names.DLQStream(), cfg)
	if err != nil {
		return err
	}
	msgs, err := cons.Messages()
	if err != nil {
		return err
	}
	defer msgs.Stop()
	stop := context.AfterFunc(ctx, msgs.Stop)
	defer stop()
	for {
		m, err := msgs.Next()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			return err
		}
		meta, err := m.Metadata()
		if err != nil {
			continue
		}
		*last = meta.Sequence.Stream
		req, err := job.DecodeRequest(m.Data(), job.Limits{MaxRequestBytes: math.MaxInt})
		if err != nil {
			continue
		}
		h := m.Headers()
		attempts, _ := strconv.Atoi(h.Get(queue.HeaderAttempts))
		c.dead.add(&deadLetter{JobID: req.ID, Pool: req.Pool, Attempts: attempts, Time: meta.Timestamp, Seq: meta.Sequence.Stream,
			Failure: job.Failure{Class: job.FailureClass(h.Get(queue.HeaderFailureClass)), Code: job.FailureCode(h.Get(queue.HeaderFailureCode)),
				Message: h.Get(queue.HeaderFailureMessage)},
			Request: viewRequest(req)})
	}
}
