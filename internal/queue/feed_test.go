package queue_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fleet-dev/fleet/internal/natstest"
	"github.com/fleet-dev/fleet/internal/queue"
)

// Dispatchers add pools to a tenant's feed at once, each having listed
// the pools before the others' streams existed: every update replaces the
// feed's whole configuration, and one may write back another's without
// its pool. Each checks after its update with a fresh listing, so that
// the feed ends with every pool, whichever update came last.
func TestConcurrentEnsuresLeaveTheFeedWithEveryPool(t *testing.T) {
	s := natstest.Run(t)
	js := newJS(t, s.Connect(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := queue.Config{Retention: time.Hour}
	const n = 8
	var pools []string
	for i := range n {
		p := fmt.Sprintf("p%d", i)
		if _, err := queue.EnsurePoolStream(ctx, js, cfg, p, nil); err != nil {
			t.Fatal(err)
		}
		pools = append(pools, p)
	}
	for round := range 5 {
		tenant := fmt.Sprintf("t%d", round)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				first := true
				list := func(context.Context) ([]string, error) {
					if first { // stale: only its own pool, as if it listed before the others'
						first = false
						return []string{pools[i]}, nil
					}
					return pools, nil
				}
				if err := queue.EnsureFeed(ctx, js, cfg, tenant, list, nil); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		st, err := js.Stream(ctx, cfg.WithDefaults().FeedStream(tenant))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, src := range st.CachedInfo().Config.Sources {
			got = append(got, src.Name)
		}
		slices.Sort(got)
		var want []string
		for _, p := range pools {
			want = append(want, "FLEET_POOL_"+p)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("round %d: the feed sources %q, want %q", round, got, want)
		}
	}
}

// A feed keeps its tenant's final versions and rejections, on their live
// subjects, and nothing else: no other kind, no other tenant's.
func TestAFeedKeepsItsTenantsEnds(t *testing.T) {
	s := natstest.Run(t)
	nc := s.Connect(t)
	js := newJS(t, nc)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := queue.Config{Retention: time.Hour}
	if _, err := queue.EnsurePoolStream(ctx, js, cfg, "gpu", nil); err != nil {
		t.Fatal(err)
	}
	for _, subj := range []string{"fleet.p.gpu.q3.acme.j1", "fleet.p.gpu.s.acme.j1", "fleet.p.gpu.r.acme.j1",
		"fleet.p.gpu.x.acme.j2", "fleet.p.gpu.r.beta.j3", "fleet.p.gpu.x.beta.j4"} {
		if _, err := js.Publish(ctx, subj, []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	pools := func(context.Context) ([]string, error) { return []string{"gpu"}, nil }
	if err := queue.EnsureFeed(ctx, js, cfg, "acme", pools, nil); err != nil {
		t.Fatal(err)
	}
	feed, err := js.Stream(ctx, "FLEET_FEED_acme")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for deadline := time.Now().Add(10 * time.Second); len(got) < 2; {
		info, err := feed.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs >= 2 {
			for seq := uint64(1); seq <= info.State.LastSeq; seq++ {
				m, err := feed.GetMsg(ctx, seq)
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, m.Subject)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the feed holds %d messages, want 2", info.State.Msgs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	want := []string{"fleet.t.acme.job.gpu.r.j1", "fleet.t.acme.job.gpu.x.j2"}
	if !slices.Equal(got, want) {
		t.Fatalf("the feed holds %q, want %q", got, want)
	}
	// Nothing may publish into it.
	if _, err := js.Publish(ctx, "fleet.t.acme.job.gpu.r.forged", []byte("{}")); !queue.IsNoStream(err) {
		t.Errorf("a publish on a feed's subject: %v; want no stream to take it", err)
	}
}
