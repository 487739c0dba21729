// Package failover holds the tests that kill NATS servers under a steady
// load and bound what a job waits for it, in seconds: the chaos run on a
// cluster, a single server killed and restarted, the failover measured
// against the servers' own elections, and a pool's queue following its
// stream. Their bounds are the cluster's election timeouts plus what the
// fleet adds, so they measure the fleet only on a machine doing nothing
// else: `make test` runs this package alone, after the others.
package failover

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if urls := os.Getenv(feedReaderURLs); urls != "" {
		os.Exit(readFeed(urls, os.Getenv(feedReaderConsumer)))
	}
	goleak.VerifyTestMain(m)
}
