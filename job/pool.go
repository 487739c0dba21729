package job

import (
	"fmt"
	"time"
	"unicode"
)

// PoolState is what operators set about a pool while the fleet runs, kept
// in the pools bucket (<prefix>-pools) under the pool's name. A pool with
// no entry is not paused.
type PoolState struct {
	Pool string `json:"pool"`
	// Paused pools accept and keep jobs and start none; attempts already
	// running go on.
	Paused bool `json:"paused"`
	// Reason says why, as the operator who paused it put it.
	Reason string `json:"reason,omitempty"`
	// Since is when the pool was paused.
	Since     *time.Time `json:"since,omitempty"`
	UpdatedAt time.Time  `json:"updated_at"`
	// Policy is how the pool is shared between tenants; nil shares it
	// equally.
	Policy *PoolPolicy `json:"policy,omitempty"`
	// Tenants is how each tenant with work fares, in the answer to a show
	// (never stored).
	Tenants []TenantShare `json:"tenants,omitempty"`
	// Slots are the slots of the pool's live workers, in the answer to a
	// show, when the fleet has Redis.
	Slots int `json:"slots,omitempty"`
}

// PoolChange asks to pause or resume a pool, on the subject
// <prefix>.pools.<pool>.pause or .resume; the answer is the PoolState, or
// an ErrorReply. A request on <prefix>.pools.<pool>.show answers the
// state and how its tenants fare, and changes nothing; one on .set
// carries a PolicyChange.
type PoolChange struct {
	Reason string `json:"reason,omitempty"`
}

// MaxPoolReason bounds PoolChange.Reason, in bytes.
const MaxPoolReason = 256

// Validate checks a change.
func (c *PoolChange) Validate() error {
	if len(c.Reason) > MaxPoolReason {
		return fmt.Errorf("reason: %d bytes, over the limit of %d", len(c.Reason), MaxPoolReason)
	}
	for _, r := range c.Reason {
		if unicode.IsControl(r) {
			return fmt.Errorf("reason: must not hold control characters")
		}
	}
	return nil
}
