package failover

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/client"
	"github.com/fleet-dev/fleet/internal/fleettest"
	"github.com/fleet-dev/fleet/internal/historytest"
	"github.com/fleet-dev/fleet/internal/natstest"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// kill is a node killed during a run, at a time, picked by pick; a node
// not killed before in the run when pick is nil or picks one that was (on
// a cluster, each server is killed once a run).
type kill struct {
	at   time.Duration
	why  string
	pick func() int
}

// run is what offer measured.
type run struct {
	jobs             int
	took, p50, worst time.Duration
	lost             int // attempts lost with a worker or a node
	unheard          int // results stored but heard by no subscriber
	// each job's times: sent, then finished (zero without a result).
	timings []timing
	// history is every version of the run's jobs, as stored.
	history *historytest.Pool
}

// timing is when a job was sent and when it finished.
type timing struct {
	id             string
	sent, finished time.Time
}

func (r run) rate() float64 { return float64(r.jobs) / r.took.Seconds() }

// report logs a run with servers killed, and holds it to the failover
// targets (fleettest.Target): the worst submit→result under 10 s, and,
// when there was an undisturbed run (calm, with the targets on), the
// throughput at 0.9 times its own or more.
func report(t *testing.T, name string, r, calm run) {
	t.Helper()
	t.Logf("%s: %d jobs in %s, %.0f jobs/s, submit→result p50 %s, worst %s; %d attempts lost, %d results heard by no subscriber",
		name, r.jobs, r.took.Round(time.Millisecond), r.rate(), r.p50.Round(time.Millisecond),
		r.worst.Round(time.Millisecond), r.lost, r.unheard)
	fleettest.Target(t, r.worst <= 10*time.Second, "%s: the worst submit→result latency was %s, over 10 s", name, r.worst)
	if calm.jobs > 0 {
		fleettest.Target(t, r.rate() >= 0.9*calm.rate(), "%s: %.0f jobs/s, under 0.9 × the %.0f jobs/s of the undisturbed run",
			name, r.rate(), calm.rate())
	}
}

// offer submits n jobs at rate per second through the seed list, killing
// nodes as storm says (each restarted two seconds later), and waits for
// every job to succeed. Two subscribers, on two different nodes, hear the
// results. At the end, the history of every job, as the pool's stream
// holds it, passes historytest: one final version, none after it, no
// attempt going back, no result heard twice.
func offer(t *testing.T, c *natstest.Cluster, prefix string, n, rate int, stored bool, storm []kill) run {
	t.Helper()
	names := queue.Names{}
	var ears []*historytest.Ear
	for i := range 2 {
		nc, err := nats.Connect(c.URL(i%c.Size()), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		ears = append(ears, historytest.Listen(t, nc, names, job.DefaultTenant, "default"))
	}
	nc := c.Connect(t)
	cl, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}

	began := time.Now()
	down := map[int]bool{} // killed in this run
	type restart struct {
		node int
		at   time.Time
	}
	var restarts []restart
	sent := make([]time.Time, n)
	ids := make([]string, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for i := range n {
		<-tick.C
		if len(restarts) > 0 && time.Now().After(restarts[0].at) {
			c.Restart(restarts[0].node)
			restarts = restarts[1:]
		}
		if len(storm) > 0 && time.Since(began) > storm[0].at {
			k := storm[0]
			storm = storm[1:]
			victim := -1
			if k.pick != nil {
				victim = k.pick()
			}
			if victim >= 0 && down[victim] && c.Size() > 1 {
				victim = -1 // the servers are killed in turn, each once a run
			}
			for j := 0; victim < 0 && j < c.Size(); j++ {
				if !down[j] && c.Running(j) {
					victim = j
				}
			}
			for j := 0; victim < 0 && j < c.Size(); j++ {
				if c.Running(j) { // a single server, killed again
					victim = j
				}
			}
			if victim >= 0 && c.Running(victim) {
				t.Logf("%s: killing %s, %s", time.Since(began).Round(10*time.Millisecond), c.Name(victim), k.why)
				down[victim] = true
				c.Kill(victim)
				restarts = append(restarts, restart{victim, time.Now().Add(2 * time.Second)})
			} else {
				t.Errorf("%s: no node to kill for %s", time.Since(began).Round(10*time.Millisecond), k.why)
			}
		}
		id := fmt.Sprintf("%s.%04d", prefix, i)
		ids[i] = id
		sent[i] = time.Now()
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			req := &job.Request{ID: id, Command: []string{"true"}}
			if !stored {
				if _, err := cl.Submit(ctx, req); err != nil {
					errs <- fmt.Errorf("submit %s: %w", id, err)
				}
				return
			}
			// As a producer that keeps no connection to a dispatcher: a
			// JetStream publish, sent again with its id until the stream
			// acknowledges it.
			m := nats.NewMsg("fleet.t.default.intake")
			m.Data, _ = json.Marshal(req)
			m.Header.Set(nats.MsgIdHdr, id)
			if _, err := queue.Publish(ctx, js, m); err != nil {
				errs <- fmt.Errorf("publish %s: %w", id, err)
			}
		}()
	}
	for _, r := range restarts {
		time.Sleep(time.Until(r.at))
		c.Restart(r.node)
	}
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}

	// Every job succeeds.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := run{jobs: n}
	var lats []time.Duration
	var last time.Time
	for i, id := range ids {
		res, err := cl.Result(ctx, id)
		if err != nil {
			// The history below says what became of it.
			t.Errorf("result of %s: %v", id, err)
			continue
		}
		if res.Status != job.StatusSucceeded {
			t.Errorf("%s: %s (%+v)", id, res.Status, res.Failure)
		}
		r.lost += len(res.History)
		r.timings = append(r.timings, timing{id: id, sent: sent[i], finished: res.FinishedAt})
		if res.FinishedAt.After(last) {
			last = res.FinishedAt
		}
		lats = append(lats, res.FinishedAt.Sub(sent[i]))
		if res.FinishedAt.Sub(sent[i]) > 8*time.Second {
			// Where the time went, for the slowest: to be accepted, to
			// start, to finish.
			if st, err := cl.Status(ctx, id); err == nil {
				t.Logf("slow %s: sent at %s, accepted +%s, started +%s, finished +%s on %s",
					id, sent[i].Sub(began).Round(time.Millisecond), st.Job.SubmittedAt.Sub(sent[i]).Round(time.Millisecond),
					res.StartedAt.Sub(sent[i]).Round(time.Millisecond), res.FinishedAt.Sub(sent[i]).Round(time.Millisecond), res.WorkerID)
			}
		}
	}
	c.WaitReady(t, 30*time.Second)
	r.took = last.Sub(began)
	slices.Sort(lats)
	if len(lats) > 0 {
		r.p50, r.worst = lats[len(lats)/2], lats[len(lats)-1]
	}

	// Heard: a stream republishes what it stored once, as core NATS: a
	// result stored just before its stream's leader dies may reach no
	// subscriber (it is in the stream, where client.Result reads it); the
	// run says how many were heard. None is heard twice.
	time.Sleep(time.Second)
	for _, id := range ids {
		if ears[0].Heard(id)+ears[1].Heard(id) == 0 {
			r.unheard++
		}
	}
	r.history = historytest.Require(t, js, names, job.DefaultTenant, "default", prefix+".", ids, ears...)
	return r
}
