package client

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/fleet-dev/fleet/job"
)

// Pool returns what operators set about a pool (whether it is paused,
// since when and why, how it is shared between tenants) and how its
// tenants fare: what each has queued, by priority, and runs.
func (c *Client) Pool(ctx context.Context, pool string) (*job.PoolState, error) {
	return c.poolRequest(ctx, pool, "show", nil)
}

// PausePool pauses a pool: its workers start no attempt until it is
// resumed, and the jobs submitted meanwhile wait. Attempts already running
// go on. Pausing a paused pool changes only its reason.
func (c *Client) PausePool(ctx context.Context, pool, reason string) (*job.PoolState, error) {
	return c.poolRequest(ctx, pool, "pause", &job.PoolChange{Reason: reason})
}

// ResumePool resumes a paused pool; its waiting jobs start as slots allow.
func (c *Client) ResumePool(ctx context.Context, pool string) (*job.PoolState, error) {
	return c.poolRequest(ctx, pool, "resume", nil)
}

// SetPoolPolicy changes how a pool is shared between tenants: the
// weights and quotas change names replace those tenants' (a weight of 0 or
// an empty quota removes the tenant's), and its max_running and
// half_life, when set, the pool's. Workers follow it at once.
func (c *Client) SetPoolPolicy(ctx context.Context, pool string, change *job.PolicyChange) (*job.PoolState, error) {
	if err := change.Validate(); err != nil {
		return nil, fmt.Errorf("set pool %s: %w", pool, err)
	}
	body, err := json.Marshal(change)
	if err != nil {
		return nil, fmt.Errorf("set pool %s: %w", pool, err)
	}
	return c.poolCall(ctx, pool, "set", body)
}

func (c *Client) poolRequest(ctx context.Context, pool, verb string, change *job.PoolChange) (*job.PoolState, error) {
	var body []byte
	if change != nil {
		if err := change.Validate(); err != nil {
			return nil, fmt.Errorf("%s pool %s: %w", verb, pool, err)
		}
		body, _ = json.Marshal(change)
	}
	return c.poolCall(ctx, pool, verb, body)
}

// poolCall sends a request about a pool and decodes its answer. Every
// verb sets or reads the pool's state (pausing a paused pool, or setting
// the policy it has, changes nothing), so it is sent again as a read is (see ask),
// until ctx ends (10 seconds without a deadline).
func (c *Client) poolCall(ctx context.Context, pool, verb string, body []byte) (*job.PoolState, error) {
	if !job.ValidPool(pool) {
		return nil, fmt.Errorf("%s pool: %q is not a pool name", verb, pool)
	}
	ctx, cancel := withDefaultTimeout(ctx, 10*time.Second)
	defer cancel()
	m, err := c.ask(ctx, c.names.Pool(pool, verb), body, sendAgain)
	if err != nil {
		return nil, fmt.Errorf("%s pool %s: %w", verb, pool, err)
	}
	var reply struct {
		job.PoolState
		job.ErrorReply
	}
	if err := json.Unmarshal(m.Data, &reply); err != nil {
		return nil, fmt.Errorf("%s pool %s: unreadable answer: %w", verb, pool, err)
	}
	if reply.Error != "" {
		return nil, fmt.Errorf("%s pool %s: %s", verb, pool, reply.Error)
	}
	return &reply.PoolState, nil
}
