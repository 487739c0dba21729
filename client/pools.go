package client

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/fleet-dev/fleet/job"
)

// Pool returns what operators set about a pool: whether it is paused, since
// when and why.
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

func (c *Client) poolRequest(ctx context.Context, pool, verb string, change *job.PoolChange) (*job.PoolState, error) {
	if !job.ValidPool(pool) {
		return nil, fmt.Errorf("%s pool: %q is not a pool name", verb, pool)
	}
	var body []byte
	if change != nil {
		if err := change.Validate(); err != nil {
			return nil, fmt.Errorf("%s pool %s: %w", verb, pool, err)
		}
		body, _ = json.Marshal(change)
	}
	ctx, cancel := withDefaultTimeout(ctx, 10*time.Second)
	defer cancel()
	m, err := c.nc.RequestWithContext(ctx, c.names.Pool(pool, verb), body)
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
