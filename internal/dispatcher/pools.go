package dispatcher

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// Pool returns what operators set about a pool, and how its tenants fare.
func (d *Dispatcher) Pool(ctx context.Context, pool string) (*job.PoolState, error) {
	if !job.ValidPool(pool) {
		return nil, fmt.Errorf("%w: %q is not a pool name", errInvalid, pool)
	}
	s, err := queue.ReadPool(ctx, d.poolStates, pool)
	if err != nil {
		return nil, err
	}
	s.Tenants, s.Slots = d.shares(ctx, pool, s.Policy)
	return s, nil
}

// SetPaused pauses or resumes a pool: its workers start no attempt while
// it is paused, and the jobs that arrive meanwhile wait in its stream;
// attempts already running go on. The workers know of the change before
// any job submitted once it is answered (see tellWorkers).
func (d *Dispatcher) SetPaused(ctx context.Context, pool string, paused bool, change *job.PoolChange) (*job.PoolState, error) {
	if !job.ValidPool(pool) {
		return nil, fmt.Errorf("%w: %q is not a pool name", errInvalid, pool)
	}
	if err := change.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", errInvalid, err)
	}
	var was bool
	s, rev, err := queue.UpdatePool(ctx, d.poolStates, pool, func(s *job.PoolState) error {
		was = s.Paused
		now := time.Now().UTC()
		s.UpdatedAt = now
		switch {
		case paused && !s.Paused:
			s.Paused, s.Since, s.Reason = true, &now, change.Reason
		case paused:
			s.Reason = change.Reason
		default:
			s.Paused, s.Since, s.Reason = false, nil, ""
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	d.tellWorkers(s, rev)
	if paused != was {
		d.log.Info("pool "+map[bool]string{true: "paused", false: "resumed"}[paused], "pool", pool, "reason", s.Reason)
	}
	return s, nil
}

// SetPolicy changes how a pool is shared between tenants: the workers
// follow the new policy from the jobs submitted once it is answered (see
// tellWorkers).
func (d *Dispatcher) SetPolicy(ctx context.Context, pool string, change *job.PolicyChange) (*job.PoolState, error) {
	if !job.ValidPool(pool) {
		return nil, fmt.Errorf("%w: %q is not a pool name", errInvalid, pool)
	}
	if err := change.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", errInvalid, err)
	}
	s, rev, err := queue.UpdatePool(ctx, d.poolStates, pool, func(s *job.PoolState) error {
		p := change.Apply(s.Policy)
		if err := p.Validate(); err != nil {
			return fmt.Errorf("%w: %v", errInvalid, err)
		}
		if p.IsZero() {
			p = nil
		}
		s.Policy, s.UpdatedAt = p, time.Now().UTC()
		return nil
	})
	if err != nil {
		return nil, err
	}
	d.tellWorkers(s, rev)
	d.log.Info("pool policy set", "pool", pool, "policy", s.Policy.String())
	return s, nil
}

// tellWorkers tells the pool's workers the state just written at revision
// rev, and waits until the server has the word, before the change is
// answered. Workers watch the pools bucket, but its watch is a consumer of
// the bucket's stream, which the server feeds on its own time: nothing
// orders it before a job submitted once the change is answered. This word
// is: the server hands it to each worker's connection before it reads
// anything this dispatcher sends after it, so before any job submitted
// after the answer can be stored, and each worker applies the words it
// has before it hands on a delivery (the worker's pause.go). On a cluster
// the word may reach a worker over another route than the job: it still
// leaves before the job exists. A word not said (NATS away) leaves the
// workers to their watch.
func (d *Dispatcher) tellWorkers(s *job.PoolState, rev uint64) {
	data, err := json.Marshal(s)
	if err == nil {
		m := nats.NewMsg(d.names.PoolQueues(s.Pool))
		m.Header.Set(queue.HeaderPoolRevision, strconv.FormatUint(rev, 10))
		m.Data = data
		if err = d.nc.PublishMsg(m); err == nil {
			err = d.nc.FlushTimeout(tellTimeout)
		}
	}
	if err != nil {
		d.log.Warn("cannot tell the pool's workers of its new state; they learn it from their watch", "pool", s.Pool, "err", err)
	}
}

// tellTimeout bounds the wait for the server to have a word to workers.
const tellTimeout = 2 * time.Second

// onPool answers <prefix>.pools.<pool>.{pause,resume,show,set}.
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
		return nil, fmt.Errorf("%w: %s is not <pool>.pause, .resume, .show or .set", errInvalid, rest)
	}
	if verb == "set" {
		var change job.PolicyChange
		if err := strictJSON(m.Data, &change); err != nil {
			return nil, fmt.Errorf("%w: the request is not a policy change: %v", errInvalid, err)
		}
		return d.SetPolicy(ctx, pool, &change)
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
	return nil, fmt.Errorf("%w: %q is not pause, resume, show or set", errInvalid, verb)
}

// errInvalid marks a request about a pool that cannot be carried out as
// asked; its message is for the operator.
var errInvalid = errors.New("invalid request")

// errForbidden is a request its principal may not make.
var errForbidden = errors.New("forbidden")

func isInvalid(err error) bool { return errors.Is(err, errInvalid) }

// strictJSON decodes one JSON value into v, refusing fields v has not.
func strictJSON(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("more than one JSON value")
	}
	return nil
}

// AllPools returns the state of every pool that has a stream, and how its
// tenants fare, by name.
func (d *Dispatcher) AllPools(ctx context.Context) ([]*job.PoolState, error) {
	names := d.js.StreamNames(ctx, jetstream.WithStreamListSubject(d.names.AllPoolSubjects()))
	var pools []string
	for name := range names.Name() {
		if pool, ok := strings.CutPrefix(name, d.names.PoolStreamV2("")); ok && job.ValidPool(pool) {
			pools = append(pools, pool)
		}
	}
	if err := names.Err(); err != nil {
		return nil, fmt.Errorf("list the pools: %w", err)
	}
	slices.Sort(pools)
	out := make([]*job.PoolState, 0, len(pools))
	for _, pool := range pools {
		s, err := d.Pool(ctx, pool)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}
