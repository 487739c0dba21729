package monitor

import (
	"context"
	"log/slog"
	"time"

	"github.com/fleet-dev/fleet/internal/capacity"
	"github.com/fleet-dev/fleet/job"
)

// Reaper notices workers whose heartbeat expired, announces each job they
// held, and cleans their index entries. Several dispatchers may run one:
// removing a worker from its pool's index is atomic, and only the one that
// removes it announces.
type Reaper struct {
	s        *capacity.Store
	interval time.Duration
	announce func(context.Context, *job.Event) error
	log      *slog.Logger
}

// NewReaper returns a Reaper that looks every interval (the workers'
// heartbeat interval) and announces lost jobs with announce.
func NewReaper(s *capacity.Store, interval time.Duration, announce func(context.Context, *job.Event) error, log *slog.Logger) *Reaper {
	if interval <= 0 {
		interval = 3 * time.Second
	}
	if log == nil {
		log = slog.Default()
	}
	return &Reaper{s: s, interval: interval, announce: announce, log: log.With("component", "reaper")}
}

// Run reaps until ctx ends.
func (r *Reaper) Run(ctx context.Context) {
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := r.Reap(ctx); err != nil {
				r.log.Debug("reap", "err", err)
			}
		}
	}
}

// Reap looks once, and returns the workers it found dead.
func (r *Reaper) Reap(ctx context.Context) ([]string, error) {
	pools, err := r.s.Pools(ctx)
	if err != nil {
		return nil, err
	}
	var dead []string
	// A worker that missed one beat is a candidate; its heartbeat key
	// tells whether it is gone (after three).
	stale := time.Now().Add(-r.interval)
	for _, pool := range pools {
		ids, err := r.s.Stale(ctx, pool, stale)
		if err != nil {
			return dead, err
		}
		for _, id := range ids {
			if alive, err := r.s.Alive(ctx, id); err != nil || alive {
				continue
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

// bury announces the jobs a dead worker held and removes what it left. Its
// leases outlive its heartbeat by two intervals (see ledger.Ledger);
// the last heartbeat is the fallback.
func (r *Reaper) bury(ctx context.Context, pool, id string) {
	hb, err := r.s.LastHeartbeat(ctx, id)
	if err != nil {
		r.log.Warn("cannot read the last heartbeat of a dead worker", "worker_id", id, "err", err)
	}
	held, _ := r.s.Leases(ctx, id)
	backend, seen := "", time.Time{}
	if hb != nil {
		backend, seen = hb.Backend, hb.ObservedAt
		if len(held) == 0 {
			for _, a := range hb.Running {
				held = append(held, capacity.Lease{JobID: a.JobID, Attempt: a.Attempt})
			}
		}
	}
	for _, l := range held {
		e := &job.Event{JobID: l.JobID, Attempt: l.Attempt, Type: job.EventHeartbeat, Time: time.Now().UTC(),
			WorkerID: id, Pool: pool, Backend: backend, Phase: "worker_lost",
			Failure: job.Failf(job.ClassInfrastructure, job.CodeWorkerLost,
				"worker %s stopped heartbeating (last seen %s); the job returns to the pool when its ack wait ends",
				id, seen.Format(time.RFC3339)),
		}
		e.Message = e.Failure.Message
		if err := r.announce(ctx, e); err != nil {
			r.log.Warn("announce lost job", "job_id", l.JobID, "err", err)
		}
	}
	if err := r.s.Forget(ctx, id); err != nil {
		r.log.Warn("cannot remove what a dead worker left; it expires", "worker_id", id, "err", err)
	}
	r.log.Warn("worker lost", "worker_id", id, "pool", pool, "jobs", len(held))
}
