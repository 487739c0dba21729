package e2e

import (
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/historytest"
	"github.com/fleet-dev/fleet/internal/queue"
)

// Every test here that kills or stops a process or a server while jobs
// run ends with requireHistory (see internal/historytest): each job of the
// run has one final version, none after it, no attempt going back, every
// version written against the one before it, and an ear, started before
// the jobs were submitted, heard no result twice.

// listen starts an ear on nc for the results of tenant's jobs of pool.
func listen(t *testing.T, nc *nats.Conn, tenant, pool string) *historytest.Ear {
	t.Helper()
	return historytest.Listen(t, nc, queue.Names{}, tenant, pool)
}

// requireHistory reads, through nc, every version of tenant's jobs of
// pool whose id starts with prefix, and fails t on anything
// historytest.Require finds: ids must each have ended.
func requireHistory(t *testing.T, nc *nats.Conn, tenant, pool, prefix string, ids []string, ears ...*historytest.Ear) *historytest.Pool {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return historytest.Require(t, js, queue.Names{}, tenant, pool, prefix, ids, ears...)
}

// copies returns a channel closed once n requests have been sent on
// tenant's submit subject: a client's first copy and those it sends again
// when nobody answers.
func copies(t *testing.T, nc *nats.Conn, tenant string, n int) <-chan struct{} {
	t.Helper()
	done := make(chan struct{})
	var mu sync.Mutex
	seen := 0
	sub, err := nc.Subscribe(queue.Names{}.SubmitV2(tenant), func(*nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		if seen++; seen == n {
			close(done)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return done
}
