package scheduler

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/internal/schedule"
	"github.com/fleet-dev/fleet/internal/telemetry"
	"github.com/fleet-dev/fleet/job"
)

// fireOne makes one firing: it applies the overlap policy to the previous
// firing's job, then submits the template with the firing's id. An error
// means the fleet could not decide now; the firing is tried again.
func (s *Scheduler) fireOne(ctx context.Context, sc *job.Schedule, st *job.ScheduleState, at time.Time, p *prepared) (job.Firing, error) {
	id := job.FiringID(sc.Name, at)
	ctx, span := s.startFiring(ctx, sc, at, id)
	f, err := s.makeFiring(ctx, sc, st, at, id, p)
	endFiring(span, f, err)
	return f, err
}

// startFiring starts the span of a schedule's firing at at, whose job is id.
func (s *Scheduler) startFiring(ctx context.Context, sc *job.Schedule, at time.Time, id string) (context.Context, trace.Span) {
	return telemetry.Tracer().Start(ctx, "fleet.schedule.fire", trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attribute.String("fleet.tenant", sc.Tenant), attribute.String("fleet.schedule", sc.Name),
			attribute.String("fleet.schedule.firing", at.UTC().Format(time.RFC3339)), attribute.String("fleet.job.id", id)))
}

// endFiring ends the span of a firing that did f, or failed with err.
func endFiring(span trace.Span, f job.Firing, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "firing not made")
	} else {
		span.SetAttributes(attribute.String("fleet.schedule.outcome", string(f.Outcome)))
	}
	span.End()
}

// p, if not nil, is the firing made ready before its time.
func (s *Scheduler) makeFiring(ctx context.Context, sc *job.Schedule, st *job.ScheduleState, at time.Time, id string,
	p *prepared) (job.Firing, error) {
	f := job.Firing{At: at, JobID: id}
	policy := cmp.Or(sc.Overlap, job.OverlapSkip)
	prev := st.Previous
	if !overlapDecided(sc, st, id, p) {
		state, final, err := s.d.LastState(ctx, queue.JobKey{Tenant: sc.Tenant, Pool: prev.Pool, ID: prev.JobID})
		switch {
		case errors.Is(err, queue.ErrNotFound):
		case err != nil:
			return f, fmt.Errorf("the previous firing's job %s: %w", prev.JobID, err)
		case !final && state != job.StateRejected:
			if policy == job.OverlapSkip {
				s.m.count(ctx, sc, job.FiringSkipped, 1)
				s.log.Info("schedule firing skipped: the previous one's job has not ended", "tenant", sc.Tenant,
					"schedule", sc.Name, "at", at, "previous", prev.JobID, "state", state)
				return job.Firing{At: at, Outcome: job.FiringSkipped, JobID: prev.JobID, Pool: prev.Pool}, nil
			}
			if _, err := s.d.Cancel(ctx, sc.Tenant, prev.JobID); err != nil {
				return f, fmt.Errorf("cancel the previous firing's job %s: %w", prev.JobID, err)
			}
			f.Cancelled = prev.JobID
			s.log.Info("schedule firing cancelled the previous one's job", "tenant", sc.Tenant, "schedule", sc.Name,
				"at", at, "cancelled", prev.JobID)
		}
	}
	var reply *job.SubmitReply
	var err error
	if p != nil && p.req != nil {
		reply, err = s.d.SubmitValid(ctx, sc.Tenant, p.req)
	} else {
		var data []byte
		if data, err = s.request(sc, at); err != nil {
			return f, err
		}
		reply, err = s.d.Submit(ctx, sc.Tenant, data)
	}
	if err != nil {
		return f, err
	}
	return s.made(ctx, sc, st, at, f, reply), nil
}

// overlapDecided reports whether the overlap policy lets a schedule's
// firing whose job is id be made without looking at the previous firing's
// job: it allows overlaps, there is none, or it was seen ended when the
// firing was made ready (p).
func overlapDecided(sc *job.Schedule, st *job.ScheduleState, id string, p *prepared) bool {
	prev := st.Previous
	return cmp.Or(sc.Overlap, job.OverlapSkip) == job.OverlapAllow || prev == nil || prev.JobID == "" || prev.JobID == id ||
		(p != nil && p.ended == prev.JobID)
}

// made is what a firing f did, its job's submission answered reply: made
// (st keeps it as the previous firing), or rejected.
func (s *Scheduler) made(ctx context.Context, sc *job.Schedule, st *job.ScheduleState, at time.Time, f job.Firing,
	reply *job.SubmitReply) job.Firing {
	if reply.Rejected() {
		f.Outcome, f.Error = job.FiringRejected, reply.Error
		s.m.count(ctx, sc, job.FiringRejected, 1)
		s.log.Warn("schedule firing rejected", "tenant", sc.Tenant, "schedule", sc.Name, "at", at, "reason", reply.Error)
		return f
	}
	queued := s.now()
	f.Outcome, f.Pool, f.QueuedAt = job.FiringMade, reply.Pool, &queued
	made := f
	st.Previous = &made
	if !reply.Duplicate { // a duplicate was made by another dispatcher, and counted there
		s.m.count(ctx, sc, job.FiringMade, 1)
		s.m.lateness.Record(ctx, queued.Sub(at).Seconds())
	}
	s.log.Debug("schedule fired", "tenant", sc.Tenant, "schedule", sc.Name, "at", at, "job_id", reply.JobID,
		"late", queued.Sub(at), "duplicate", reply.Duplicate)
	return f
}

// prepared is a schedule's firing made ready before its time, so that at
// its time only what must be decided then is left: its request, decoded
// and validated as Submit would, and the previous firing's job if it was
// seen ended (a final state is final: it need not be read again). Nothing
// is written before the firing's time.
type prepared struct {
	sc *job.Schedule // the schedule as it was made ready for
	at time.Time
	// req is the firing's request, valid; nil when it is not, or could
	// not be made: the firing then goes through Submit, which says why.
	req *job.Request
	// ended is the previous firing's job, seen in a final state.
	ended string
}

// prepare makes a schedule's next firing ready (see prepared).
func (s *Scheduler) prepare(ctx context.Context, e *entry) {
	s.mu.Lock()
	sc, at, prev := e.s, e.next, e.state.Previous
	if e.busy || !s.now().Before(at) { // too late: it is being fired
		e.preparing = false
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	p := &prepared{sc: sc, at: at}
	if data, err := s.request(sc, at); err == nil {
		limits := s.limits
		if req, err := job.DecodeRequest(data, limits); err == nil && req.Validate(limits) == nil {
			p.req = req
		}
	}
	id := job.FiringID(sc.Name, at)
	if cmp.Or(sc.Overlap, job.OverlapSkip) != job.OverlapAllow && prev != nil && prev.JobID != "" && prev.JobID != id {
		_, final, err := s.d.LastState(ctx, queue.JobKey{Tenant: sc.Tenant, Pool: prev.Pool, ID: prev.JobID})
		if err == nil && final {
			p.ended = prev.JobID
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e.preparing = false
	if e.s == sc && e.next.Equal(at) && !e.busy {
		e.prep = p
	}
}

// request is the request of a schedule's firing at at, its template's
// secrets opened, encoded as a producer would send it.
func (s *Scheduler) request(sc *job.Schedule, at time.Time) ([]byte, error) {
	r := schedule.Firing(sc, at)
	if err := s.d.OpenSecrets(TemplateKey(sc.Tenant, sc.Name), r, sc.Secrets); err != nil {
		return nil, fmt.Errorf("open the template's secrets: %w", err)
	}
	data, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encode the firing's request: %w", err)
	}
	return data, nil
}

// record adds a firing to a state's recent ones, and to its counts.
func record(st *job.ScheduleState, f job.Firing) {
	switch f.Outcome {
	case job.FiringMade:
		st.Made++
	case job.FiringSkipped:
		st.Skipped++
	case job.FiringRejected:
		st.Rejected++
	}
	st.Recent = append(st.Recent, f)
	if n := len(st.Recent) - job.MaxRecentFirings; n > 0 {
		st.Recent = append(st.Recent[:0:0], st.Recent[n:]...)
	}
}

// writeState records what a schedule's firings did, with a compare-and-set
// on the revision last read or written, and returns the new revision. A
// write another dispatcher got in first is read back: the state that went
// further wins. A write that fails is tried again with the next firing.
func (s *Scheduler) writeState(ctx context.Context, sc *job.Schedule, st *job.ScheduleState, rev uint64) uint64 {
	key := StateKey(sc.Tenant, sc.Name)
	for try := 0; try < 3; try++ {
		data, err := json.Marshal(st)
		if err != nil {
			return rev
		}
		var next uint64
		if rev == 0 {
			next, err = s.kv.Create(ctx, key, data)
		} else {
			next, err = s.kv.Update(ctx, key, data, rev)
		}
		if err == nil {
			return next
		}
		if !conflict(err) {
			s.log.Debug("recording a schedule's firings", "tenant", sc.Tenant, "schedule", sc.Name, "err", err)
			return rev
		}
		cur, gerr := s.kv.Get(ctx, key)
		if gerr != nil {
			return 0
		}
		rev = cur.Revision()
		var theirs job.ScheduleState
		if json.Unmarshal(cur.Value(), &theirs) == nil && theirs.Created.Equal(st.Created) && theirs.Last != nil &&
			(st.Last == nil || theirs.Last.After(*st.Last)) {
			*st = theirs
			return rev
		}
	}
	return rev
}

// recordAfter bounds how long the recording of a firing waits for the
// firings still to be made; firedBuffer is how many made firings wait to
// be recorded before the firings wait for the recordings.
const (
	recordAfter = 250 * time.Millisecond
	firedBuffer = 4096
)

// gate counts work in progress, and lets a goroutine wait until there is
// none.
type gate struct {
	mu   sync.Mutex
	n    int
	none chan struct{} // closed when n is 0
}

func (g *gate) add(k int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.n == 0 {
		g.none = make(chan struct{})
	}
	g.n += k
}

func (g *gate) done(k int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.n -= k
	if g.n == 0 {
		close(g.none)
	}
}

// wait waits until there is no work in progress, at most d or until ctx
// ends.
func (g *gate) wait(ctx context.Context, d time.Duration) {
	g.mu.Lock()
	n, none := g.n, g.none
	g.mu.Unlock()
	if n == 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-none:
	case <-t.C:
	case <-ctx.Done():
	}
}
