package runs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// read reads what the runs' stream says of a run: ErrNotFound (wrapped)
// when the tenant has none of that id.
func read(ctx context.Context, rs *queue.Runs, tenant, id string) (*run, *queue.RunRounds, error) {
	rec, err := rs.Def(ctx, tenant, id)
	if err != nil {
		return nil, nil, err
	}
	rounds, err := rs.Rounds(ctx, tenant, id)
	if err != nil {
		return nil, nil, err
	}
	ends, err := rs.NodesEnded(ctx, tenant, id)
	if err != nil {
		return nil, nil, err
	}
	return newRun(rec, rounds, ends), rounds, nil
}

// View returns a run as it stands: its round and state, and each node's
// state, the job's own for a node queued and not ended (its last version,
// from jobs), waiting with the nodes it waits for while it is not queued.
func View(ctx context.Context, rs *queue.Runs, jobs Jobs, tenant, id string) (*job.RunView, error) {
	r, rounds, err := read(ctx, rs, tenant, id)
	if err != nil {
		return nil, err
	}
	return view(ctx, r, rounds, jobs)
}

func view(ctx context.Context, r *run, rounds *queue.RunRounds, jobs Jobs) (*job.RunView, error) {
	v := &job.RunView{RunID: r.id, Tenant: r.tenant, State: job.RunRunning, Round: r.round, Labels: r.rec.Labels,
		SubmittedAt: r.rec.SubmittedAt, CancelRequested: r.cancelled, Nodes: make([]job.NodeView, len(r.rec.Nodes))}
	if e := rounds.Ended[r.round]; e != nil {
		v.State = e.State
		at := e.FinishedAt
		v.FinishedAt = &at
	}
	for i, nd := range r.rec.Nodes {
		nv := job.NodeView{ID: nd.ID, After: nd.After, When: nd.When, Pool: nd.Pool, JobID: r.jobID(i), Round: r.nodeRound[i]}
		switch e := r.ends[i]; {
		case e != nil:
			nv.State, nv.Code = e.State, e.Code
		case r.endedParents[i] == len(r.parents[i]):
			// Released, or about to be.
			rec, err := jobs.Last(ctx, r.key(i))
			switch {
			case errors.Is(err, queue.ErrNotFound):
				nv.State = job.NodeWaiting
			case err != nil:
				return nil, fmt.Errorf("run %s: node %s: %w", r.id, nd.ID, err)
			default:
				nv.State = rec.State
				if rec.Failure != nil && rec.State.Final() && rec.State != job.StateSucceeded {
					nv.Code = rec.Failure.Code
				}
			}
		default:
			nv.State = job.NodeWaiting
			for _, p := range r.parents[i] {
				if r.ends[p] == nil {
					nv.WaitingFor = append(nv.WaitingFor, r.rec.Nodes[p].ID)
				}
			}
		}
		v.Nodes[i] = nv
	}
	return v, nil
}

// Errors of a cancel or a retry that cannot be.
var (
	ErrRunEnded    = errors.New("the run has ended")
	ErrRunNotEnded = errors.New("the run has not ended")
	ErrSucceeded   = errors.New("the run succeeded")
	ErrUnderWay    = errors.New("already under way")
)

// Cancel asks for a run's round to be cancelled: every node of it that
// has not ended ends cancelled (the releaser carries it out). It returns
// the round; ErrRunEnded when the round has ended, ErrUnderWay when a
// cancel of it was asked for already.
func Cancel(ctx context.Context, rs *queue.Runs, tenant, id string) (int, error) {
	r, rounds, err := read(ctx, rs, tenant, id)
	if err != nil {
		return 0, err
	}
	if e := rounds.Ended[r.round]; e != nil {
		return r.round, fmt.Errorf("%w (%s)", ErrRunEnded, e.State)
	}
	err = rs.Cancel(ctx, &job.RunCancel{RunID: id, Tenant: tenant, Round: r.round, RequestedAt: time.Now()})
	if errors.Is(err, queue.ErrRunExists) {
		return r.round, fmt.Errorf("a cancel is %w", ErrUnderWay)
	}
	return r.round, err
}

// Retry starts the next round of an ended run that did not succeed: its
// nodes that did not succeed (skipped ones too) and every node after them
// run again, as new jobs; the others keep theirs, with their outputs. It
// returns the new round and the nodes it runs again.
func Retry(ctx context.Context, rs *queue.Runs, tenant, id string) (int, []string, error) {
	r, rounds, err := read(ctx, rs, tenant, id)
	if err != nil {
		return 0, nil, err
	}
	e := rounds.Ended[r.round]
	switch {
	case e == nil:
		return r.round, nil, fmt.Errorf("%w: cancel it first, or wait for its end", ErrRunNotEnded)
	case e.State == job.RunSucceeded:
		return r.round, nil, ErrSucceeded
	}
	again := r.retrySet()
	err = rs.Retry(ctx, &job.RunRetry{RunID: id, Tenant: tenant, Round: r.round + 1, Nodes: again, RequestedAt: time.Now()})
	if errors.Is(err, queue.ErrRunExists) {
		return r.round + 1, nil, fmt.Errorf("round %d is %w", r.round+1, ErrUnderWay)
	}
	return r.round + 1, again, err
}
