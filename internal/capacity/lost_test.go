package capacity

import (
	"context"
	"fmt"
	"testing"
	"time"
)

func TestLostWorkersAreKeptNewestFirstAndTrimmed(t *testing.T) {
	stores(t, func(t *testing.T, url string) {
		s := open(t, url)
		ctx := context.Background()
		now := time.Now().UTC().Truncate(time.Millisecond)
		// One too old to keep, then more than MaxLost recent ones.
		if err := s.RecordLost(ctx, LostWorker{WorkerID: "ancient", Pool: "p", LostAt: now.Add(-LostFor - time.Minute)}); err != nil {
			t.Fatal(err)
		}
		for i := range MaxLost + 5 {
			w := LostWorker{WorkerID: fmt.Sprintf("w%03d", i), Pool: "p", LostAt: now.Add(time.Duration(i) * time.Millisecond),
				Jobs: []Held{{JobID: fmt.Sprintf("j%d", i), Attempt: 2}}}
			if err := s.RecordLost(ctx, w); err != nil {
				t.Fatal(err)
			}
		}
		all, err := s.Lost(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(all) != MaxLost {
			t.Fatalf("kept %d lost workers, want %d", len(all), MaxLost)
		}
		newest := fmt.Sprintf("w%03d", MaxLost+4)
		if all[0].WorkerID != newest || len(all[0].Jobs) != 1 || all[0].Jobs[0].Attempt != 2 {
			t.Errorf("newest first: got %+v, want %s holding one job", all[0], newest)
		}
		for _, w := range all {
			if w.WorkerID == "ancient" || w.WorkerID == "w000" {
				t.Errorf("%s should have been trimmed", w.WorkerID)
			}
		}
		some, err := s.Lost(ctx, 3)
		if err != nil || len(some) != 3 || some[2].WorkerID != fmt.Sprintf("w%03d", MaxLost+2) {
			t.Errorf("Lost(3) = %v, %v", some, err)
		}
	})
}
