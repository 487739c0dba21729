package dispatcher

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/internal/runs"
	"github.com/fleet-dev/fleet/internal/telemetry"
	"github.com/fleet-dev/fleet/job"
)

// Runs: a tenant's graph of jobs submitted at once (see internal/runs).
// A dispatcher checks a run whole, as it checks a job (each node's
// request, and its admission), writes its definition, the run's first
// message on the runs' stream, and answers; the releaser, which every
// dispatcher runs and one at a time holds, queues its nodes from there.

// runAdmitters bounds the nodes of a run admitted side by side: a pool
// with no live worker makes its first request wait (see Admission), and
// the others of the pool share that wait.
const runAdmitters = 32

// SubmitRun accepts a run of tenant whole, or refuses it whole with every
// problem, each naming its node and field. A run whose id the tenant has
// already is not run again: the answer says so, with that run's state.
func (d *Dispatcher) SubmitRun(ctx context.Context, tenant string, data []byte) (*job.RunSubmitReply, error) {
	ctx, span := telemetry.Tracer().Start(ctx, "fleet.run.submit", trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("fleet.tenant", tenant)))
	defer span.End()
	reply, err := d.submitRun(ctx, tenant, data)
	switch {
	case err != nil:
		span.RecordError(err)
		span.SetStatus(codes.Error, "submission failed")
	case reply.Rejected():
		span.SetStatus(codes.Error, "rejected")
	default:
		span.SetAttributes(attribute.String("fleet.run.id", reply.RunID), attribute.Int("fleet.run.nodes", reply.Nodes),
			attribute.Bool("fleet.duplicate", reply.Duplicate))
	}
	return reply, err
}

func (d *Dispatcher) submitRun(ctx context.Context, tenant string, data []byte) (*job.RunSubmitReply, error) {
	refuse := func(err error) *job.RunSubmitReply {
		r := &job.RunSubmitReply{Tenant: tenant, Error: err.Error()}
		var re *job.RunError
		if errors.As(err, &re) {
			r.Problems = re.Problems
		}
		return r
	}
	if !job.ValidTenant(tenant) {
		return refuse(fmt.Errorf("tenant %q must be 1 to 64 characters of [A-Za-z0-9_-]", tenant)), nil
	}
	limits := job.RunLimits{MaxNodes: d.cfg.MaxRunNodes, MaxBytes: int(d.nc.MaxPayload())}
	rr, err := job.DecodeRunRequest(data, limits)
	if err == nil {
		err = rr.Validate(d.cfg.Limits, limits)
	}
	if err != nil {
		return refuse(err), nil
	}
	if rr.ID == "" {
		rr.ID = job.NewID()
	}
	reply := &job.RunSubmitReply{RunID: rr.ID, Tenant: tenant, State: job.RunRunning, Nodes: len(rr.Nodes)}
	rec := &job.RunRecord{RunID: rr.ID, Tenant: tenant, SubmittedAt: time.Now(), Labels: rr.Labels,
		TraceID: telemetry.TraceID(ctx), Nodes: make([]job.RunNodeRecord, len(rr.Nodes))}
	// Each node is admitted as its job would be, its secrets sealed for
	// its first job.
	problems := make([]string, len(rr.Nodes))
	var transient error
	var mu sync.Mutex
	var wg sync.WaitGroup
	next := make(chan int)
	for range min(runAdmitters, len(rr.Nodes)) {
		wg.Go(func() {
			for i := range next {
				p, err := d.admitNode(ctx, tenant, rr.ID, &rr.Nodes[i], &rec.Nodes[i])
				mu.Lock()
				if err != nil && transient == nil {
					transient = err
				}
				problems[i] = p
				mu.Unlock()
			}
		})
	}
	for i := range rr.Nodes {
		next <- i
	}
	close(next)
	wg.Wait()
	if transient != nil {
		return nil, transient
	}
	var refused []string
	for i, p := range problems {
		if p != "" {
			refused = append(refused, fmt.Sprintf("nodes[%d] (%s): %s", i, rr.Nodes[i].ID, p))
		}
	}
	if refused != nil {
		return refuse(&job.RunError{Problems: refused}), nil
	}
	_, err = d.runs.Define(ctx, rec)
	if errors.Is(err, queue.ErrRunExists) {
		reply.Duplicate = true
		if v, err := runs.View(ctx, d.runs, runsSide{d}, tenant, rr.ID); err == nil {
			reply.State, reply.Nodes = v.State, len(v.Nodes)
		}
		return reply, nil
	}
	if err != nil {
		return nil, errTransient{err}
	}
	d.m.runs.Add(ctx, 1)
	return reply, nil
}

// admitNode admits node n of run as its job would be admitted, and makes
// its record: the problem that refuses it, or an error when the fleet
// cannot tell now.
func (d *Dispatcher) admitNode(ctx context.Context, tenant, run string, n *job.RunNode, out *job.RunNodeRecord) (string, error) {
	req := n.Job.Clone()
	req.ID, req.RunID, req.NodeID = job.RunJobID(run, n.ID, 1), run, n.ID
	req.Pool, req.Priority = cmp.Or(req.Pool, job.DefaultPool), cmp.Or(req.Priority, job.DefaultPriority)
	if d.cfg.Admission != nil {
		normalized := req.Clone()
		normalized.Normalize()
		if _, err := d.cfg.Admission.Admit(withTenant(ctx, tenant), normalized); err != nil {
			var te errTransient
			if errors.As(err, &te) {
				return "", err
			}
			return err.Error(), nil
		}
	}
	// The record keeps the request as submitted (its defaults are filled
	// in again where it runs), without what the fleet sets.
	submitted := n.Job.Clone()
	secrets, err := d.sealer.Seal(queue.JobKey{Tenant: tenant, Pool: req.Pool, ID: req.ID}, submitted)
	if err != nil {
		return "", fmt.Errorf("seal the request's secrets: %w", err)
	}
	*out = job.RunNodeRecord{ID: n.ID, After: n.After, InputsFrom: n.InputsFrom, When: n.When, Pool: req.Pool,
		Priority: req.Priority, Job: submitted, Secrets: secrets}
	return "", nil
}

// RunStatus returns a tenant's run as it stands.
func (d *Dispatcher) RunStatus(ctx context.Context, tenant, id string) (*job.RunView, error) {
	if err := d.checkRun(tenant, id); err != nil {
		return nil, err
	}
	return runs.View(ctx, d.runs, runsSide{d}, tenant, id)
}

// CancelRun asks for a tenant's run to be cancelled: every node that has
// not ended ends cancelled, and the run with them.
func (d *Dispatcher) CancelRun(ctx context.Context, tenant, id string) (*job.RunReply, error) {
	if err := d.checkRun(tenant, id); err != nil {
		return nil, err
	}
	round, err := runs.Cancel(ctx, d.runs, tenant, id)
	if errors.Is(err, runs.ErrRunEnded) || errors.Is(err, runs.ErrUnderWay) {
		return &job.RunReply{RunID: id, Round: round, Message: "nothing to cancel: " + err.Error()}, nil
	}
	if err != nil {
		return nil, err
	}
	d.log.Info("run cancelled", "tenant", tenant, "run", id, "round", round)
	return &job.RunReply{RunID: id, Round: round, Cancelled: true, Message: "every node that has not ended is cancelled"}, nil
}

// RetryRun starts the next round of a tenant's run that ended without
// succeeding: its failed and cancelled nodes and every node after them run
// again, as new jobs; the nodes that succeeded keep their jobs and
// outputs.
func (d *Dispatcher) RetryRun(ctx context.Context, tenant, id string) (*job.RunReply, error) {
	reply, _, err := d.retryRun(ctx, tenant, id)
	return reply, err
}

// retryRun is RetryRun, and says why a retry that starts no round did
// not: runs.ErrRunNotEnded, ErrSucceeded or ErrUnderWay, as nothing in
// its answer but its words does.
func (d *Dispatcher) retryRun(ctx context.Context, tenant, id string) (reply *job.RunReply, none, err error) {
	if err := d.checkRun(tenant, id); err != nil {
		return nil, nil, err
	}
	round, again, err := runs.Retry(ctx, d.runs, tenant, id)
	switch {
	case errors.Is(err, runs.ErrSucceeded), errors.Is(err, runs.ErrUnderWay), errors.Is(err, runs.ErrRunNotEnded):
		return &job.RunReply{RunID: id, Round: round, Message: "nothing to retry: " + err.Error()}, err, nil
	case err != nil:
		return nil, nil, err
	}
	d.log.Info("run retried", "tenant", tenant, "run", id, "round", round, "nodes", len(again))
	return &job.RunReply{RunID: id, Round: round, Retried: again,
		Message: fmt.Sprintf("round %d runs %d nodes again", round, len(again))}, nil, nil
}

// ListRuns lists a tenant's runs still kept, oldest first.
func (d *Dispatcher) ListRuns(ctx context.Context, tenant string) (*job.RunList, error) {
	if !job.ValidTenant(tenant) {
		return nil, invalidf("%q is not a tenant", tenant)
	}
	list, err := d.runs.List(ctx, tenant)
	if err != nil {
		return nil, err
	}
	return &job.RunList{Runs: list}, nil
}

func (d *Dispatcher) checkRun(tenant, id string) error {
	switch {
	case !job.ValidTenant(tenant):
		return invalidf("%q is not a tenant", tenant)
	case !job.ValidRunID(id):
		return fmt.Errorf("%w: %q is not a run id", queue.ErrNotFound, id)
	}
	return nil
}

// onRunRequest serves the tenants' requests about runs,
// <prefix>.t.<tenant>.runs.{submit,list,status,cancel,retry}[.<run>].
func (d *Dispatcher) onRunRequest(m *nats.Msg) {
	tenant, verb, id, ok := d.names.ParseRunRequest(m.Subject)
	if !ok {
		return
	}
	d.answer(m, func(ctx context.Context) ([]byte, error) {
		var v any
		var err error
		switch {
		case verb == "submit" && id == "":
			v, err = d.SubmitRun(ctx, tenant, m.Data)
		case verb == "list" && id == "":
			v, err = d.ListRuns(ctx, tenant)
		case verb == "status" && id != "":
			v, err = d.RunStatus(ctx, tenant, id)
		case verb == "cancel" && id != "":
			v, err = d.CancelRun(ctx, tenant, id)
		case verb == "retry" && id != "":
			v, err = d.RetryRun(ctx, tenant, id)
		default:
			err = invalidf("%q is not a request about runs: runs.submit, runs.list, runs.status.<run>, runs.cancel.<run>, runs.retry.<run>",
				m.Subject)
		}
		return d.replyOf(v, err, "run "+verb, m.Subject)
	})
}

// runsSide is the dispatcher as its releaser sees it (runs.Jobs).
type runsSide struct{ d *Dispatcher }

func (s runsSide) QueueAll(ctx context.Context, tenant string, reqs []*job.Request) []error {
	bs := make([]*batched, len(reqs))
	for i, req := range reqs {
		bs[i] = &batched{ctx: withoutAdmission(ctx), tenant: tenant, req: req}
	}
	errs := make([]error, len(reqs))
	s.d.submitBatch(bs, func(b *batched) {
		switch {
		case b.err != nil:
			errs[b.index] = b.err
		case b.reply.Rejected():
			errs[b.index] = fmt.Errorf("node job %s refused: %s", b.req.ID, b.reply.Error)
		}
	})
	return errs
}

func (s runsSide) EndUnqueued(ctx context.Context, rec *job.Record) (bool, error) {
	if err := s.d.ensurePool(ctx, rec.Pool); err != nil {
		return false, err
	}
	s.d.ensureFeed(rec.Tenant, rec.Pool)
	_, err := s.d.jobs.Write(ctx, rec, 0)
	switch {
	case errors.Is(err, queue.ErrConflict), errors.Is(err, queue.ErrFinal):
		return false, nil
	case err != nil:
		return false, err
	}
	return true, nil
}

func (s runsSide) Cancel(ctx context.Context, tenant, id string) error {
	_, err := s.d.Cancel(ctx, tenant, id)
	return err
}

func (s runsSide) Last(ctx context.Context, k queue.JobKey) (*job.Record, error) {
	rec, _, err := s.d.jobs.Latest(ctx, k)
	return rec, err
}

// nodeEnded writes, for a run's node, that its job ended with rec (a
// dispatcher ends a node's job when it cancels it while queued): the end
// that takes the nodes after it on. Written again by a second cancel, or
// the releaser's cancel of the run, should the first writer have died
// before.
func (d *Dispatcher) nodeEnded(ctx context.Context, rec *job.Record) error {
	e, ok := job.EndOf(rec)
	if !ok {
		return nil
	}
	return d.runs.NodeEnded(ctx, e, rec.Tenant)
}

// withoutAdmission marks a submission that skips admission: a run's
// node, admitted with the run whole.
func withoutAdmission(ctx context.Context) context.Context {
	return context.WithValue(ctx, noAdmissionKey{}, true)
}

func admissionSkipped(ctx context.Context) bool {
	v, _ := ctx.Value(noAdmissionKey{}).(bool)
	return v
}

type noAdmissionKey struct{}
