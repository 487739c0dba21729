package producer

import (
	"encoding/json"
	"log/slog"
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// word is a dispatcher's word on a pool's state, as tellWorkers says it.
func word(t *testing.T, s *job.PoolState, rev uint64) *nats.Msg {
	t.Helper()
	data, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg("fleet.queues.p")
	m.Header.Set(queue.HeaderPoolRevision, strconv.FormatUint(rev, 10))
	m.Data = data
	return m
}

// A word heard before a delivery is applied when the delivery is handed
// on, and a state of an older revision (a watch or a read that lags) does
// not undo it.
func TestThePoolsStateFollowsItsLatestRevision(t *testing.T) {
	w := &Producer{cfg: &Config{Pool: "p"}, log: slog.New(slog.DiscardHandler), words: make(chan *nats.Msg, wordsKept)}
	w.setPool(&job.PoolState{Pool: "p"}, 3) // read as it started

	w.words <- &nats.Msg{Subject: "fleet.queues.p", Data: []byte("q3-acme")} // a new queue: not a state
	w.words <- word(t, &job.PoolState{Pool: "p", Paused: true}, 5)
	if w.pause.paused() {
		t.Fatal("paused before the word was applied")
	}
	w.catchUp()
	if !w.pause.paused() || len(w.words) != 0 {
		t.Fatalf("after catchUp: paused %v, %d words left", w.pause.paused(), len(w.words))
	}
	w.setPool(&job.PoolState{Pool: "p"}, 4) // the watch, behind the word
	if !w.pause.paused() {
		t.Fatal("an older revision resumed the pool")
	}
	w.setPool(&job.PoolState{Pool: "p", Policy: &job.PoolPolicy{MaxRunning: 2}}, 6)
	if w.pause.paused() || w.policy.Load().MaxRunning != 2 {
		t.Fatalf("revision 6: paused %v, policy %v", w.pause.paused(), w.policy.Load())
	}
}
