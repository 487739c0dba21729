package client

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/fleet-dev/fleet/job"
)

// FeedConsumer asks a dispatcher for the durable consumer name of the
// tenant's feed: the stream that keeps the final version (<prefix>.t.<tenant>.job.<pool>.r.<id>)
// and the rejection (….x.<id>) of every job of the tenant, which the
// tenant pulls with any JetStream client and acknowledges (the live
// copies of the same subjects are core NATS messages, which a subscriber
// may miss). r may be nil: the consumer then starts with the first message
// the feed holds. Asking again as before answers the same; a consumer of
// that name that exists otherwise, or a request the fleet cannot honour,
// is a *RejectedError.
func (c *Client) FeedConsumer(ctx context.Context, name string, r *job.FeedRequest) (*job.FeedReply, error) {
	if r == nil {
		r = &job.FeedRequest{}
	}
	if !job.ValidConsumerName(name) {
		return nil, &RejectedError{Reason: fmt.Sprintf("feed consumer %q: a name is 1 to 64 characters of [A-Za-z0-9_-]", name)}
	}
	if err := r.Validate(); err != nil {
		return nil, &RejectedError{Reason: fmt.Sprintf("feed consumer %s: %v", name, err)}
	}
	body, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("feed consumer %s: %w", name, err)
	}
	ctx, cancel := withDefaultTimeout(ctx, 10*time.Second)
	defer cancel()
	// Asked again alike, the same answer: sent again while none comes.
	m, err := c.ask(ctx, c.names.Request(c.tenant, "feed", name), body, sendAgain)
	if err != nil {
		return nil, fmt.Errorf("feed consumer %s: %w", name, err)
	}
	var e job.ErrorReply
	if json.Unmarshal(m.Data, &e) == nil && e.Error != "" {
		if e.Invalid {
			return nil, &RejectedError{Reason: e.Error}
		}
		return nil, fmt.Errorf("feed consumer %s: %s", name, e.Error)
	}
	var reply job.FeedReply
	if err := json.Unmarshal(m.Data, &reply); err != nil {
		return nil, fmt.Errorf("feed consumer %s: unreadable answer: %w", name, err)
	}
	return &reply, nil
}
