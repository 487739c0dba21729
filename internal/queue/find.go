package queue

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/job"
)

// Which versions of a job's record a reader believes.
//
// The versions of a job are written by more than the dispatcher that
// queued it: the workers of a pool may publish versions of kinds s and r
// of any tenant's job id in their pool (they run every tenant's jobs
// there), so they can also write a version of a job they never ran, or one
// whose body names another pool, tenant or id than its subject. Every
// reader holds to two rules, and orders versions by the stream, never by
// what a body says (its submitted_at, its updated_at):
//
//   - A job's pool is the one a dispatcher queued it in: the pool holding
//     a queued version of the tenant's id (kind q1…q5), a subject that only
//     dispatchers may publish (deploy/nats). When several pools hold one,
//     the most recently queued wins, by the time the stream stored it.
//   - A version whose body names another job than its subject (its pool,
//     tenant or id), or that does not decode, is ignored and logged: the
//     job reads as its last version that agrees. A compare-and-set is still
//     against the job's last message, ignored or not.

// agrees reports whether a version's body names the job its subject does.
// Versions of tenant default written before records named their tenant
// say none.
func agrees(claimed, k JobKey) bool {
	return claimed.ID == k.ID && cmp.Or(claimed.Tenant, job.DefaultTenant) == k.Tenant && claimed.Pool == k.Pool
}

// claims reads the job a version's body names and the state it says,
// without the rest of it.
func claims(data []byte) (JobKey, job.State, error) {
	var v struct {
		ID     string    `json:"id"`
		Tenant string    `json:"tenant"`
		Pool   string    `json:"pool"`
		State  job.State `json:"state"`
	}
	if err := json.Unmarshal(data, &v); err != nil {
		return JobKey{}, "", err
	}
	return JobKey{Tenant: v.Tenant, Pool: v.Pool, ID: v.ID}, v.State, nil
}

// decodeVersion decodes a version of k's record; false when it does not
// decode or names another job.
func decodeVersion(data []byte, k JobKey) (*job.Record, bool) {
	var rec job.Record
	if err := json.Unmarshal(data, &rec); err != nil || !agrees(Key(&rec), k) {
		return nil, false
	}
	return &rec, true
}

// isQueuedKind reports the kinds of the versions that queue a job, q1…q5.
func isQueuedKind(kind string) bool {
	return len(kind) == 2 && kind[0] == 'q' && kind[1] >= '1' && kind[1] <= '5'
}

// stored is a message of a pool's stream as a direct get returns it.
type stored struct {
	m    *nats.Msg
	kind string
	seq  uint64
	at   time.Time
}

func storedOf(n Names, m *nats.Msg) stored {
	s := stored{m: m}
	s.kind, _, _ = n.ParsePoolJob(m.Header.Get(jetstream.SubjectHeader))
	s.seq, _ = strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
	s.at, _ = time.Parse(time.RFC3339Nano, m.Header.Get(jetstream.TimeStampHeaer))
	return s
}

// batches receives the answers of batched direct gets, several messages
// each, on one subscription of the connection made at the first request,
// as nats.go does for requests: a subscription made and dropped for each
// would cost the server more than the get (0.6 ms against 20 µs, measured
// on one server).
type batches struct {
	nc      *nats.Conn
	mu      sync.Mutex
	prefix  string // the subscription's subject but its last token
	sub     *nats.Subscription
	n       uint64
	waiting map[string]*batch
}

// batch is the answer to one request, as it comes.
type batch struct {
	mu   sync.Mutex
	msgs []*nats.Msg
	more chan struct{}
}

func (b *batches) deliver(m *nats.Msg) {
	b.mu.Lock()
	w := b.waiting[m.Subject[len(b.prefix):]]
	b.mu.Unlock()
	if w == nil {
		return // an answer that came too late
	}
	w.mu.Lock()
	w.msgs = append(w.msgs, m)
	w.mu.Unlock()
	select {
	case w.more <- struct{}{}:
	default:
	}
}

// open registers a request's answer, subscribing first if need be, and
// returns its reply subject.
func (b *batches) open() (string, *batch, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.sub == nil {
		b.prefix = b.nc.NewInbox() + "."
		sub, err := b.nc.Subscribe(b.prefix+"*", b.deliver)
		if err != nil {
			return "", nil, fmt.Errorf("subscribe to the answers of direct gets: %w", err)
		}
		b.sub, b.waiting = sub, map[string]*batch{}
	}
	b.n++
	token := strconv.FormatUint(b.n, 36)
	w := &batch{more: make(chan struct{}, 1)}
	b.waiting[token] = w
	return b.prefix + token, w, nil
}

func (b *batches) close(reply string) {
	b.mu.Lock()
	delete(b.waiting, reply[len(b.prefix):])
	b.mu.Unlock()
}

// lastEach reads, with one batched direct get (multi_last, nats-server
// 2.11), the last message of each subject of stream that filter matches;
// none when no subject has one.
func (b *batches) lastEach(ctx context.Context, stream, filter string) ([]*nats.Msg, error) {
	req, _ := json.Marshal(map[string][]string{"multi_last": {filter}})
	reply, w, err := b.open()
	if err != nil {
		return nil, err
	}
	defer b.close(reply)
	if err := b.nc.PublishRequest("$JS.API.DIRECT.GET."+stream, reply, req); err != nil {
		return nil, fmt.Errorf("direct get %s: %w", filter, err)
	}
	var out []*nats.Msg
	for {
		w.mu.Lock()
		got := w.msgs
		w.msgs = nil
		w.mu.Unlock()
		for _, m := range got {
			switch status := m.Header.Get("Status"); {
			case status == "":
				out = append(out, m)
			case status == "204": // the end of the batch
				return out, nil
			case status == "404" && len(out) == 0 && m.Header.Get("Description") == "No Results":
				return nil, nil
			case status == "404":
				// A message went (the retention) between the server's
				// finding it and reading it.
				return nil, fmt.Errorf("direct get %s: %w", filter, errUnsettled)
			case status == "503":
				return nil, fmt.Errorf("direct get %s: %w", filter, nats.ErrNoResponders)
			default:
				return nil, fmt.Errorf("direct get %s: %s %s", filter, status, m.Header.Get("Description"))
			}
		}
		select {
		case <-w.more:
		case <-ctx.Done():
			return nil, fmt.Errorf("direct get %s: %w", filter, ctx.Err())
		}
	}
}

// placed is where a tenant's job id may be: a pool, and how much the pool
// has to say for it.
type placed struct {
	k    JobKey
	rank int       // rankQueued, rankRejected or rankOther
	at   time.Time // when the stream stored the version it is ranked by
	last stored    // the last message on the job's subjects in the pool
	// rec is the last version that agrees with its subject, when the
	// ranking had to read the history for it (then rev is last's sequence).
	rec *job.Record
	rev uint64
}

const (
	rankOther    = iota // versions of a job never queued in the pool
	rankRejected        // the pool's last version is a rejection: a dispatcher's
	rankQueued          // a dispatcher queued the job in the pool
)

// beats reports whether p is a better place than q (nil: none).
func (p *placed) beats(q *placed) bool {
	switch {
	case q == nil:
		return true
	case p.rank != q.rank:
		return p.rank > q.rank
	case !p.at.Equal(q.at):
		return p.at.After(q.at)
	}
	return p.k.Pool < q.k.Pool
}

// place ranks a pool by the last message of each of the job's subjects
// there (msgs, in any order); nil when it has none. A pool without a
// queued version of the job is ranked rankOther here, its last version
// not yet read (see rankUnqueued).
func (j *Jobs) place(k JobKey, msgs []*nats.Msg) *placed {
	if len(msgs) == 0 {
		return nil
	}
	var queued, last stored
	for _, m := range msgs {
		s := storedOf(j.names, m)
		if s.seq > last.seq {
			last = s
		}
		// A queued version counts by its subject alone, which only
		// dispatchers publish, writing it from the record's own job (Msg):
		// its body, which carries the request, is not decoded for it.
		if isQueuedKind(s.kind) && s.seq > queued.seq {
			queued = s
		}
	}
	if queued.m != nil {
		return &placed{k: k, rank: rankQueued, at: queued.at, last: last}
	}
	return &placed{k: k, rank: rankOther, at: last.at, last: last}
}

// rankUnqueued ranks a pool that has versions of the job but no queued
// one, by its last version that agrees with its subject; false when none
// does.
//
// Such a pool counts only when no pool has a queued version of the job.
// It is what a dispatcher leaves when it rejects a request (a rejection,
// of kind x, or s before that kind, and never a queued version), and what
// stays of a job whose queued version the stream's retention took. It is also what a pool's
// workers can write for any id; but then no dispatcher queued the id
// anywhere, and there is no job of a pool that a forged version could
// hide: the worst it tells is a made-up state of an id that was only ever
// rejected or never submitted, or of a job older than the retention.
// Among such pools, one whose last version is a rejection comes first:
// that is the one thing a dispatcher writes there.
func (j *Jobs) rankUnqueued(ctx context.Context, p *placed) (bool, error) {
	c, state, err := claims(p.last.m.Data)
	if err != nil || !agrees(c, p.k) {
		// Its last version is ignored: rank the pool by the last that is not.
		vs, rev, err := j.versions(ctx, p.k)
		if err != nil || len(vs) == 0 {
			return false, err
		}
		lv := vs[len(vs)-1]
		p.at, p.rec, p.rev, state = lv.at, lv.rec, rev, lv.rec.State
	}
	if state == job.StateRejected {
		p.rank = rankRejected
	}
	return true, nil
}

// Find returns the last version of the record of the tenant's job id, and
// its revision, in the pool among pools that its dispatcher queued it in
// (see "Which versions of a job's record a reader believes", above): ids
// are a tenant's within a pool, and a request about a job names its tenant
// and id only. It costs one direct get per pool, all sent at once, which
// answers the last message of each of the job's subjects there (the
// queued version among them, with the request it carries): one round
// trip, as a read of the last versions alone would be, where a probe for
// the queued version and then a read of the last would be two
// (BenchmarkFind). An ignored last version costs a read of the job's
// history in its pool.
func (j *Jobs) Find(ctx context.Context, tenant, id string, pools []string) (*job.Record, uint64, error) {
	type probe struct {
		k    JobKey
		msgs []*nats.Msg
		err  error
	}
	ch := make(chan probe, len(pools))
	for _, p := range pools {
		go func() {
			pr := probe{k: JobKey{Tenant: tenant, Pool: p, ID: id}}
			pr.err = Retry(ctx, func(ctx context.Context) (err error) {
				pr.msgs, err = j.batches.lastEach(ctx, j.names.PoolStreamV2(p), j.names.PoolJobAll(p, tenant, id))
				return err
			}, nil)
			ch <- pr
		}()
	}
	var best *placed
	var unqueued []*placed
	var firstErr error
	for range pools {
		pr := <-ch
		if pr.err != nil {
			firstErr = cmpErr(firstErr, fmt.Errorf("find job %s in pool %s: %w", id, pr.k.Pool, pr.err))
			continue
		}
		switch p := j.place(pr.k, pr.msgs); {
		case p == nil:
		case p.rank == rankQueued && p.beats(best):
			best = p
		case p.rank != rankQueued:
			unqueued = append(unqueued, p)
		}
	}
	if best == nil {
		for _, p := range unqueued {
			ok, err := j.rankUnqueued(ctx, p)
			switch {
			case err != nil:
				firstErr = cmpErr(firstErr, fmt.Errorf("find job %s in pool %s: %w", id, p.k.Pool, err))
			case ok && p.beats(best):
				best = p
			}
		}
	}
	switch {
	case best != nil:
	case firstErr != nil:
		return nil, 0, firstErr
	default:
		return nil, 0, ErrNotFound
	}
	if best.rec != nil {
		return best.rec, best.rev, nil
	}
	if rec, ok := decodeVersion(best.last.m.Data, best.k); ok {
		return rec, best.last.seq, nil
	}
	return j.lastAgreeing(ctx, best.k)
}

// version is a version of a job's record as its pool's stream holds it.
type version struct {
	rec *job.Record
	seq uint64
	at  time.Time
}

// versions reads every version of a job's record in its pool's stream,
// oldest first (see readAll): those that agree with their subject, and
// the sequence of the job's last message, agreeing or not. The versions
// it ignores are logged, once.
func (j *Jobs) versions(ctx context.Context, k JobKey) ([]version, uint64, error) {
	var out []version
	var last uint64
	ignored, firstIgnored, claimed := 0, "", JobKey{}
	defer func() {
		if ignored > 0 {
			j.logger().Warn("ignored versions of a job's record whose body names another job than their subject",
				"subject", firstIgnored, "body_tenant", claimed.Tenant, "body_pool", claimed.Pool, "body_id", claimed.ID,
				"ignored", ignored, "versions", len(out)+ignored)
		}
	}()
	err := readAll(ctx, j.js, j.names.PoolStreamV2(k.Pool), jetstream.ConsumerConfig{
		FilterSubjects: []string{j.names.PoolJobAll(k.Pool, k.Tenant, k.ID)}}, 64, func(m jetstream.Msg) error {
		md, err := m.Metadata()
		if err != nil {
			return err
		}
		last = md.Sequence.Stream
		if rec, ok := decodeVersion(m.Data(), k); ok {
			out = append(out, version{rec: rec, seq: md.Sequence.Stream, at: md.Timestamp})
		} else {
			if ignored == 0 {
				firstIgnored = m.Subject()
				claimed, _, _ = claims(m.Data())
			}
			ignored++
		}
		return nil
	})
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, 0, ErrNotFound
	}
	if err != nil {
		return nil, 0, fmt.Errorf("history of job %s: %w", k.ID, err)
	}
	return out, last, nil
}

// lastAgreeing returns the last version of a job's record that agrees
// with its subject, and the sequence of the job's last message: the
// revision a compare-and-set is against. ErrNotFound when no version
// agrees, with that sequence still (0 when the job has no message).
func (j *Jobs) lastAgreeing(ctx context.Context, k JobKey) (*job.Record, uint64, error) {
	vs, last, err := j.versions(ctx, k)
	if err != nil {
		return nil, 0, err
	}
	if len(vs) == 0 {
		return nil, last, ErrNotFound
	}
	return vs[len(vs)-1].rec, last, nil
}
