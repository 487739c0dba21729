package dispatcher

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/internal/telemetry"
	"github.com/fleet-dev/fleet/job"
)

// intakeOne processes one stored submission (of the v2 intake stream, or
// the v1 submit stream). The message is acknowledged once its job is
// queued (or it is rejected); if the fleet cannot decide now, it is
// redelivered. A v1 submission's request is answered here, when the
// dispatcher saw it (see replies).
func (d *Dispatcher) intakeOne(ctx context.Context, msg jetstream.Msg) {
	meta, err := msg.Metadata()
	if err != nil {
		d.log.Warn("submission without metadata", "err", err)
		_ = msg.Term()
		return
	}
	ctx, cancel := context.WithTimeout(ctx, submitDeadline)
	defer cancel()
	pctx := telemetry.Propagator.Extract(ctx, queue.HeaderCarrier(msg.Headers()))
	reply, err := d.process(pctx, d.tenantOf(msg.Subject()), msg.Data())
	if err != nil {
		d.log.Warn("submission not processed; it will be redelivered", "err", err)
		_ = msg.NakWithDelay(time.Second)
		return
	}
	if err := msg.Ack(); err != nil {
		d.log.Warn("ack submission", "err", err)
	}
	if msg.Subject() == d.names.Submit() {
		reply.Stream, reply.Seq = meta.Stream, meta.Sequence.Stream
		d.replies.answer(replyKey(msg.Data(), msg.Headers()), reply)
	}
}

// replies pairs requests with their answers.
//
// JetStream keeps no reply subject with a stored message, and the submit
// stream must capture every submission, with or without a reply subject,
// so that none is lost while no dispatcher runs. So every dispatcher also
// subscribes to the submit subject and notes the reply subject of each
// request it sees; the dispatcher that processes the stored copy answers
// that reply subject. The two copies are matched by their content and
// message id, oldest first; whichever arrives second completes the pair.
// Identical requests without ids are distinct jobs: each gets its own
// answer. Unmatched entries expire.
//
// With several dispatchers, each holds every reply subject, and two of them
// may pick the same one for two identical requests. So then a dispatcher
// claims a reply subject (a create in the intake bucket, which only one can
// win) before it answers; alone, it needs no claim.
type replies struct {
	nc      *nats.Conn
	claim   func(subject string) bool // reports whether this dispatcher won the subject
	peers   func() bool               // reports whether other dispatchers run
	mu      sync.Mutex
	waiting map[[32]byte][]pending // requests not answered yet
	early   map[[32]byte][]pending // answers whose request was not seen yet
}

type pending struct {
	at   time.Time
	subj string // the reply subject, for waiting
	data []byte // the answer, for early
}

// How long unmatched entries live. A request's copy and its stored copy
// reach a dispatcher within milliseconds; a request is answered while its
// stored copy waits in the stream for up to waitingTTL.
const (
	waitingTTL = 30 * time.Second
	earlyTTL   = 5 * time.Second
)

func newReplies(nc *nats.Conn) *replies {
	return &replies{nc: nc, waiting: map[[32]byte][]pending{}, early: map[[32]byte][]pending{},
		claim: func(string) bool { return true }, peers: func() bool { return false }}
}

func replyKey(data []byte, h nats.Header) [32]byte {
	s := sha256.New()
	s.Write(data)
	s.Write([]byte{0})
	s.Write([]byte(h.Get(nats.MsgIdHdr)))
	var k [32]byte
	s.Sum(k[:0])
	return k
}

// owns reports whether this dispatcher may answer subject.
func (r *replies) owns(subject string) bool { return !r.peers() || r.claim(subject) }

// onRequest sees the core copy of a submission.
func (r *replies) onRequest(m *nats.Msg) {
	if m.Reply == "" {
		return
	}
	k := replyKey(m.Data, m.Header)
	r.mu.Lock()
	ans, ok := shift(r.early, k)
	if !ok {
		r.waiting[k] = append(r.waiting[k], pending{at: time.Now(), subj: m.Reply})
		r.mu.Unlock()
		return
	}
	r.mu.Unlock()
	if r.owns(m.Reply) {
		_ = r.nc.Publish(m.Reply, ans.data)
		return
	}
	// Another dispatcher answered this request: the answer waits for the
	// next identical one.
	r.mu.Lock()
	r.early[k] = append([]pending{ans}, r.early[k]...)
	r.mu.Unlock()
}

// answer sends the answer for a processed stored copy.
func (r *replies) answer(k [32]byte, reply *job.SubmitReply) {
	data, err := json.Marshal(reply)
	if err != nil {
		return
	}
	for {
		r.mu.Lock()
		w, ok := shift(r.waiting, k)
		if !ok {
			r.early[k] = append(r.early[k], pending{at: time.Now(), data: data})
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		if r.owns(w.subj) {
			_ = r.nc.Publish(w.subj, data)
			return
		}
		// Answered by another dispatcher: try the next one.
	}
}

// shift takes the oldest entry of key k.
func shift(m map[[32]byte][]pending, k [32]byte) (pending, bool) {
	q := m[k]
	if len(q) == 0 {
		return pending{}, false
	}
	p := q[0]
	if len(q) == 1 {
		delete(m, k)
	} else {
		m[k] = q[1:]
	}
	return p, true
}

// sweep drops expired entries; the dispatcher calls it every second.
func (r *replies) sweep(context.Context) {
	now := time.Now()
	r.mu.Lock()
	expire(r.waiting, now.Add(-waitingTTL))
	expire(r.early, now.Add(-earlyTTL))
	r.mu.Unlock()
}

func expire(m map[[32]byte][]pending, before time.Time) {
	for k, q := range m {
		i := 0
		for i < len(q) && q[i].at.Before(before) {
			i++
		}
		switch {
		case i == len(q):
			delete(m, k)
		case i > 0:
			m[k] = q[i:]
		}
	}
}
