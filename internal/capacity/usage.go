package capacity

import (
	"math"
	"time"
)

// A tenant's usage is the slot time it held, decayed with the pool's
// half-life: held k slots for long, it tends to k·H/ln 2 slot-time. The
// Lua scripts (scripts.go) keep it in Redis with the same formula; these
// are the Go side's, the one place it is written in Go.

// Decay is usage u decayed over d with half-life hl.
func Decay(u float64, d, hl time.Duration) float64 {
	if d <= 0 || hl <= 0 {
		return u
	}
	return u * math.Pow(2, -float64(d)/float64(hl))
}

// UsageSlots converts decayed usage in slot-milliseconds to the average
// slots held over the last half-life.
func UsageSlots(slotMillis float64, hl time.Duration) float64 {
	if hl <= 0 {
		return 0
	}
	return slotMillis * math.Ln2 / float64(hl.Milliseconds())
}
