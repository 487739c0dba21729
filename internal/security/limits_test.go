package security_test

import (
	"context"
	"strings"
	"testing"
	"time"

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
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := f.client.SubmitJSON(ctx, []byte(doc))
	if err != nil {
		t.Fatalf("submit: %v", err)
	}
	if res := f.result(t, s.JobID); res.Status != job.StatusSucceeded {
		t.Fatalf("result: %+v", res)
	}
	f.noViolations(t)
}
