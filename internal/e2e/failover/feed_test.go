package failover

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/natstest"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// The feed reader is this test binary run again as a process of its own,
// so that it can be killed with SIGKILL as any consumer can: with
// feedReaderURLs set, TestMain runs readFeed instead of the tests.
const (
	feedReaderURLs     = "FLEET_TEST_FEED_URLS"
	feedReaderConsumer = "FLEET_TEST_FEED_CONSUMER"
)

// readFeed follows the default tenant's feed consumer through
// client.Feed, as an event consumer of the fleet would, and acknowledges
// each entry, waiting for the feed to store each acknowledgement. It
// prints a line for each entry it was given ("got <id> <seq>
// <delivered>"), before it acknowledges it, and, once the feed stored the
// acknowledgement, one more ("acked <id> <seq>"). It runs until it is killed, or the feed ends with
// an error.
func readFeed(urls, name string) int {
	nc, err := nats.Connect(urls, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		fmt.Fprintln(os.Stderr, "connect:", err)
		return 1
	}
	defer nc.Close()
	c, err := client.New(nc)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	out := bufio.NewWriter(os.Stdout)
	ctx := context.Background()
	for e, err := range c.Feed(ctx, name, &job.FeedRequest{AckWait: job.Duration(5 * time.Second)}) {
		if err != nil {
			fmt.Fprintln(os.Stderr, "feed:", err)
			return 1
		}
		// Said before the ack is sent: a reader killed after the feed
		// stored its ack, before it said so, is not given the entry again.
		fmt.Fprintf(out, "got %s %d %d\n", e.Record.ID, e.Seq, e.Delivered)
		if err := out.Flush(); err != nil {
			return 1
		}
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err = e.Ack(actx)
		cancel()
		if err == nil {
			fmt.Fprintf(out, "acked %s %d\n", e.Record.ID, e.Seq)
		} else {
			fmt.Fprintf(out, "unacked %s %d %v\n", e.Record.ID, e.Seq, err)
		}
		if err := out.Flush(); err != nil {
			return 1
		}
	}
	return 0
}

// feedReader is a process reading a feed consumer (readFeed), and the
// tally of what it and those before it acknowledged.
type feedReader struct {
	t      *testing.T
	urls   string
	name   string
	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{} // closed when cmd's output is read to its end
	stderr fleettest.SyncBuffer
	closed bool           // by the test's end: no reader starts again
	acked  map[string]int // by job id
	got    map[string]int
	lines  int
	kills  int
	change chan struct{} // poked on each line read
	starts int
}

func startFeedReader(t *testing.T, c *natstest.Cluster, name string) *feedReader {
	r := &feedReader{t: t, urls: c.URLs(), name: name, acked: map[string]int{}, got: map[string]int{}, change: make(chan struct{}, 1)}
	r.start()
	t.Cleanup(func() {
		r.mu.Lock()
		r.closed = true
		r.mu.Unlock()
		r.kill()
	})
	return r
}

func (r *feedReader) start() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), feedReaderURLs+"="+r.urls, feedReaderConsumer+"="+r.name)
	cmd.Stderr = &r.stderr
	// Gone with the test, however it ends.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err == nil {
		err = cmd.Start()
	}
	if err != nil {
		r.t.Errorf("starting the feed's reader: %v", err)
		return
	}
	r.starts++
	r.cmd, r.done = cmd, make(chan struct{})
	go func(done chan struct{}) {
		defer close(done)
		s := bufio.NewScanner(out)
		for s.Scan() {
			f := strings.Fields(s.Text())
			r.mu.Lock()
			r.lines++
			switch {
			case len(f) >= 2 && f[0] == "got":
				r.got[f[1]]++
			case len(f) >= 2 && f[0] == "acked":
				r.acked[f[1]]++
			}
			r.mu.Unlock()
			select {
			case r.change <- struct{}{}:
			default:
			}
		}
	}(r.done)
}

// kill kills the reader with SIGKILL, and waits for it to be gone.
func (r *feedReader) kill() {
	r.mu.Lock()
	cmd, done := r.cmd, r.done
	r.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-done
	_ = cmd.Wait()
}

// restartAfter kills the reader with SIGKILL after d, and starts another
// a second later.
func (r *feedReader) restartAfter(d time.Duration) {
	time.AfterFunc(d, func() {
		r.t.Logf("killing the feed's reader")
		r.mu.Lock()
		r.kills++
		r.mu.Unlock()
		r.kill()
		time.Sleep(time.Second)
		r.start()
	})
}

// requireEvery waits until the readers were given every one of ids and
// the consumer holds nothing more for them, and holds them to the feed's
// promise: each id acknowledged once, none twice. An id given and never
// said acknowledged is one whose reader was killed after the feed stored
// the acknowledgement, before the reader said so: at most one a kill, and
// then the consumer has nothing unacknowledged.
func (r *feedReader) requireEvery(t *testing.T, js jetstream.JetStream, ids []string, within time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	check := time.NewTicker(time.Second) // the consumer's state, once the readers' lines add up
	defer check.Stop()
	var cons jetstream.ConsumerInfo
	// state reports the ids not given yet, and those given but never
	// said acknowledged.
	state := func() (ungiven, unacked []string, kills int) {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, id := range ids {
			switch {
			case r.got[id] == 0:
				ungiven = append(ungiven, id)
			case r.acked[id] == 0:
				unacked = append(unacked, id)
			}
		}
		return ungiven, unacked, r.kills
	}
	for {
		ungiven, unacked, kills := state()
		if len(ungiven) == 0 && len(unacked) <= kills {
			c, err := js.Consumer(ctx, queue.Names{}.FeedStream(job.DefaultTenant), r.name)
			if err == nil {
				cons = *c.CachedInfo()
				if cons.NumAckPending == 0 && cons.NumPending == 0 {
					break
				}
			}
		}
		select {
		case <-r.change:
			continue
		case <-check.C:
			continue
		case <-ctx.Done():
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, id := range append(ungiven, unacked...)[:min(len(ungiven)+len(unacked), 10)] {
			t.Errorf("%s: given to a reader %d times, said acknowledged %d times", id, r.got[id], r.acked[id])
		}
		t.Errorf("after %s, the feed's readers were given %d of %d results, %d never said acknowledged (%d lines read, readers started %d times); the consumer: %d pending, %d unacknowledged; stderr:\n%s",
			within, len(ids)-len(ungiven), len(ids), len(unacked), r.lines, r.starts, cons.NumPending, cons.NumAckPending, r.stderr.String())
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	again, unsaid := 0, 0
	for _, id := range ids {
		if r.acked[id] > 1 {
			t.Errorf("%s: acknowledged %d times", id, r.acked[id])
		}
		if r.acked[id] == 0 {
			unsaid++
		}
		if r.got[id] > 1 {
			again++
		}
	}
	t.Logf("the feed's readers (started %d times) acknowledged each of %d results once (%d acknowledged as their reader was killed); %d were delivered more than once",
		r.starts, len(ids), unsaid, again)
}

// requireOnceInFeed checks that the feed stored the final version of each
// of ids once: the servers copied it from the pool's stream once, through
// the failures.
func requireOnceInFeed(t *testing.T, js jetstream.JetStream, ids []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	names := queue.Names{}
	s, err := js.Stream(ctx, names.FeedStream(job.DefaultTenant))
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(names.JobLive(job.DefaultTenant, "default", queue.KindResult, ">")))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if n := info.State.Subjects[names.JobLive(job.DefaultTenant, "default", queue.KindResult, id)]; n != 1 {
			t.Errorf("the feed holds %d final versions of %s", n, id)
		}
	}
}
