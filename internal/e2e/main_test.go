package e2e

import (
	"log/slog"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/fleet-dev/fleet/internal/capacity"
)

// TestMain fails the run if a goroutine outlives the tests: every part of
// the fleet the tests start in this process (dispatchers, workers, their
// ledgers, admission and reapers) must stop what it started. go-redis logs
// every failed dial of the outage tests; as in the commands, its lines go
// to debug.
func TestMain(m *testing.M) {
	redis.SetLogger(capacity.LibraryLogger(slog.New(slog.NewTextHandler(os.Stderr, nil))))
	goleak.VerifyTestMain(m)
}
