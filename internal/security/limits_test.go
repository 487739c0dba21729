package security_test

import (
	"context"
	"strings"
	"testing"

	"github.com/fleet-dev/fleet/job"
)

// TestRequestAtTheLimitsRuns: the limits on a request are checked once,
// where it is received. A request within them runs even when its job
// message, which the dispatcher re-encodes, is larger than the request was
// (encoding/json writes "<" as six bytes), and the server's max_payload
// holds it.
func TestRequestAtTheLimitsRuns(t *testing.T) {
	f := startFleet(t)
	// As a producer writes it: json.Marshal would escape the "<" already.
	doc := `{"command":["ok"],"outputs":["out.txt"],"inputs":{"page.html":"` +
		strings.Repeat("<", job.DefaultLimits.MaxInputBytes) + `"}}`
	// The client's own deadline (30 s): the job message is 1.5 MB, and
	// under -race on a loaded machine its dispatcher took more than the
	// 10 s this test once gave it (each try over the dispatcher's 5 s per
	// submission, and sent again).
	s, err := f.client.SubmitJSON(context.Background(), []byte(doc))
	if err != nil {
		t.Fatalf("submit: %v", err)
	}
	if res := f.result(t, s.JobID); res.Status != job.StatusSucceeded {
		t.Fatalf("result: %+v", res)
	}
	f.noViolations(t)
}
