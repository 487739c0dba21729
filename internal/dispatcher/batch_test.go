package dispatcher_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/dispatcher"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/job"
)

// closedPool refuses every request for pool "closed".
type closedPool struct{}

func (closedPool) Admit(_ context.Context, r *job.Request) (string, error) {
	if r.Pool == "closed" {
		return "", errors.New("pool closed takes no job")
	}
	return "", nil
}

// TestABatchOfSubmissionsIsAnsweredAsEachAlone: the batch the scheduler
// submits its firings in (their writes sent together, their answers read
// as they come) gives each request the answer it would get alone: new ids
// queued once each, an id taken a duplicate, two of one id in the batch
// one job and one duplicate, a request the admission refuses rejected
// with its reason, a tenant that is none rejected. What the stream holds
// agrees: one first version per job queued, none for the others.
func TestABatchOfSubmissionsIsAnsweredAsEachAlone(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t, func(c *dispatcher.Config) { c.Admission = closedPool{} })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := f.Client.Submit(ctx, &job.Request{ID: "taken", Command: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	var reqs []*job.Request
	for i := range 300 {
		reqs = append(reqs, &job.Request{ID: fmt.Sprintf("new-%03d", i), Command: []string{"true"}})
	}
	reqs = append(reqs,
		&job.Request{ID: "taken", Command: []string{"true"}},
		&job.Request{ID: "twice", Command: []string{"true"}},
		&job.Request{ID: "twice", Command: []string{"true"}},
		&job.Request{ID: "refused", Pool: "closed", Command: []string{"true"}})
	replies, errs := f.Dispatcher.SubmitBatch(ctx, job.DefaultTenant, reqs)
	queued, duplicates := map[string]int{}, map[string]int{}
	for i, r := range replies {
		if errs[i] != nil {
			t.Fatalf("request %d (%s): %v", i, reqs[i].ID, errs[i])
		}
		switch {
		case r.Rejected():
			if r.JobID != "refused" || !strings.Contains(r.Error, "pool closed takes no job") {
				t.Errorf("request %s rejected: %q", r.JobID, r.Error)
			}
		case r.Duplicate:
			duplicates[r.JobID]++
		default:
			if r.State != job.StateQueued || r.Pool != job.DefaultPool {
				t.Errorf("request %s: %+v, want queued in pool default", r.JobID, r)
			}
			queued[r.JobID]++
		}
	}
	if len(queued) != 301 || queued["twice"] != 1 || queued["taken"] != 0 {
		t.Errorf("queued %d ids (twice %d times, taken %d times), want the 300 new ones and twice, once each",
			len(queued), queued["twice"], queued["taken"])
	}
	if duplicates["taken"] != 1 || duplicates["twice"] != 1 || len(duplicates) != 2 {
		t.Errorf("duplicates %v, want taken and the second twice", duplicates)
	}

	// Not a tenant: refused, its reason said.
	replies, errs = f.Dispatcher.SubmitBatch(ctx, "not a tenant", []*job.Request{{ID: "x", Command: []string{"true"}}})
	if errs[0] != nil || !replies[0].Rejected() || !strings.Contains(replies[0].Error, "tenant") {
		t.Errorf("a request of no tenant: %+v, %v", replies[0], errs[0])
	}

	// The stream holds one first version of each job queued.
	js, err := jetstream.New(f.NC)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, "FLEET_POOL_default")
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter("fleet.p.default.>"))
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]uint64{}
	for subject, n := range info.State.Subjects {
		// fleet.p.<pool>.<kind>.<tenant>.<id>: the queued kinds are q<priority>.
		if tok := strings.Split(subject, "."); len(tok) == 6 && strings.HasPrefix(tok[3], "q") {
			counts[tok[5]] += n
		}
	}
	if len(counts) != 302 { // the 300, twice and taken
		t.Errorf("%d jobs have a queued version, want 302", len(counts))
	}
	for id, n := range counts {
		if n != 1 {
			t.Errorf("job %s has %d queued versions, want 1", id, n)
		}
	}
}
