// Package noop completes every attempt at once without running anything.
// It measures the fleet's own overhead: everything but the work itself.
package noop

import (
	"context"
	"time"

	"github.com/fleet-dev/fleet/internal/executor"
)

// Executor succeeds at once.
type Executor struct{}

var _ executor.Executor = Executor{}

// Run reports success without doing anything.
func (Executor) Run(ctx context.Context, t *executor.Task) (*executor.Outcome, error) {
	return executor.Succeeded(time.Now(), nil), nil
}
