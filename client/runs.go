package client

import (
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleet-dev/fleet/internal/lifecycle"
	"github.com/fleet-dev/fleet/job"
)

// Runs: graphs of jobs submitted at once (see job.RunRequest). A run is
// submitted whole on <prefix>.t.<tenant>.runs.submit; each node runs as an
// ordinary job, id <run>:<node>, the moment the nodes it comes after have
// ended as its rule asks; the run ends with one summary, stored and
// republished on <prefix>.t.<tenant>.run.<run>.end.<round>.

// RunRefusedError is a run the fleet refused, with every problem, each
// naming its node and field.
type RunRefusedError struct {
	RunID    string
	Reason   string
	Problems []string
}

func (e *RunRefusedError) Error() string { return "run refused: " + e.Reason }

// SubmitRun submits a run and returns the answer: its id (the fleet makes
// one when r has none), and Duplicate when the tenant had a run of that id
// already, which is not run again. A refused run is a *RunRefusedError.
// While no dispatcher answers, the run is sent again with its id, until ctx
// ends (10 seconds without a deadline): give r an id, so that a run sent
// twice runs once.
func (c *Client) SubmitRun(ctx context.Context, r *job.RunRequest) (*job.RunSubmitReply, error) {
	if r.ID == "" {
		r.ID = job.NewID()
	}
	data, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encode run: %w", err)
	}
	return c.SubmitRunJSON(ctx, data)
}

// SubmitRunJSON is SubmitRun of a run's document as it stands, given an
// id first if it has none (see withID): a copy sent again is the same run.
func (c *Client) SubmitRunJSON(ctx context.Context, data []byte) (*job.RunSubmitReply, error) {
	var reply job.RunSubmitReply
	if err := c.runRequest(ctx, "submit", "", withID(data), sendAgain, &reply); err != nil {
		return nil, err
	}
	if reply.Rejected() {
		return &reply, &RunRefusedError{RunID: reply.RunID, Reason: reply.Error, Problems: reply.Problems}
	}
	return &reply, nil
}

// Run returns a run as it stands: its state, round, and each node's
// state. ErrNotFound when the tenant has no such run.
func (c *Client) Run(ctx context.Context, id string) (*job.RunView, error) {
	var v job.RunView
	if err := c.runRequest(ctx, "status", id, nil, sendAgain, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// Runs lists the tenant's runs still kept, oldest first.
func (c *Client) Runs(ctx context.Context) ([]string, error) {
	var l job.RunList
	if err := c.runRequest(ctx, "list", "", nil, sendAgain, &l); err != nil {
		return nil, err
	}
	return l.Runs, nil
}

// CancelRun cancels a run: every node that has not ended ends cancelled.
func (c *Client) CancelRun(ctx context.Context, id string) (*job.RunReply, error) {
	var r job.RunReply
	if err := c.runRequest(ctx, "cancel", id, nil, sendOnce, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// RetryRun starts the next round of an ended run that did not succeed:
// its nodes that failed or were cancelled, and every node after them, run
// again as new jobs; those that succeeded keep their jobs and outputs.
func (c *Client) RetryRun(ctx context.Context, id string) (*job.RunReply, error) {
	var r job.RunReply
	if err := c.runRequest(ctx, "retry", id, nil, sendOnce, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// runRequest sends a request about the tenant's runs (see ask) and
// decodes the answer into v.
func (c *Client) runRequest(ctx context.Context, verb, id string, body []byte, r resend, v any) error {
	if id != "" && !job.ValidRunID(id) {
		return fmt.Errorf("%w: %q is not a run id", ErrNotFound, id)
	}
	ctx, cancel := withDefaultTimeout(ctx, 10*time.Second)
	defer cancel()
	what := verb + " run " + id
	m, err := c.ask(ctx, c.names.RunRequest(c.tenant, verb, id), body, r)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	var e job.ErrorReply
	if json.Unmarshal(m.Data, &e) == nil && e.Error != "" {
		switch {
		case e.NotFound:
			return fmt.Errorf("%w: run %s", ErrNotFound, id)
		case e.Retry:
			return fmt.Errorf("%s: %w: %s", what, ErrUnavailable, e.Error)
		}
		// A refused run answers with its own document: read it below.
		if verb != "submit" {
			return fmt.Errorf("%s: %s", what, e.Error)
		}
	}
	if err := json.Unmarshal(m.Data, v); err != nil {
		return fmt.Errorf("%s: unreadable answer: %w", what, err)
	}
	return nil
}

// RunEvent is what a watch of a run yields: how the run stands as the
// watch begins (Now, its first event), a node's job started or ended
// (Node, with its job's record version), or the run's round ended (End,
// its last).
type RunEvent struct {
	Now    *job.RunView
	Node   string
	Record *job.Record
	End    *job.RunEnd
}

// WatchRun follows a run as it goes. Its first event is how the run stands
// (Now, the run's view), read once the watch hears what comes next, so
// that nothing falls between the two; then each version of its nodes' jobs
// (a job queued, started, retried, ended) as it is stored, and, last, its
// round's end: at once, after Now, for a run that had ended. It replays
// nothing before Now. It ends with the run, when ctx ends, or with an
// error.
//
// What it hears live may miss a message (the client reconnecting, a
// server lost; see the contract): a node's version missed is not yielded,
// but the end is never missed, for the watch asks how the run stands now
// and then (backing off to every two seconds), as Result does, and ends
// with the summary of the round it finds ended.
func (c *Client) WatchRun(ctx context.Context, id string) iter.Seq2[*RunEvent, error] {
	return func(yield func(*RunEvent, error) bool) {
		if !job.ValidRunID(id) {
			yield(nil, fmt.Errorf("%w: %q is not a run id", ErrNotFound, id))
			return
		}
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		ch := make(chan *nats.Msg, 4096)
		// A node's job is <run>:<node>, one token of the tenant's live
		// subjects: the run's are picked out of the tenant's.
		jobs, err := c.nc.ChanSubscribe(c.names.JobLive(c.tenant, "*", "*", ">"), ch)
		if err == nil {
			defer jobs.Unsubscribe()
		}
		var ends *nats.Subscription
		if err == nil {
			ends, err = c.nc.ChanSubscribe(c.names.RunLive(c.tenant, id, "end.*"), ch)
		}
		if err != nil {
			yield(nil, fmt.Errorf("watch run %s: %w", id, err))
			return
		}
		defer ends.Unsubscribe()
		v, err := c.Run(ctx, id)
		if err != nil {
			yield(nil, err)
			return
		}
		if !yield(&RunEvent{Now: v}, nil) {
			return
		}
		round := v.Round
		if v.State.Final() {
			yield(&RunEvent{End: v.End()}, nil)
			return
		}
		wait := lifecycle.Backoff(ctx, 250*time.Millisecond, 2*time.Second)
		ask := time.NewTimer(wait.NextBackOff())
		defer ask.Stop()
		for {
			var m *nats.Msg
			select {
			case m = <-ch:
			case <-ask.C:
				v, err := c.Run(ctx, id)
				switch {
				case err == nil && v.Round >= round && v.State.Final():
					yield(&RunEvent{End: v.End()}, nil)
					return
				case err != nil && !retryable(ctx, err):
					yield(nil, err)
					return
				}
				ask.Reset(wait.NextBackOff())
				continue
			case <-ctx.Done():
				yield(nil, ctx.Err())
				return
			}
			if m.Sub == ends {
				var e job.RunEnd
				if json.Unmarshal(m.Data, &e) != nil || e.Round < round {
					continue
				}
				yield(&RunEvent{End: &e}, nil)
				return
			}
			_, k, ok := c.names.ParseJobLive(m.Subject)
			if run, _, _, node := job.ParseRunJobID(k.ID); !ok || !node || run != id {
				continue
			}
			rec, err := job.DecodeRecord(m.Data)
			if err != nil {
				continue
			}
			if _, node, _, ok := job.ParseRunJobID(rec.ID); ok && rec.RunID == id {
				if !yield(&RunEvent{Node: node, Record: rec}, nil) {
					return
				}
			}
		}
	}
}

// RunResult waits for a run's round to end, and returns its summary.
func (c *Client) RunResult(ctx context.Context, id string) (*job.RunEnd, error) {
	for ev, err := range c.WatchRun(ctx, id) {
		if err != nil {
			return nil, err
		}
		if ev.End != nil {
			return ev.End, nil
		}
	}
	return nil, fmt.Errorf("watch run %s: it ended without the run's end", id)
}
