package dispatcher

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleet-dev/fleet/internal/natstest"
	"github.com/fleet-dev/fleet/job"
)

// The reply matcher pairs the core copy of a request with the answer for
// its stored copy, in whichever order they come.
func TestRepliesPairRequestsWithAnswers(t *testing.T) {
	srv := natstest.Run(t)
	nc := srv.Connect(t)
	r := newReplies(nc)
	inbox := func() (string, *nats.Subscription) {
		subj := nats.NewInbox()
		sub, err := nc.SubscribeSync(subj)
		if err != nil {
			t.Fatal(err)
		}
		return subj, sub
	}
	next := func(sub *nats.Subscription) string {
		m, err := sub.NextMsg(2 * time.Second)
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		return string(m.Data)
	}
	body := []byte(`{"command":["true"]}`)
	key := replyKey(body, nats.Header{})

	// Request first, then the answer.
	s1, sub1 := inbox()
	r.onRequest(&nats.Msg{Subject: "fleet.submit", Reply: s1, Data: body, Header: nats.Header{}})
	r.answer(key, &job.SubmitReply{JobID: "a"})
	if got := next(sub1); !strings.Contains(got, `"job_id":"a"`) {
		t.Errorf("answer %q", got)
	}
	// Answer first, then the request.
	s2, sub2 := inbox()
	r.answer(key, &job.SubmitReply{JobID: "b"})
	r.onRequest(&nats.Msg{Subject: "fleet.submit", Reply: s2, Data: body, Header: nats.Header{}})
	if got := next(sub2); !strings.Contains(got, `"job_id":"b"`) {
		t.Errorf("answer %q", got)
	}
	// Identical requests: each gets its own answer, oldest first.
	s3, sub3 := inbox()
	s4, sub4 := inbox()
	r.onRequest(&nats.Msg{Reply: s3, Data: body, Header: nats.Header{}})
	r.onRequest(&nats.Msg{Reply: s4, Data: body, Header: nats.Header{}})
	r.answer(key, &job.SubmitReply{JobID: "c"})
	r.answer(key, &job.SubmitReply{JobID: "d"})
	if a, b := next(sub3), next(sub4); !strings.Contains(a, `"c"`) || !strings.Contains(b, `"d"`) {
		t.Errorf("answers %q and %q", a, b)
	}
	// A publish without a reply subject waits for nothing, and unmatched
	// entries expire.
	r.onRequest(&nats.Msg{Data: body, Header: nats.Header{}})
	r.answer(key, &job.SubmitReply{JobID: "e"})
	r.mu.Lock()
	expire(r.early, time.Now().Add(time.Second))
	expire(r.waiting, time.Now().Add(time.Second))
	left := len(r.early) + len(r.waiting)
	r.mu.Unlock()
	if left != 0 {
		t.Errorf("%d entries left after expiry", left)
	}
}
