package monitor

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/fleet-dev/fleet/internal/capacity"
	"github.com/fleet-dev/fleet/internal/lifecycle"
	"github.com/fleet-dev/fleet/job"
)

// Reaper notices workers whose heartbeat expired, gives each job they held
// back to its pool at once, announces it, and cleans their index entries.
// Several dispatchers may run one: removing a worker from its pool's index
// is atomic, and only the one that removes it acts.
//
// A heartbeat that cannot be read is not an expired one: while Redis is
// away the reaper declares no worker lost (and logs so, once). When Redis
// answers again, the workers get one heartbeat TTL (three intervals) to
// write theirs before any is declared lost: their heartbeats may have
// expired during the outage, while they ran on. A worker that died during
// the outage and whose keys outlived it is found after that; one whose keys
// are gone (Redis came back empty) is not, and its jobs come back when
// their ack wait ends.
type Reaper struct {
	s    *capacity.Store
	cfg  ReaperConfig
	log  *slog.Logger
	loop *lifecycle.Every

	mu    sync.Mutex
	down  bool      // the last round could not read Redis
	grace time.Time // no worker is declared lost before
}

// ReaperConfig configures a Reaper.
type ReaperConfig struct {
	// Interval is the workers' heartbeat interval: a worker is dead once
	// its heartbeat is three intervals old. Defaults to 3 seconds.
	Interval time.Duration
	// Every is how often the reaper looks. Defaults to half a second, so
	// that a dead worker's jobs run again within a second of its heartbeat
	// expiring.
	Every time.Duration
	// Announce publishes an event about a lost job.
	Announce func(context.Context, *job.Event) error
	// Requeue gives a lost job back to its pool through its lease's handle
	// (the ack subject of its message). Optional: without it, the job comes
	// back when its ack wait ends.
	Requeue func(ctx context.Context, handle string) error
	Logger  *slog.Logger
}

// NewReaper returns a Reaper; Start starts it.
func NewReaper(s *capacity.Store, cfg ReaperConfig) *Reaper {
	cfg.Interval = cmp.Or(cfg.Interval, capacity.DefaultHeartbeatInterval)
	cfg.Every = cmp.Or(cfg.Every, 500*time.Millisecond)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	r := &Reaper{s: s, cfg: cfg, log: cfg.Logger.With("component", "reaper")}
	r.loop = lifecycle.NewEvery(cfg.Every, func(ctx context.Context) {
		if _, err := r.Reap(ctx); err != nil {
			r.log.Debug("reap", "err", err) // an outage is logged once, by Reap
		}
	})
	return r
}

// Start starts reaping in the background.
func (r *Reaper) Start(ctx context.Context) error { return r.loop.Start(ctx) }

// Stop stops reaping and waits, until ctx ends, for a round under way.
func (r *Reaper) Stop(ctx context.Context) error { return r.loop.Stop(ctx) }

// Reap looks once, and returns the workers it found dead. It declares
// none while Redis is away, nor for one heartbeat TTL after it answers
// again. Looking is bounded by one interval, so that an outage long
// enough for heartbeats to expire in it is seen as one, even when Redis
// hangs rather than refuses; what follows a worker found dead is not.
func (r *Reaper) Reap(ctx context.Context) ([]string, error) {
	lctx, cancel := context.WithTimeout(ctx, r.cfg.Interval)
	defer cancel()
	pools, err := r.s.Pools(lctx)
	if err != nil {
		r.noteDown(lctx, err)
		return nil, err
	}
	if r.inGrace() {
		return nil, nil
	}
	var dead []string
	// A worker that missed one beat is a candidate; its heartbeat key
	// tells whether it is gone (after three).
	stale := time.Now().Add(-r.cfg.Interval)
	for _, pool := range pools {
		ids, err := r.s.Stale(lctx, pool, stale)
		if err != nil {
			r.noteDown(lctx, err)
			return dead, err
		}
		for _, id := range ids {
			if alive, err := r.s.Alive(lctx, pool, id); err != nil || alive {
				continue // unknown is not dead
			}
			if mine, err := r.s.Unindex(ctx, pool, id); err != nil || !mine {
				continue // another dispatcher took it
			}
			dead = append(dead, id)
			r.bury(ctx, pool, id)
		}
	}
	return dead, nil
}

// noteDown notes a round that could not read Redis, and logs the first of
// an outage.
func (r *Reaper) noteDown(ctx context.Context, err error) {
	if !capacity.Outage(ctx, err) && !errors.Is(err, capacity.ErrUnavailable) {
		return
	}
	r.mu.Lock()
	first := !r.down
	r.down = true
	r.mu.Unlock()
	if first {
		r.log.Warn("cannot read the workers' heartbeats (Redis unreachable): no worker is declared lost until Redis answers", "err", err)
	}
}

// inGrace reports whether workers may not be declared lost yet: Redis
// answered again less than a heartbeat TTL ago.
func (r *Reaper) inGrace() bool {
	r.mu.Lock()
	was := r.down
	if was {
		r.down = false
		r.grace = time.Now().Add(3 * r.cfg.Interval)
	}
	grace := r.grace
	r.mu.Unlock()
	if was {
		r.log.Info("Redis answers again: workers have one heartbeat TTL to report before any is declared lost",
			"ttl", 3*r.cfg.Interval)
	}
	return time.Now().Before(grace)
}

// bury announces the jobs a dead worker held and removes what it left. Its
// leases outlive its heartbeat by two intervals (see ledger.Ledger);
// the last heartbeat is the fallback.
func (r *Reaper) bury(ctx context.Context, pool, id string) {
	hb, err := r.s.LastHeartbeat(ctx, pool, id)
	if err != nil {
		r.log.Warn("cannot read the last heartbeat of a dead worker", "worker_id", id, "err", err)
	}
	held, _ := r.s.Leases(ctx, pool, id)
	backend, seen, version := "", time.Time{}, ""
	if hb != nil {
		backend, seen, version = hb.Backend, hb.ObservedAt, hb.Version
		if len(held) == 0 {
			for _, a := range hb.Running {
				held = append(held, capacity.Lease{Tenant: a.Tenant, JobID: a.JobID, Attempt: a.Attempt})
			}
		}
	}
	for _, l := range held {
		back := "the job returns to its pool when its ack wait ends"
		if l.Handle != "" && r.cfg.Requeue != nil {
			if err := r.cfg.Requeue(ctx, l.Handle); err != nil {
				r.log.Warn("cannot give a lost job back; it comes back after its ack wait", "job_id", l.JobID, "err", err)
			} else {
				back = "the job returns to its pool now"
			}
		}
		e := &job.Event{JobID: l.JobID, Tenant: cmp.Or(l.Tenant, job.DefaultTenant), Attempt: l.Attempt, Type: job.EventHeartbeat, Time: time.Now().UTC(),
			WorkerID: id, Pool: pool, Backend: backend, Phase: job.PhaseWorkerLost,
			Failure: job.Failf(job.ClassInfrastructure, job.CodeWorkerLost,
				"worker %s stopped heartbeating (last seen %s); %s", id, seen.Format(time.RFC3339), back),
		}
		e.Message = e.Failure.Message
		if r.cfg.Announce != nil {
			if err := r.cfg.Announce(ctx, e); err != nil {
				r.log.Warn("announce lost job", "job_id", l.JobID, "err", err)
			}
		}
	}
	lost := capacity.LostWorker{WorkerID: id, Pool: pool, Backend: backend, Version: version,
		LostAt: time.Now().UTC(), LastSeen: seen}
	for _, l := range held {
		lost.Jobs = append(lost.Jobs, capacity.Held{JobID: l.JobID, Attempt: l.Attempt})
	}
	if err := r.s.RecordLost(ctx, lost); err != nil {
		r.log.Warn("cannot record a lost worker for the console", "worker_id", id, "err", err)
	}
	if err := r.s.Forget(ctx, pool, id); err != nil {
		r.log.Warn("cannot remove what a dead worker left; it expires", "worker_id", id, "err", err)
	}
	r.log.Warn("worker lost", "worker_id", id, "pool", pool, "jobs", len(held))
}
