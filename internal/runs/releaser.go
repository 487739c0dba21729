package runs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/fleet-dev/fleet/internal/lifecycle"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/internal/telemetry"
	"github.com/fleet-dev/fleet/job"
)

// The releaser. Every dispatcher runs one, and they share one durable
// consumer on the runs' stream (queue.RunsConsumerConfig) in a priority
// group whose one client is pinned: one dispatcher at a time receives
// every run's messages, in the stream's order, and the others take over,
// PinnedTTL after it stops pulling (its messages not acknowledged are
// delivered to the next). What it knows of a run (run) is built from the
// stream once, when a message of the run first comes, and kept up to date
// by the messages that follow: a node's end counts once, and the node
// after its last parent is released the moment that parent's end comes,
// with no read of anything. A gap in the consumer's delivery sequence
// (another dispatcher held the pin meanwhile) drops what it knows, and so
// does a message delivered again: the next message of each run reads the
// run again, and everything due in it (a node whose parents have ended)
// is done again, since the dispatcher that took the messages before may
// have died before it was.
//
// What a message calls for (queue jobs, end a node that never ran, cancel
// jobs, write the run's summary) is carried out beside the next messages,
// and the message acknowledged once it is done; a message whose work
// failed comes back and is worked out again. Every write is idempotent: a
// node's job is queued with a compare-and-set on "no version yet", its
// end is stored once (a message id), and so is a round's summary.

// Jobs is what the releaser needs of the jobs' records; the dispatcher
// gives it.
type Jobs interface {
	// QueueAll queues nodes' jobs, each request complete (its id, run,
	// node, pool and priority set; env and inline inputs in clear), as
	// many submissions at once, without admission: the run was admitted
	// whole. A job whose id has a version already is left as it is. It
	// returns one error per request.
	QueueAll(ctx context.Context, tenant string, reqs []*job.Request) []error
	// EndUnqueued stores a final version of a node's job that never ran,
	// as its first version: false when the job has one already.
	EndUnqueued(ctx context.Context, rec *job.Record) (bool, error)
	// Cancel stops a job, in whatever state, as a tenant's cancel does.
	Cancel(ctx context.Context, tenant, id string) error
	// Last returns the last version of a job's record; queue.ErrNotFound
	// when it has none.
	Last(ctx context.Context, k queue.JobKey) (*job.Record, error)
}

// Config configures a Releaser.
type Config struct {
	Queue  queue.Config
	Sealer *queue.Sealer
	Logger *slog.Logger
	// PinnedTTL is how long the dispatchers' consumer waits for the pinned
	// dispatcher's next pull before it pins another. Defaults to
	// DefaultPinnedTTL.
	PinnedTTL time.Duration
}

// DefaultPinnedTTL bounds how long the runs wait when the dispatcher that
// releases their nodes dies.
const DefaultPinnedTTL = 5 * time.Second

// maxRuns is how many runs a releaser keeps in memory; past it, the one
// used longest ago is read again when a message of it comes.
const maxRuns = 256

// parallel bounds the messages whose work is carried out at once.
const parallel = 64

// Releaser releases the nodes of runs (see the top of the file).
type Releaser struct {
	cfg  Config
	js   jetstream.JetStream
	runs *queue.Runs
	jobs Jobs
	log  *slog.Logger
	m    metrics

	// runs known, by tenant and id, with when each was last used;
	// delivered is the consumer's sequence of the last message received.
	known     map[[2]string]*known
	delivered uint64

	sem  chan struct{}
	work sync.WaitGroup
	loop lifecycle.Runner
}

type known struct {
	r    *run
	used time.Time
}

// New returns a Releaser; Start starts it.
func New(js jetstream.JetStream, jobs Jobs, cfg Config) *Releaser {
	cfg.Queue = cfg.Queue.WithDefaults()
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.PinnedTTL <= 0 {
		cfg.PinnedTTL = DefaultPinnedTTL
	}
	return &Releaser{cfg: cfg, js: js, runs: queue.NewRuns(js, cfg.Queue.Names), jobs: jobs,
		log: cfg.Logger.With("component", "runs"), m: newMetrics(telemetry.Meter()),
		known: map[[2]string]*known{}, sem: make(chan struct{}, parallel)}
}

// Start binds to the dispatchers' consumer and starts taking messages.
func (r *Releaser) Start(ctx context.Context) error {
	cons, err := queue.RunsConsumer(ctx, r.js, r.cfg.Queue, r.cfg.PinnedTTL, r.log)
	if err != nil {
		return fmt.Errorf("runs: %w", err)
	}
	return r.loop.Go(ctx, func(ctx context.Context) error { return r.take(ctx, cons) })
}

// Stop stops taking messages and waits for the work under way.
func (r *Releaser) Stop(ctx context.Context) error {
	err := r.loop.Stop(ctx)
	done := make(chan struct{})
	go func() { r.work.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return errors.Join(err, ctx.Err())
	}
	return err
}

// take receives the messages until ctx ends, pulling again after an error.
func (r *Releaser) take(ctx context.Context, cons jetstream.Consumer) error {
	wait := lifecycle.Backoff(ctx, 50*time.Millisecond, time.Second)
	for ctx.Err() == nil {
		msgs, err := cons.Messages(jetstream.PullPriorityGroup(queue.RunsGroup), jetstream.PullMaxMessages(256))
		if err != nil {
			r.log.Debug("runs: cannot pull; trying again", "err", err)
			sleep(ctx, wait.NextBackOff())
			continue
		}
		stop := context.AfterFunc(ctx, msgs.Stop)
		for {
			m, err := msgs.Next()
			if err != nil {
				if !errors.Is(err, jetstream.ErrMsgIteratorClosed) && ctx.Err() == nil {
					r.log.Debug("runs: the pull ended; pulling again", "err", err)
				}
				break
			}
			wait.Reset()
			r.receive(ctx, m)
		}
		stop()
		msgs.Stop()
		sleep(ctx, wait.NextBackOff())
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// receive takes one message: it updates what is known of its run, decides
// what the message calls for, and hands that on to be carried out.
func (r *Releaser) receive(ctx context.Context, m jetstream.Msg) {
	again := false
	if md, err := m.Metadata(); err == nil {
		if r.delivered != 0 && md.Sequence.Consumer != r.delivered+1 {
			// Another dispatcher received what came between: what it
			// did is read again, run by run.
			clear(r.known)
		}
		r.delivered = md.Sequence.Consumer
		again = md.NumDelivered > 1
	}
	rm, ok := r.cfg.Queue.Names.ParseRun(m.Subject())
	if !ok || rm.What == "end" {
		_ = m.Term()
		return
	}
	if again {
		// Delivered before and not acknowledged: what it called for may
		// not all have been done (its work failed, or the dispatcher
		// that took it died), while what is known of its run already
		// counts it. The run is read again, and everything due in it
		// done again.
		delete(r.known, [2]string{rm.Tenant, rm.Run})
	}
	ctx, span := telemetry.Tracer().Start(ctx, "fleet.run.message", trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("fleet.tenant", rm.Tenant), attribute.String("fleet.run.id", rm.Run),
			attribute.String("fleet.run.message", rm.What)))
	acts, err := r.decide(ctx, m, rm)
	if errors.Is(err, queue.ErrNotFound) {
		// No definition: its run was never accepted (a pool's workers may
		// write a node's end of any run on their own subjects), or has
		// left the stream. Nothing will ever make it one to handle.
		span.End()
		r.log.Warn("runs: a message of a run that does not exist, dropped", "run", rm.Run, "tenant", rm.Tenant, "message", rm.What,
			"subject", m.Subject())
		_ = m.TermWithReason("no such run")
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "not decided")
		span.End()
		r.log.Warn("runs: a message of a run cannot be handled now; it comes back", "run", rm.Run, "tenant", rm.Tenant, "message", rm.What, "err", err)
		_ = m.NakWithDelay(time.Second)
		return
	}
	if len(acts.release)+len(acts.skip)+len(acts.cancel) == 0 && acts.end == nil {
		span.End()
		_ = m.Ack()
		return
	}
	select {
	case r.sem <- struct{}{}:
	case <-ctx.Done():
		span.End()
		return
	}
	r.work.Add(1)
	go func() {
		defer r.work.Done()
		defer func() { <-r.sem }()
		defer span.End()
		if err := r.carryOut(context.WithoutCancel(ctx), acts); err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, "not carried out")
			r.log.Warn("runs: what a message of a run calls for was not all done; it comes back", "run", rm.Run, "tenant", rm.Tenant,
				"message", rm.What, "err", err)
			_ = m.NakWithDelay(time.Second)
			return
		}
		_ = m.Ack()
	}()
}

// acts is what a message calls for in one run: nodes to queue, nodes to
// end without running them (with their codes and why), nodes to cancel,
// and the round's summary to write.
type acts struct {
	r       *run
	release []int
	skip    []skippedNode
	cancel  []int
	end     *job.RunEnd // the round's summary, to write
	// after is when the node whose end released the others ended.
	after time.Time
}

type skippedNode struct {
	node int
	code job.FailureCode
	why  string
}

// decide updates what is known of the message's run and says what the
// message calls for.
func (r *Releaser) decide(ctx context.Context, m jetstream.Msg, rm queue.RunMessage) (*acts, error) {
	var e job.NodeEnded
	round := rm.Round
	if rm.What == "node" {
		if err := json.Unmarshal(m.Data(), &e); err != nil || e.NodeID != rm.Node || e.Pool != rm.Pool || e.RunID != rm.Run {
			r.log.Warn("runs: a node's end that does not read as one, ignored", "subject", m.Subject())
			return &acts{}, nil
		}
		round = e.Round
	}
	var def []byte
	if rm.What == "def" {
		def = m.Data() // written once: the message is the definition
	}
	run, read, err := r.run(ctx, rm.Tenant, rm.Run, round, def)
	if err != nil {
		return nil, err
	}
	a := &acts{r: run}
	taken := map[int]bool{}
	add := func(i int) {
		if taken[i] {
			return
		}
		taken[i] = true
		switch v, code, why := run.verdict(i); v {
		case release:
			a.release = append(a.release, i)
		case skip:
			a.skip = append(a.skip, skippedNode{i, code, why})
		}
	}
	if read {
		// Read from the stream just now: the ends read may be this
		// message's and later ones, whose releases no message will call
		// for again, and what earlier messages called for may not have
		// been done (their dispatcher died). Every node due is done
		// again; each write is idempotent.
		for _, i := range run.ready() {
			add(i)
		}
	}
	switch rm.What {
	case "def", "retry":
		if rm.What == "def" && run.round != 1 || rm.What == "retry" && rm.Round != run.round {
			break // a later round runs: its own retry started it
		}
		for _, i := range run.ready() {
			add(i)
		}
	case "node":
		i, ok := run.apply(&e)
		if !ok {
			break
		}
		a.after = e.At
		r.m.ended.Add(ctx, 1, metric.WithAttributes(attribute.String("state", string(e.State))))
		for _, c := range run.children[i] {
			if run.ends[c] == nil {
				add(c)
			}
		}
	case "cancel":
		if rm.Round != run.round {
			break
		}
		run.cancelled = true
		for i, e := range run.ends {
			if e == nil && !taken[i] {
				a.cancel = append(a.cancel, i)
			}
		}
	}
	if run.complete() && !run.ended.Load() {
		a.end = run.summary(time.Now())
	}
	return a, nil
}

// run returns what is known of a run, reading it when it is not known, or
// known at an earlier round than round; read says it was read. def, when
// not nil, is the run's definition as its def message carries it.
func (r *Releaser) run(ctx context.Context, tenant, id string, round int, def []byte) (_ *run, read bool, _ error) {
	k := [2]string{tenant, id}
	if kn := r.known[k]; kn != nil && kn.r.round >= round {
		kn.used = time.Now()
		return kn.r, false, nil
	}
	var rec *job.RunRecord
	var err error
	if def != nil {
		rec, err = queue.DecodeDef(def, tenant, id)
	} else {
		rec, err = r.runs.Def(ctx, tenant, id)
	}
	if err != nil {
		return nil, false, err
	}
	rounds, err := r.runs.Rounds(ctx, tenant, id)
	if err != nil {
		return nil, false, err
	}
	ends, err := r.runs.NodesEnded(ctx, tenant, id)
	if err != nil {
		return nil, false, err
	}
	run := newRun(rec, rounds, ends)
	if len(r.known) >= maxRuns {
		var oldest [2]string
		var at time.Time
		for k, kn := range r.known {
			if at.IsZero() || kn.used.Before(at) {
				oldest, at = k, kn.used
			}
		}
		delete(r.known, oldest)
	}
	r.known[k] = &known{r: run, used: time.Now()}
	return run, true, nil
}

// carryOut does what a message calls for.
func (r *Releaser) carryOut(ctx context.Context, a *acts) error {
	var errs []error
	if len(a.release) > 0 {
		errs = append(errs, r.releaseAll(ctx, a))
	}
	for _, s := range a.skip {
		errs = append(errs, r.end(ctx, a.r, s.node, s.code, s.why))
	}
	for _, i := range a.cancel {
		errs = append(errs, r.cancelNode(ctx, a.r, i))
	}
	if e := a.end; e != nil {
		switch err := r.runs.End(ctx, e); {
		case err == nil:
			r.m.runs.Add(ctx, 1, metric.WithAttributes(attribute.String("state", string(e.State))))
			r.log.Info("run ended", "run", e.RunID, "tenant", e.Tenant, "round", e.Round, "state", e.State)
			r.recordRun(ctx, e)
			a.r.ended.Store(true)
		case errors.Is(err, queue.ErrRunExists):
			a.r.ended.Store(true)
		default:
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// releaseAll queues the jobs of the nodes a message released, together.
func (r *Releaser) releaseAll(ctx context.Context, a *acts) error {
	reqs := make([]*job.Request, 0, len(a.release))
	parents := map[string]*job.Record{} // the parents read for their outputs
	for _, i := range a.release {
		req, err := r.request(ctx, a.r, i, parents)
		if err != nil {
			return err
		}
		reqs = append(reqs, req)
	}
	errs := r.jobs.QueueAll(ctx, a.r.tenant, reqs)
	if !a.after.IsZero() {
		r.m.wait.Record(ctx, time.Since(a.after).Seconds())
	}
	r.m.released.Add(ctx, int64(len(reqs)))
	return errors.Join(errs...)
}

// request is the request of node i's job: the node's, its secrets opened,
// its id, run, node, pool, priority and labels set, and its inputs from
// the outputs of the nodes it comes after.
func (r *Releaser) request(ctx context.Context, run *run, i int, parents map[string]*job.Record) (*job.Request, error) {
	nd := run.rec.Nodes[i]
	req := nd.Job.Clone()
	if nd.Secrets != "" && r.cfg.Sealer != nil {
		first := queue.JobKey{Tenant: run.tenant, Pool: nd.Pool, ID: job.RunJobID(run.id, nd.ID, 1)}
		if err := r.cfg.Sealer.Open(first, req, nd.Secrets); err != nil {
			return nil, fmt.Errorf("node %s: %w", nd.ID, err)
		}
	}
	req.ID, req.RunID, req.NodeID, req.Pool, req.Priority = run.jobID(i), run.id, nd.ID, nd.Pool, nd.Priority
	if len(run.rec.Labels) > 0 {
		labels := maps.Clone(run.rec.Labels)
		maps.Copy(labels, req.Labels)
		req.Labels = labels
	}
	for name, from := range nd.InputsFrom {
		p, ok := run.index[from.Node]
		if !ok {
			continue
		}
		k := run.key(p)
		rec := parents[k.ID]
		if rec == nil {
			var err error
			if rec, err = r.jobs.Last(ctx, k); err != nil {
				return nil, fmt.Errorf("node %s: the outputs of %s: %w", nd.ID, from.Node, err)
			}
			if !rec.State.Final() || rec.Result == nil {
				return nil, fmt.Errorf("node %s: node %s's job %s is not final yet as read", nd.ID, from.Node, k.ID)
			}
			parents[k.ID] = rec
		}
		// An output the node did not produce (it failed) is left out.
		if text, ok := rec.Result.Outputs[from.Output]; ok {
			if req.Inputs == nil {
				req.Inputs = map[string]string{}
			}
			req.Inputs[name] = text
		} else if art, ok := rec.Result.Artifacts[from.Output]; ok {
			if req.InputRefs == nil {
				req.InputRefs = map[string]job.InputRef{}
			}
			size := art.Size
			req.InputRefs[name] = job.InputRef{Bucket: art.Bucket, Key: art.Key, SHA256: art.SHA256, Size: &size}
		}
	}
	return req, nil
}

// end ends node i's job without running it, with code and why: a final
// version of kind r, the job's first, then the node's end, which takes
// the nodes after it on.
func (r *Releaser) end(ctx context.Context, run *run, i int, code job.FailureCode, why string) error {
	nd := run.rec.Nodes[i]
	k := run.key(i)
	now := time.Now()
	f := job.Failf(job.ClassCancelled, code, "%s", why)
	rec := &job.Record{ID: k.ID, Tenant: k.Tenant, Pool: k.Pool, Priority: nd.Priority, State: job.StateCancelled,
		Event: job.EventCancelled, SubmittedAt: now, UpdatedAt: now, FinishedAt: &now, Failure: f, Message: why,
		RunID: run.id, NodeID: nd.ID, TraceID: run.rec.TraceID,
		Result: &job.Result{JobID: k.ID, Pool: k.Pool, Status: job.StatusCancelled, FinishedAt: now, Failure: f,
			TraceID: run.rec.TraceID, RunID: run.id, NodeID: nd.ID}}
	wrote, err := r.jobs.EndUnqueued(ctx, rec)
	if err != nil {
		return fmt.Errorf("end node %s: %w", nd.ID, err)
	}
	if !wrote {
		// Its job was queued, or ended, meanwhile: its end tells.
		return r.cancelNode(ctx, run, i)
	}
	r.m.skipped.Add(ctx, 1, metric.WithAttributes(attribute.String("code", string(code))))
	return r.runs.NodeEnded(ctx, &job.NodeEnded{RunID: run.id, NodeID: nd.ID, JobID: k.ID, Pool: k.Pool, Round: run.nodeRound[i],
		State: job.StateCancelled, Code: code, At: now}, run.tenant)
}

// cancelNode ends node i of a cancelled round: one never queued ends
// cancelled without running; a queued or running one is cancelled; one
// that ended has its end written again, should its writer have died
// before it did.
func (r *Releaser) cancelNode(ctx context.Context, run *run, i int) error {
	k := run.key(i)
	rec, err := r.jobs.Last(ctx, k)
	switch {
	case errors.Is(err, queue.ErrNotFound):
		return r.end(ctx, run, i, job.CodeCancelled, "the run was cancelled")
	case err != nil:
		return fmt.Errorf("cancel node %s: %w", run.rec.Nodes[i].ID, err)
	case rec.State.Final():
		code := job.FailureCode("")
		if rec.Failure != nil && rec.State != job.StateSucceeded {
			code = rec.Failure.Code
		}
		return r.runs.NodeEnded(ctx, &job.NodeEnded{RunID: run.id, NodeID: run.rec.Nodes[i].ID, JobID: k.ID, Pool: k.Pool,
			Round: run.nodeRound[i], State: rec.State, Code: code, At: rec.UpdatedAt}, run.tenant)
	}
	return r.jobs.Cancel(ctx, run.tenant, k.ID)
}

// recordRun records the round as a span from its submission (or retry)
// to its end.
func (r *Releaser) recordRun(ctx context.Context, e *job.RunEnd) {
	_, span := telemetry.Tracer().Start(ctx, "fleet.run", trace.WithTimestamp(e.SubmittedAt),
		trace.WithAttributes(attribute.String("fleet.tenant", e.Tenant), attribute.String("fleet.run.id", e.RunID),
			attribute.Int("fleet.run.round", e.Round), attribute.Int("fleet.run.nodes", len(e.Nodes)),
			attribute.String("fleet.run.state", string(e.State))))
	if e.State != job.RunSucceeded {
		span.SetStatus(codes.Error, string(e.State))
	}
	span.End(trace.WithTimestamp(e.FinishedAt))
	r.m.duration.Record(ctx, e.FinishedAt.Sub(e.SubmittedAt).Seconds(), metric.WithAttributes(attribute.String("state", string(e.State))))
}

type metrics struct {
	runs     metric.Int64Counter
	ended    metric.Int64Counter
	released metric.Int64Counter
	skipped  metric.Int64Counter
	wait     metric.Float64Histogram
	duration metric.Float64Histogram
}

func newMetrics(m metric.Meter) metrics {
	var x metrics
	x.runs, _ = m.Int64Counter("fleet.runs.ended", metric.WithDescription("Runs (rounds of runs) that ended, by state"))
	x.ended, _ = m.Int64Counter("fleet.runs.nodes.ended", metric.WithDescription("Nodes of runs whose job ended, by state"))
	x.released, _ = m.Int64Counter("fleet.runs.nodes.released", metric.WithDescription("Nodes of runs queued as jobs"))
	x.skipped, _ = m.Int64Counter("fleet.runs.nodes.skipped", metric.WithDescription("Nodes of runs ended without running, by code"))
	x.wait, _ = m.Float64Histogram("fleet.runs.release.delay", metric.WithUnit("s"),
		metric.WithDescription("From the end of a node's job to the queueing of the nodes it released"),
		metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1, 5))
	x.duration, _ = m.Float64Histogram("fleet.runs.duration", metric.WithUnit("s"),
		metric.WithDescription("From a run's submission to its end, by state"),
		metric.WithExplicitBucketBoundaries(0.1, 1, 10, 60, 600, 3600, 21600, 86400))
	return x
}
