package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/internal/dispatcher"
	"github.com/fleet-dev/fleet/internal/executor/noop"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/natstest"
	"github.com/fleet-dev/fleet/internal/worker"
	"github.com/fleet-dev/fleet/job"
)

// Several dispatchers set up the same streams at once and share the
// submissions; each request gets exactly one answer, whichever dispatcher
// processes it, and each job one result (historytest).
func TestSeveralDispatchersShareTheWork(t *testing.T) {
	srv := natstest.Run(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var ds []*dispatcher.Dispatcher
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i := 0; i < 3; i++ {
		d, err := dispatcher.New(srv.Connect(t), dispatcher.Config{Logger: fleettest.Logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := d.Start(ctx); err != nil {
				t.Error(err)
			}
			mu.Lock()
			ds = append(ds, d)
			mu.Unlock()
		}()
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, d := range ds {
			_ = d.Stop(context.Background())
		}
	})
	w, err := worker.New(srv.Connect(t), noop.Executor{}, worker.Config{ID: "w", Backend: "noop", Slots: 16, Logger: fleettest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop(context.Background()) })

	nc := srv.Connect(t)
	c, _ := client.New(nc)
	ear := listen(t, nc, job.DefaultTenant, "default")
	const n = 60
	ids := make(chan string, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Half with ids, half without: both kinds are answered once.
			var body []byte
			if i%2 == 0 {
				body, _ = json.Marshal(&job.Request{ID: fmt.Sprintf("shared-%d", i), Command: []string{"true"}})
			} else {
				body, _ = json.Marshal(&job.Request{Command: []string{"true"}})
			}
			sub, err := c.SubmitJSON(ctx, body)
			if err != nil {
				t.Error(err)
				return
			}
			ids <- sub.JobID
		}()
	}
	wg.Wait()
	close(ids)
	seen := map[string]bool{}
	for id := range ids {
		if seen[id] {
			t.Errorf("two submissions got the same job id %s", id)
		}
		seen[id] = true
		r, err := c.Result(ctx, id)
		if err != nil || r.Status != job.StatusSucceeded {
			t.Errorf("%s: %+v %v", id, r, err)
		}
	}
	if len(seen) != n {
		t.Errorf("%d answers for %d submissions", len(seen), n)
	}
	requireHistory(t, nc, job.DefaultTenant, "default", "", slices.Collect(maps.Keys(seen)), ear)
}
