package queue_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/natstest"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// TestPublishWaitsForItsStream publishes before the stream exists (no
// responders, as while a stream elects its leader): Publish sends again
// until the stream stores it, once.
func TestPublishWaitsForItsStream(t *testing.T) {
	s := natstest.Run(t)
	js, err := jetstream.New(s.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	go func() {
		time.Sleep(500 * time.Millisecond)
		_, _ = js.CreateStream(ctx, jetstream.StreamConfig{Name: "LATE", Subjects: []string{"late.>"}, Storage: jetstream.MemoryStorage})
	}()
	m := nats.NewMsg("late.one")
	m.Data = []byte("x")
	m.Header.Set(queue.HeaderMsgID, "late-one")
	start := time.Now()
	// Stored once, first: a try whose answer was lost may have stored it,
	// and then the answer Publish returns is its next try's, a duplicate
	// of the same sequence.
	ack, err := queue.Publish(ctx, js, m)
	if err != nil || ack.Sequence != 1 {
		t.Fatalf("publish: %+v %v", ack, err)
	}
	if waited := time.Since(start); waited < 400*time.Millisecond {
		t.Fatalf("stored after %s, before the stream existed", waited)
	}
	if ack, err = queue.Publish(ctx, js, m); err != nil || !ack.Duplicate || ack.Sequence != 1 {
		t.Fatalf("the same message again: %+v %v", ack, err)
	}
	// What waiting does not fix fails at once.
	bad := nats.NewMsg("late.two")
	bad.Header.Set(queue.HeaderMsgID, "late-two")
	bad.Header.Set(jetstream.ExpectedStreamHeader, "OTHER")
	if _, err := queue.Publish(ctx, js, bad); err == nil {
		t.Fatal("a publish the stream refuses succeeded")
	}
	noID := nats.NewMsg("late.three")
	if _, err := queue.Publish(ctx, js, noID); err == nil {
		t.Fatal("a message without an id was published, though it cannot be sent again safely")
	}
}

// TestResultIsPublishedOnce publishes a job's result twice: the second
// finds the first standing and returns it.
func TestResultIsPublishedOnce(t *testing.T) {
	s := natstest.Run(t)
	js, err := jetstream.New(s.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cfg := queue.Config{MemoryStorage: true, V1: true} // v1 results, which the bridge publishes
	if err := queue.Setup(ctx, js, cfg, nil); err != nil {
		t.Fatal(err)
	}
	n := cfg.WithDefaults().Names
	sc := s.Connect(t)
	heard, err := sc.SubscribeSync(n.Results("once"))
	if err == nil {
		err = sc.Flush() // subscribed on the server before anything is published
	}
	if err != nil {
		t.Fatal(err)
	}
	first := &job.Result{JobID: "once", Pool: "default", Status: job.StatusSucceeded, Attempts: 1, FinishedAt: time.Now()}
	if stood, err := queue.PublishResult(ctx, js, n, first); err != nil || stood != first {
		t.Fatalf("first result: %+v %v", stood, err)
	}
	second := &job.Result{JobID: "once", Pool: "default", Status: job.StatusCancelled, Attempts: 1, FinishedAt: time.Now()}
	stood, err := queue.PublishResult(ctx, js, n, second)
	if err != nil || stood.Status != job.StatusSucceeded {
		t.Fatalf("second result: %+v %v, want the first to stand", stood, err)
	}
	info, err := js.Stream(ctx, n.ResultsStream())
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := info.Info(ctx); st.State.Msgs != 1 {
		t.Fatalf("%d results stored", st.State.Msgs)
	}
	// A subscriber of the subject hears the stored result, once.
	m, err := heard.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := job.DecodeResult(m.Data); err != nil || r.Status != job.StatusSucceeded {
		t.Fatalf("heard %+v %v", r, err)
	}
	if m, err := heard.NextMsg(500 * time.Millisecond); err == nil {
		t.Fatalf("heard a second result: %s", m.Data)
	}
}
