package console

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"slices"
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
// request's env values, only their names, nor its sealed secrets.
type deadLetter struct {
	JobID    string
	Tenant   string
	Pool     string
	Attempts int
	Failure  job.Failure
	Time     time.Time
	Seq      uint64
	Request  *RequestView
}

func (dl *deadLetter) key() queue.JobKey {
	return queue.JobKey{Tenant: dl.Tenant, Pool: dl.Pool, ID: dl.JobID}
}

// Ref names the dead letter in a form: tenant/pool/id.
func (dl *deadLetter) Ref() string { return dl.Tenant + "/" + dl.Pool + "/" + dl.JobID }

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

// of returns the dead letters of pool and tenant (every one when
// empty), newest first, the count per pool (of the tenant), and the
// tenants that have any.
func (d *deadLetters) of(pool, tenant string) ([]*deadLetter, map[string]int, []string) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	counts := map[string]int{}
	seen := map[string]bool{}
	var out []*deadLetter
	var tenants []string
	for i := len(d.list) - 1; i >= 0; i-- {
		dl := d.list[i]
		if !seen[dl.Tenant] {
			seen[dl.Tenant] = true
			tenants = append(tenants, dl.Tenant)
		}
		if tenant != "" && dl.Tenant != tenant {
			continue
		}
		counts[dl.Pool]++
		if pool == "" || dl.Pool == pool {
			out = append(out, dl)
		}
	}
	slices.Sort(tenants)
	return out, counts, tenants
}

// find returns the newest dead letter of a job.
func (d *deadLetters) find(k queue.JobKey) *deadLetter {
	d.mu.RLock()
	defer d.mu.RUnlock()
	for i := len(d.list) - 1; i >= 0; i-- {
		if d.list[i].key() == k {
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

// readDeadLetters follows the v2 dead letters, <prefix>.dlq.<pool>.<tenant>.<id>,
// each the message that queued its job (see queue.DecodeDeadLetter). A
// fleet's v1 dead letters (<prefix>.dlq.<pool>, a bare request) cannot be
// retried through contract v2, and are not shown.
func (c *Console) readDeadLetters(ctx context.Context, last *uint64) error {
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{c.names.DLQV2("*", "*", ">")}}
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
		dl, err := queue.DecodeDeadLetter(m)
		if err != nil {
			continue
		}
		*last = dl.Seq
		c.dead.add(&deadLetter{JobID: dl.JobID, Tenant: cmp.Or(dl.Tenant, job.DefaultTenant), Pool: dl.Pool,
			Attempts: dl.Attempts, Time: dl.Time, Seq: dl.Seq, Failure: dl.Failure, Request: viewRequest(dl.Request)})
	}
}
