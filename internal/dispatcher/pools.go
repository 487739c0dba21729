package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// Pool returns what operators set about a pool.
func (d *Dispatcher) Pool(ctx context.Context, pool string) (*job.PoolState, error) {
	if !job.ValidPool(pool) {
		return nil, fmt.Errorf("%w: %q is not a pool name", errInvalid, pool)
	}
	return queue.ReadPool(ctx, d.poolStates, pool)
}

// SetPaused pauses or resumes a pool: its workers start no attempt while
// it is paused (they look at least once a second), and the jobs that
// arrive meanwhile wait in its stream; attempts already running go on.
func (d *Dispatcher) SetPaused(ctx context.Context, pool string, paused bool, change *job.PoolChange) (*job.PoolState, error) {
	if !job.ValidPool(pool) {
		return nil, fmt.Errorf("%w: %q is not a pool name", errInvalid, pool)
	}
	if err := change.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", errInvalid, err)
	}
	cur, err := queue.ReadPool(ctx, d.poolStates, pool)
	if err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	s := *cur
	s.UpdatedAt = now
	switch {
	case paused && !cur.Paused:
		s.Paused, s.Since, s.Reason = true, &now, change.Reason
	case paused:
		s.Reason = change.Reason
	default:
		s.Paused, s.Since, s.Reason = false, nil, ""
	}
	if err := queue.WritePool(ctx, d.poolStates, &s); err != nil {
		return nil, err
	}
	if paused != cur.Paused {
		d.log.Info("pool "+map[bool]string{true: "paused", false: "resumed"}[paused], "pool", pool, "reason", s.Reason)
	}
	return &s, nil
}

// onPool answers <prefix>.pools.<pool>.{pause,resume,show}.
func (d *Dispatcher) onPool(m *nats.Msg) {
	if m.Reply == "" {
		return
	}
	d.answer(m, func(ctx context.Context) ([]byte, error) {
		s, err := d.poolRequest(ctx, m)
		switch {
		case isInvalid(err):
			return json.Marshal(&job.ErrorReply{Error: err.Error()})
		case err != nil:
			d.log.Warn("pool request failed", "subject", m.Subject, "err", err)
			return json.Marshal(&job.ErrorReply{Error: "the fleet cannot answer now; try again", Retry: true})
		}
		return json.Marshal(s)
	})
}

func (d *Dispatcher) poolRequest(ctx context.Context, m *nats.Msg) (*job.PoolState, error) {
	rest := strings.TrimPrefix(m.Subject, strings.TrimSuffix(d.names.AllPools(), ">"))
	pool, verb, ok := strings.Cut(rest, ".")
	if !ok || strings.Contains(verb, ".") {
		return nil, fmt.Errorf("%w: %s is not <pool>.pause, .resume or .show", errInvalid, rest)
	}
	var change job.PoolChange
	if len(m.Data) > 0 {
		if err := json.Unmarshal(m.Data, &change); err != nil {
			return nil, fmt.Errorf("%w: the request is not a JSON object with a reason: %v", errInvalid, err)
		}
	}
	switch verb {
	case "pause":
		return d.SetPaused(ctx, pool, true, &change)
	case "resume":
		return d.SetPaused(ctx, pool, false, &change)
	case "show":
		return d.Pool(ctx, pool)
	}
	return nil, fmt.Errorf("%w: %q is not pause, resume or show", errInvalid, verb)
}

// errInvalid marks a request about a pool that cannot be carried out as
// asked; its message is for the operator.
var errInvalid = errors.New("invalid request")

// errForbidden is a request its principal may not make.
var errForbidden = errors.New("forbidden")

func isInvalid(err error) bool { return errors.Is(err, errInvalid) }
