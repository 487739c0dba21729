package client

import (
	"context"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// DeadLetter is a request whose job ended failed or timed out, as the
// dead-letter stream keeps it.
type DeadLetter = job.DeadLetter

// DeadLetters lists the dead letters of pool, or of every pool when pool is
// empty, oldest first.
func (c *Client) DeadLetters(ctx context.Context, pool string) ([]*DeadLetter, error) {
	return queue.DeadLetters(ctx, c.js, c.names, c.tenant, pool)
}

// RetryDeadLetter submits the dead-lettered request of job id again, as a
// new job: the old id keeps its result and history, the new one is id with
// "-retry-N" appended, N the first number not taken. A dispatcher does it:
// only dispatchers can open the request's secrets.
func (c *Client) RetryDeadLetter(ctx context.Context, id string) (*Submission, error) {
	var s Submission
	if err := c.request(ctx, "retry", id, &s); err != nil {
		return nil, err
	}
	if s.Rejected() {
		return nil, &RejectedError{JobID: s.JobID, Reason: s.Error}
	}
	return &s, nil
}
