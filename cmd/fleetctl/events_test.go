package main

import (
	"context"
	"encoding/json"
	"flag"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/internal/dispatcher"
	"github.com/fleet-dev/fleet/internal/executor/noop"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/worker"
	"github.com/fleet-dev/fleet/job"
)

// lines is a writer that hands each write on, as one line.
type lines chan string

func (l lines) Write(p []byte) (int, error) {
	l <- string(p)
	return len(p), nil
}

// ids reads the job ids of events' text lines.
func ids(out string) []string {
	var ids []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(l); len(f) >= 5 {
			ids = append(ids, f[4])
		}
	}
	slices.Sort(ids)
	return ids
}

// fleetctl events prints how the tenant's jobs ended, from its feed, then
// stops. Through --consumer it goes on after the last entry it printed;
// without, a consumer of its own is made and deleted. With --follow, it
// prints what ends later, until it is interrupted.
func TestEventsGoOnWhereTheirConsumerLeftOff(t *testing.T) {
	f := fleettest.Start(t)
	f.Worker(t, noop.Executor{}, worker.Config{Pool: "default", Slots: 2})
	url := f.NATS.URL()
	c, err := client.New(f.NATS.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := func(ids ...string) {
		t.Helper()
		for _, id := range ids {
			if _, err := c.Submit(ctx, &job.Request{ID: id, Command: []string{"true"}}); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Result(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
	}
	js, err := jetstream.New(f.NC)
	if err != nil {
		t.Fatal(err)
	}
	// fed waits for the feed to hold n entries: it copies each from the
	// pool's stream a moment after the pool's stream stored it.
	fed := func(n uint64) {
		t.Helper()
		for {
			s, err := js.Stream(ctx, "FLEET_FEED_default")
			if err == nil && s.CachedInfo().State.Msgs >= n {
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("the feed does not hold %d entries: %v", n, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	done("ev-1", "ev-2", "ev-3")
	if _, err := c.Submit(ctx, &job.Request{ID: "ev-bad", Command: []string{"true"}, Priority: 9}); err == nil {
		t.Fatal("a request at priority 9 was accepted")
	}
	fed(4)

	code, out, errOut := fleetctl(t, "--nats-url", url, "events", "--consumer", "audit")
	if got := ids(out); code != exitOK || !slices.Equal(got, []string{"ev-1", "ev-2", "ev-3", "ev-bad"}) ||
		!strings.Contains(out, "succeeded, exit code 0, 1 attempt(s)") || !strings.Contains(out, "rejected: ") {
		t.Fatalf("events: exit %d, ids %v, stdout %q, stderr %q", code, got, out, errOut)
	}
	code, out, errOut = fleetctl(t, "--nats-url", url, "events", "--consumer", "audit", "--since", "1h")
	if code != exitOK || out != "" {
		t.Fatalf("events again through audit: exit %d, stdout %q, stderr %q; want nothing new", code, out, errOut)
	}
	done("ev-4")
	fed(5)
	code, out, errOut = fleetctl(t, "--nats-url", url, "events", "--consumer", "audit", "-o", "json")
	var rec job.Record
	if code != exitOK || strings.Count(out, "\n") != 1 || json.Unmarshal([]byte(out), &rec) != nil || rec.ID != "ev-4" || rec.Result == nil {
		t.Fatalf("events through audit after ev-4: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, out, errOut = fleetctl(t, "--nats-url", url, "events", "--from", "2")
	if got := ids(out); code != exitOK || len(got) != 4 || slices.Contains(got, "ev-1") {
		t.Fatalf("events --from 2: exit %d, ids %v, stderr %q", code, got, errOut)
	}
	feed, err := js.Stream(ctx, "FLEET_FEED_default")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for n := range feed.ConsumerNames(ctx).Name() {
		names = append(names, n)
	}
	if !slices.Equal(names, []string{"audit"}) {
		t.Errorf("the feed's consumers after the commands: %v; want audit alone", names)
	}

	for _, bad := range [][]string{{"--since", "yesterday"}, {"--since", "1h", "--from", "3"}, {"--consumer", "a.b"}, {"extra"}} {
		if code, _, errOut := fleetctl(t, append([]string{"--nats-url", url, "events"}, bad...)...); code != exitUsage {
			t.Errorf("events %v: exit %d, stderr %q; want %d", bad, code, errOut, exitUsage)
		}
	}

	// --follow prints what ends after it started, until it is interrupted.
	e := &env{stderr: &strings.Builder{}}
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	e.globalFlags(fs, false)
	if err := fs.Parse([]string{"--nats-url", url}); err != nil {
		t.Fatal(err)
	}
	defer e.close()
	got := make(lines, 16)
	e.stdout = got
	fctx, stop := context.WithCancel(ctx)
	ended := make(chan error, 1)
	go func() { ended <- events(fctx, e, eventsOptions{consumer: "audit", follow: true}, time.Now()) }()
	done("ev-5")
	select {
	case l := <-got:
		if !strings.Contains(l, " ev-5 ") {
			t.Errorf("--follow printed %q; want ev-5", l)
		}
	case err := <-ended:
		t.Fatalf("--follow ended: %v", err)
	}
	stop()
	if err := <-ended; err != nil {
		t.Errorf("--follow, interrupted: %v", err)
	}
	if n := len(got); n != 0 {
		t.Errorf("--follow printed %d lines more", n)
	}
}

// On a fleet that keeps no feeds, events is refused, saying why.
func TestEventsWithoutFeedsSayWhy(t *testing.T) {
	f := fleettest.Start(t, func(c *dispatcher.Config) { c.NoFeeds = true })
	code, out, errOut := fleetctl(t, "--nats-url", f.NATS.URL(), "events")
	if code != exitUsage || out != "" || !strings.Contains(errOut, "keeps no feeds") {
		t.Errorf("events without feeds: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}
