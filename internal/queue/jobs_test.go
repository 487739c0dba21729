package queue_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/natstest"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// TestLastState reads a job's last state as its record goes from queued
// to running to succeeded: the final version is known by its subject.
func TestLastState(t *testing.T) {
	s := natstest.Run(t)
	js, err := jetstream.New(s.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := queue.Config{}.WithDefaults()
	if _, err := queue.EnsurePoolStream(ctx, js, c, "default", slog.Default()); err != nil {
		t.Fatal(err)
	}
	jobs := queue.NewJobs(js, c.Names)
	k := queue.JobKey{Tenant: "acme", Pool: "default", ID: "j1"}
	if _, _, err := jobs.LastState(ctx, k); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("a job without a record: %v, want ErrNotFound", err)
	}
	now := time.Now()
	rec := &job.Record{ID: k.ID, Tenant: k.Tenant, Pool: k.Pool, Priority: job.DefaultPriority, State: job.StateQueued,
		Event: job.EventQueued, SubmittedAt: now, UpdatedAt: now, Request: &job.Request{Command: []string{"true"}}}
	rev, err := jobs.Queue(ctx, rec, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []job.State{job.StateQueued, job.StateRunning, job.StateSucceeded} {
		if want != job.StateQueued {
			r := *rec
			r.State, r.Request = want, nil
			if rev, err = jobs.Write(ctx, &r, rev); err != nil {
				t.Fatal(err)
			}
		}
		state, final, err := jobs.LastState(ctx, k)
		switch {
		case err != nil:
			t.Fatalf("%s: %v", want, err)
		case final != want.Final():
			t.Fatalf("%s: final %v", want, final)
		case !final && state != want:
			t.Fatalf("state %q, want %q", state, want)
		}
	}
}
