package job

import (
	"errors"
	"fmt"
	"time"
)

// FeedRequest asks a dispatcher for a durable consumer of its tenant's
// feed (schema feed.v1, request), on <prefix>.t.<tenant>.feed.<consumer>:
// the stream that keeps the final version and the rejection of every job
// of the tenant. The tenant then pulls and acknowledges the consumer; it
// may not create consumers itself (one that delivers could deliver onto
// any subject of the account).
//
// Asking again for a consumer that exists changes nothing and answers
// the same, as long as the request is the same; a consumer that exists
// with another start is refused: delete it first.
type FeedRequest struct {
	// From is where the consumer starts: "all" (the default: the first
	// message the feed still holds), "new" (the next one stored), or
	// nothing with StartSeq or StartTime.
	From string `json:"from,omitempty"`
	// StartSeq starts the consumer at this sequence of the feed.
	StartSeq uint64 `json:"start_seq,omitempty"`
	// StartTime starts it at the first message stored at or after it.
	StartTime *time.Time `json:"start_time,omitempty"`
	// Pool keeps only this pool's jobs; every pool's when empty.
	Pool string `json:"pool,omitempty"`
	// AckWait is how long a message pulled waits for its ack before it is
	// delivered again (30 s by default).
	AckWait Duration `json:"ack_wait,omitempty"`
	// MaxAckPending bounds the messages pulled and not yet acknowledged
	// (1,000 by default).
	MaxAckPending int `json:"max_ack_pending,omitempty"`
	// Inactive deletes the consumer once nobody has pulled it for this
	// long (10s to 720h); a consumer is kept until deleted by default.
	Inactive Duration `json:"inactive,omitempty"`
}

// FeedReply answers a FeedRequest (schema feed.v1, reply): where to pull.
type FeedReply struct {
	Stream   string `json:"stream"`
	Consumer string `json:"consumer"`
	// Subject is what the consumer keeps of the stream.
	Subject string `json:"subject"`
}

// Feed defaults and bounds.
const (
	DefaultFeedAckWait       = 30 * time.Second
	DefaultFeedMaxAckPending = 1000
	MaxFeedMaxAckPending     = 100000
)

// DecodeFeedRequest decodes and validates a feed consumer's request. An
// empty body asks for the defaults.
func DecodeFeedRequest(data []byte) (*FeedRequest, error) {
	var r FeedRequest
	if len(data) > 0 {
		if err := decodeStrict(data, &r); err != nil {
			return nil, fmt.Errorf("invalid feed request: %w", err)
		}
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return &r, nil
}

// Validate checks a feed request against the contract.
func (r *FeedRequest) Validate() error {
	var v validator
	starts := 0
	switch r.From {
	case "", "all":
	case "new":
		starts++
	default:
		v.add("from", "%q must be all or new", truncate(r.From, 40))
	}
	if r.StartSeq > 0 {
		starts++
	}
	if r.StartTime != nil {
		starts++
	}
	if starts > 1 {
		v.add("from", "give one of from: new, start_seq and start_time")
	}
	if r.Pool != "" && !ValidPool(r.Pool) {
		v.add("pool", "%q must be 1 to 64 characters of [A-Za-z0-9_-]", truncate(r.Pool, 40))
	}
	if r.AckWait < 0 || (r.AckWait > 0 && r.AckWait.Std() < time.Second) || r.AckWait.Std() > 12*time.Hour {
		v.add("ack_wait", "must be 1s to 12h")
	}
	if r.Inactive < 0 || (r.Inactive > 0 && r.Inactive.Std() < 10*time.Second) || r.Inactive.Std() > 720*time.Hour {
		v.add("inactive", "must be 10s to 720h")
	}
	if r.MaxAckPending < 0 || r.MaxAckPending > MaxFeedMaxAckPending {
		v.add("max_ack_pending", "must be 0 (the default) to %d", MaxFeedMaxAckPending)
	}
	if len(v.problems) > 0 {
		return fmt.Errorf("invalid feed request: %w", errors.New(joinProblems(v.problems)))
	}
	return nil
}

// ValidConsumerName reports whether s may name a feed's consumer: 1 to 64
// characters of [A-Za-z0-9_-], as a tenant's name.
func ValidConsumerName(s string) bool { return ValidPool(s) }
