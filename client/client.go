// Package client is the Go client of a fleet, for producers and event
// consumers: submit a request, watch a job's events, wait for its result,
// cancel it.
//
//	nc, _ := nats.Connect(nats.DefaultURL)
//	c, _ := client.New(nc)
//	sub, err := c.Submit(ctx, &job.Request{Command: []string{"echo", "hi"}})
//	res, err := c.Result(ctx, sub.JobID)
//
// Everything goes through NATS; the client needs no other address.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"

	"github.com/fleet-dev/fleet/internal/artifact"
	"github.com/fleet-dev/fleet/internal/lifecycle"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// Client talks to a fleet over a NATS connection.
//
// A client acts as one tenant (WithTenant): it submits as that tenant and
// reads that tenant's jobs only. On a fleet whose NATS users are confined
// to their tenant (deploy/nats), a client can do nothing as another.
type Client struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	names  queue.Names
	tenant string
	arts   *artifact.Store
	once   sync.Once // makes arts
}

// Option configures a Client.
type Option func(*Client) error

// ErrInvalidOption wraps errors of options.
var ErrInvalidOption = errors.New("invalid option")

// WithPrefix sets the fleet's subject prefix. Defaults to "fleet".
func WithPrefix(p string) Option {
	return func(c *Client) error {
		if p == "" {
			return fmt.Errorf("%w: empty prefix", ErrInvalidOption)
		}
		c.names.Prefix = p
		return nil
	}
}

// WithTenant sets the tenant the client acts as. Defaults to
// job.DefaultTenant, the tenant of a fleet whose producers do not
// authenticate.
func WithTenant(t string) Option {
	return func(c *Client) error {
		if !job.ValidTenant(t) {
			return fmt.Errorf("%w: tenant %q must be 1 to 64 characters of [A-Za-z0-9_-]", ErrInvalidOption, t)
		}
		c.tenant = t
		return nil
	}
}

// Tenant is the tenant the client acts as.
func (c *Client) Tenant() string { return c.tenant }

// New returns a Client using nc.
func New(nc *nats.Conn, opts ...Option) (*Client, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	c := &Client{nc: nc, js: js, names: queue.Names{Prefix: queue.DefaultPrefix}, tenant: job.DefaultTenant}
	for _, o := range opts {
		if err := o(c); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// Submission is the dispatcher's answer to an accepted request.
type Submission = job.SubmitReply

// RejectedError is a request the dispatcher refused, with its reason.
type RejectedError struct {
	JobID  string
	Reason string
}

func (e *RejectedError) Error() string { return "rejected: " + e.Reason }

// Submit sends a request and returns the dispatcher's answer. A refused
// request is a *RejectedError. A request without an id is given one, so
// that it can be sent again safely (see SubmitJSON). Without a deadline on
// ctx it tries for 30 seconds.
func (c *Client) Submit(ctx context.Context, r *job.Request) (*Submission, error) {
	if r.ID == "" {
		r.ID = job.NewID()
	}
	data, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encode request: %w", err)
	}
	return c.SubmitJSON(ctx, data)
}

// SubmitJSON sends a request document as is, so that the dispatcher, not
// the client, judges it; only a missing id is added.
//
// A submission whose answer does not come (a timeout, no dispatcher
// answering while NATS elects a leader, a reconnect) is sent again with
// the same id until ctx ends: the job is submitted at least once, and the
// fleet runs one job, with one result, per id. When the first try had been
// taken, the answer says Duplicate. Without a deadline on ctx it tries for
// 30 seconds.
func (c *Client) SubmitJSON(ctx context.Context, data []byte) (*Submission, error) {
	ctx, cancel := withDefaultTimeout(ctx, 30*time.Second)
	defer cancel()
	// The producer's trace, if it has one, goes on into the fleet.
	msg := nats.NewMsg(c.names.SubmitV2(c.tenant))
	msg.Data = withID(data)
	// Every copy of this submission carries one token: the answer to a
	// copy sent again, after the first was taken, is the first's.
	msg.Header.Set(job.SubmissionHeader, job.NewID())
	otel.GetTextMapPropagator().Inject(ctx, queue.HeaderCarrier(msg.Header))
	if len(msg.Header) == 0 {
		msg.Header = nil
	}
	var m *nats.Msg
	err := queue.Retry(ctx, func(ctx context.Context) (err error) {
		m, err = c.nc.RequestMsgWithContext(ctx, msg)
		return err
	}, nil)
	if err != nil {
		return nil, fmt.Errorf("submit: %w", err)
	}
	var reply job.SubmitReply
	if err := json.Unmarshal(m.Data, &reply); err != nil {
		return nil, fmt.Errorf("submit: unreadable answer: %w", err)
	}
	if reply.Rejected() {
		return nil, &RejectedError{JobID: reply.JobID, Reason: reply.Error}
	}
	return &reply, nil
}

// withID gives a request document without an id a new one. A document
// that is not a JSON object is left as it is, for the dispatcher to refuse.
func withID(data []byte) []byte {
	var doc map[string]json.RawMessage
	if json.Unmarshal(data, &doc) != nil || doc == nil {
		return data
	}
	if id, ok := doc["id"]; ok && string(id) != `""` && string(id) != "null" {
		return data
	}
	doc["id"], _ = json.Marshal(job.NewID())
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false) // the document stays the size it was, but for the id
	if enc.Encode(doc) != nil {
		return data
	}
	return bytes.TrimRight(out.Bytes(), "\n")
}

// Status is a job's record and, once it has one, its result.
type Status = job.StatusReply

// ErrNotFound means the fleet knows no job with that id.
var ErrNotFound = queue.ErrNotFound

// ErrUnavailable is a request a dispatcher could not carry out for a
// while (NATS electing a leader, a server lost): sending it again may
// work. Result and Events ride through it.
var ErrUnavailable = errors.New("the fleet cannot answer now")

// Status asks the fleet for a job's record and, once it has one, its
// result.
func (c *Client) Status(ctx context.Context, id string) (*Status, error) {
	var s Status
	if err := c.request(ctx, "status", id, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// History returns every version of a job's record, oldest first: its
// lifecycle as the fleet keeps it.
func (c *Client) History(ctx context.Context, id string) (*job.HistoryReply, error) {
	var h job.HistoryReply
	if err := c.request(ctx, "history", id, &h); err != nil {
		return nil, err
	}
	return &h, nil
}

// historyThrough is History, asked again while the fleet cannot answer
// for a while (a NATS server lost, a leader elected).
func (c *Client) historyThrough(ctx context.Context, id string) (*job.HistoryReply, error) {
	wait := lifecycle.Backoff(ctx, 250*time.Millisecond, 2*time.Second)
	for {
		h, err := c.History(ctx, id)
		if err == nil || !retryable(ctx, err) {
			return h, err
		}
		next := wait.NextBackOff()
		if next == backoff.Stop {
			return nil, err
		}
		select {
		case <-time.After(next):
		case <-ctx.Done():
			return nil, err
		}
	}
}

// tryWait bounds one try of a request that may be sent twice. A request,
// or its answer, can be lost with a NATS server: the one the client or
// the answering dispatcher was connected to dies while it is on its way.
// Such a request not answered within tryWait is sent again, rather than
// waited for until ctx ends (a Result given two minutes would wait all of
// them for an answer that was never coming). A dispatcher answers in
// milliseconds, within 10 s even in an election.
const tryWait = 3 * time.Second

// resend says when ask sends a request again. Every request is sent again
// while no dispatcher is there to answer (NATS says so at once).
type resend int

const (
	// sendOnce: a request a second copy of which would act again (a
	// cancel, a dead letter's retry, a schedule's create).
	sendOnce resend = iota
	// sendAgain: a read, or a request that sets a state (a second time
	// changes nothing), sent again when no answer came within tryWait and
	// when the answer says the fleet cannot carry it out for a while
	// (retry: a stream or the pools bucket electing a leader, a read of
	// the pool's stream that did not come back whole).
	sendAgain
)

// ask sends a request to the dispatchers and returns the answer, sending
// it again as r says, until ctx ends.
func (c *Client) ask(ctx context.Context, subject string, body []byte, r resend) (*nats.Msg, error) {
	var m *nats.Msg
	err := backoff.Retry(func() (err error) {
		try, cancel := ctx, context.CancelFunc(func() {})
		if r != sendOnce {
			try, cancel = context.WithTimeout(ctx, tryWait)
		}
		defer cancel()
		m, err = c.nc.RequestWithContext(try, subject, body)
		switch {
		case err == nil && r == sendAgain:
			var e job.ErrorReply
			if json.Unmarshal(m.Data, &e) == nil && e.Retry {
				return fmt.Errorf("%w: %s", ErrUnavailable, e.Error)
			}
			return nil
		case err == nil, errors.Is(err, nats.ErrNoResponders):
			return err
		case r != sendOnce && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded):
			return err // lost on the way: asked again
		}
		return backoff.Permanent(err)
	}, lifecycle.Backoff(ctx, 50*time.Millisecond, time.Second))
	return m, err
}

// request sends one of the tenant's requests about job id to the
// dispatchers (see ask: a read, status or history, is sent again when its
// answer does not come or says to try again; a cancel or a retry is not)
// and decodes the answer into v, until ctx ends (10 seconds without a
// deadline); an answer that does not come is an error.
func (c *Client) request(ctx context.Context, verb, id string, v any) error {
	if !job.ValidID(id) {
		return fmt.Errorf("%w: %q is not a job id", ErrNotFound, id)
	}
	ctx, cancel := withDefaultTimeout(ctx, 10*time.Second)
	defer cancel()
	r := sendOnce
	if verb == "status" || verb == "history" {
		r = sendAgain
	}
	m, err := c.ask(ctx, c.names.Request(c.tenant, verb, id), nil, r)
	if err != nil {
		return fmt.Errorf("%s %s: %w", verb, id, err)
	}
	var e job.ErrorReply
	if json.Unmarshal(m.Data, &e) == nil && e.Error != "" {
		switch {
		case e.NotFound:
			return fmt.Errorf("%w: %s", ErrNotFound, id)
		case e.Retry:
			return fmt.Errorf("%s %s: %w: %s", verb, id, ErrUnavailable, e.Error)
		}
		return fmt.Errorf("%s %s: %s", verb, id, e.Error)
	}
	if err := json.Unmarshal(m.Data, v); err != nil {
		return fmt.Errorf("%s %s: unreadable answer: %w", verb, id, err)
	}
	return nil
}

// Result waits for a job's result: it listens for the job's final record
// and for its rejection as they are stored (kinds r and x), and asks for
// the job's status now and then (backing off to every two seconds), so
// that it rides through the loss of a NATS server: a result stored while
// the client reconnects is read then.
//
// A job whose latest version is a rejection has no result: Result returns
// a *RejectedError with its reason, as Events ends at it. A rejection that
// a later submission of the id replaced is not the job's latest version,
// and Result waits for the result of that submission.
func (c *Client) Result(ctx context.Context, id string) (*job.Result, error) {
	if !job.ValidID(id) {
		return nil, fmt.Errorf("%w: %q is not a job id", ErrNotFound, id)
	}
	// Listen before the first read, so that no result falls in between.
	published := make(chan *nats.Msg, 4)
	for _, kind := range []string{queue.KindResult, queue.KindRejected} {
		sub, err := c.nc.ChanSubscribe(c.names.JobLive(c.tenant, "*", kind, id), published)
		if err != nil {
			return nil, fmt.Errorf("await result of %s: %w", id, err)
		}
		defer func() { _ = sub.Unsubscribe() }()
	}
	wait := lifecycle.Backoff(ctx, 250*time.Millisecond, 2*time.Second)
	pool := "" // the pool that holds the job, as the dispatcher found it
	for {
		st, err := c.Status(ctx, id)
		if err == nil && st.Job != nil {
			pool = st.Job.Pool
		}
		switch {
		case err == nil && st.Result != nil:
			return st.Result, nil
		case err == nil && st.Job != nil && st.Job.State == job.StateRejected:
			return nil, &RejectedError{JobID: id, Reason: rejection(st.Job)}
		case errors.Is(err, ErrNotFound) && ctx.Err() == nil:
			// Not queued yet (a submission kept by the intake stream
			// until a dispatcher takes it): wait for it.
		case err != nil && !retryable(ctx, err):
			return nil, fmt.Errorf("await result of %s: %w", id, err)
		}
		next := wait.NextBackOff()
		if next == backoff.Stop {
			return nil, ctx.Err()
		}
		select {
		case m := <-published:
			// A live copy is believed from the pool that holds the job
			// only, and when its body names the job its subject does (a
			// worker of another pool may publish on its own pool's
			// subjects); else the status, which the dispatcher answers
			// from the pool that queued the job, is asked again at once.
			rec, ok := c.liveRecord(m, pool, id)
			switch {
			case ok && rec.Result != nil:
				return rec.Result, nil
			case ok && rec.State == job.StateRejected:
				return nil, &RejectedError{JobID: id, Reason: rejection(rec)}
			}
			wait.Reset()
		case <-time.After(next):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// liveRecord decodes a record version heard live on a job's subject; false
// unless it is of pool (the job's, as the dispatcher found it) and its body
// names the job its subject does.
func (c *Client) liveRecord(m *nats.Msg, pool, id string) (*job.Record, bool) {
	_, k, ok := c.names.ParseJobLive(m.Subject)
	if !ok || pool == "" || k.Pool != pool || k.ID != id || k.Tenant != c.tenant {
		return nil, false
	}
	var rec job.Record
	if err := json.Unmarshal(m.Data, &rec); err != nil || rec.ID != id || rec.Pool != pool ||
		(rec.Tenant != c.tenant && !(rec.Tenant == "" && c.tenant == job.DefaultTenant)) {
		return nil, false
	}
	return &rec, true
}

// rejection is why a rejected record's request was refused.
func rejection(rec *job.Record) string {
	if rec.Message == "" && rec.Failure != nil {
		return rec.Failure.Message
	}
	return rec.Message
}

// retryable reports an error that a NATS cluster electing a leader or
// losing a server causes, while ctx still runs.
func retryable(ctx context.Context, err error) bool {
	return ctx.Err() == nil && (errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, ErrUnavailable) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, jetstream.ErrNoHeartbeat) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, jetstream.ErrJetStreamNotEnabled))
}

// Events yields a job's lifecycle events from the first and ends after its
// final event (succeeded, failed, timed_out or cancelled), which is always
// a job's last: the job's history (every version of its record so far),
// then, live, its later versions and its heartbeat and log events. Stop
// early by breaking out of the loop or ending ctx.
//
// A rejection ends the events only while it is the job's latest version:
// when the history shows that a later submission of the id replaced it,
// it is not yielded, and the events go on to the end of the job that
// submission queued. A watcher that finds the job rejected (in its
// history, or live) ends there, even if the producer sends the id again a
// moment later; watch again to follow that submission.
func (c *Client) Events(ctx context.Context, id string) iter.Seq2[*job.Event, error] {
	return func(yield func(*job.Event, error) bool) {
		if !job.ValidID(id) {
			yield(nil, fmt.Errorf("%w: %q is not a job id", ErrNotFound, id))
			return
		}
		// Listen first, then read the history: what is heard twice is
		// told apart by its stream sequence.
		live := make(chan *nats.Msg, 1024)
		var subs []*nats.Subscription
		defer func() {
			for _, s := range subs {
				_ = s.Unsubscribe()
			}
		}()
		for _, subject := range []string{c.names.JobLive(c.tenant, "*", "*", id), c.names.JobNotices(c.tenant, "*", id)} {
			s, err := c.nc.ChanSubscribe(subject, live)
			if err != nil {
				yield(nil, fmt.Errorf("watch %s: %w", id, err))
				return
			}
			subs = append(subs, s)
		}
		h, err := c.historyThrough(ctx, id)
		if err != nil {
			yield(nil, fmt.Errorf("watch %s: %w", id, err))
			return
		}
		// The history's records and notices, in the order they happened;
		// a notice heard live again is told by its time, type and attempt.
		last := uint64(0)
		type noticeKey struct {
			at      int64
			t       job.EventType
			attempt int
			line    string
		}
		seen := map[noticeKey]bool{}
		// The job's pool, as the dispatcher found it: what is heard live
		// from another pool's subjects is not the job's (a worker of
		// another pool may publish there).
		pool := ""
		if n := len(h.Records); n > 0 {
			pool = h.Records[n-1].Pool
		}
		var past []*job.Event
		for i, rec := range h.Records {
			last = h.Seqs[i]
			if rec.State == job.StateRejected && i < len(h.Records)-1 {
				// A later submission of the id replaced this rejection: the
				// job goes on from its queued version.
				continue
			}
			past = append(past, job.EventsOf(rec)...)
		}
		for _, e := range h.Notices {
			seen[noticeKey{e.Time.UnixNano(), e.Type, e.Attempt, e.Line}] = true
		}
		past = mergeByTime(past, h.Notices)
		for _, e := range past {
			if !yield(e, nil) || e.Type.Final() {
				return
			}
		}
		// What is heard live may be missed (core NATS: the client
		// reconnecting, a server lost as a stream republishes): now and
		// then the job's status is asked, and once it says the job ended,
		// the history gives what was missed, up to the end.
		wait := lifecycle.Backoff(ctx, 250*time.Millisecond, 2*time.Second)
		ask := time.NewTimer(wait.NextBackOff())
		defer ask.Stop()
		for {
			var m *nats.Msg
			select {
			case m = <-live:
			case <-ask.C:
				st, err := c.Status(ctx, id)
				switch {
				case err == nil && st.Job != nil && st.Job.State.Final():
				case err != nil && !retryable(ctx, err) && !errors.Is(err, ErrNotFound):
					yield(nil, fmt.Errorf("watch %s: %w", id, err))
					return
				default:
					ask.Reset(wait.NextBackOff())
					continue
				}
				h, err := c.historyThrough(ctx, id)
				if err != nil {
					yield(nil, fmt.Errorf("watch %s: %w", id, err))
					return
				}
				var missed []*job.Event
				for i, rec := range h.Records {
					if h.Seqs[i] > last && (rec.State != job.StateRejected || i == len(h.Records)-1) {
						missed = append(missed, job.EventsOf(rec)...)
					}
				}
				var notices []*job.Event
				for _, e := range h.Notices {
					if !seen[noticeKey{e.Time.UnixNano(), e.Type, e.Attempt, e.Line}] {
						notices = append(notices, e)
					}
				}
				for _, e := range mergeByTime(missed, notices) {
					if !yield(e, nil) || e.Type.Final() {
						return
					}
				}
				// Ended, but its final version is not in the history
				// read (a read from a replica behind the leader): ask again.
				ask.Reset(wait.NextBackOff())
				continue
			case <-ctx.Done():
				yield(nil, fmt.Errorf("watch %s: %w", id, ctx.Err()))
				return
			}
			var evs []*job.Event
			if seq := m.Header.Get(jetstream.SequenceHeader); seq != "" {
				rec, ok := c.liveRecord(m, pool, id)
				if !ok {
					continue // another pool's, or not the job's
				}
				n, _ := strconv.ParseUint(seq, 10, 64)
				if n <= last {
					continue // in the history already
				}
				last = n
				evs = job.EventsOf(rec)
			} else {
				if p, ok := c.noticePool(m.Subject, id); !ok || p != pool {
					continue // another pool's
				}
				e, err := job.DecodeEvent(m.Data)
				if err != nil {
					if !yield(nil, err) {
						return
					}
					continue
				}
				k := noticeKey{e.Time.UnixNano(), e.Type, e.Attempt, e.Line}
				if seen[k] {
					continue
				}
				seen[k] = true
				evs = []*job.Event{e}
			}
			for _, e := range evs {
				if !yield(e, nil) || e.Type.Final() {
					return
				}
			}
		}
	}
}

// noticePool reads the pool of a heartbeat or log event's subject,
// <prefix>.t.<tenant>.ev.<pool>.<id>.
func (c *Client) noticePool(subject, id string) (string, bool) {
	rest, ok := strings.CutPrefix(subject, strings.TrimSuffix(c.names.JobNotices(c.tenant, "", ""), "."))
	if !ok {
		return "", false
	}
	pool, rid, ok := strings.Cut(rest, ".")
	return pool, ok && rid == id
}

// mergeByTime merges two lists of events, each in time order, into one,
// a before b at equal times.
func mergeByTime(a, b []*job.Event) []*job.Event {
	out := make([]*job.Event, 0, len(a)+len(b))
	for len(a) > 0 && len(b) > 0 {
		if b[0].Time.Before(a[0].Time) {
			out, b = append(out, b[0]), b[1:]
		} else {
			out, a = append(out, a[0]), a[1:]
		}
	}
	return append(append(out, a...), b...)
}

// CancelReply says what a cancel did.
type CancelReply = job.CancelReply

// Cancel asks the dispatcher to cancel a job, in whatever state it is.
func (c *Client) Cancel(ctx context.Context, id string) (*CancelReply, error) {
	var r CancelReply
	if err := c.request(ctx, "cancel", id, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

func withDefaultTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}
