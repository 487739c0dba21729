package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/job"
)

// A run's messages are kept in the stream FLEET_RUNS, each on a subject of
// its run, <prefix>.r.<tenant>.<run>.<what>:
//
//	def                   the run as accepted (job.RunRecord): the first message, its idempotency gate
//	node.<pool>.<node>    a node's job ended (job.NodeEnded), written once its final version is stored,
//	                      by the pool's worker that wrote it (or a dispatcher, for one it ended)
//	cancel.<round>        a cancel of the run was asked for (job.RunCancel)
//	retry.<round>         a retry of the run, its round <round> (job.RunRetry)
//	end.<round>           the summary of the round (job.RunEnd): the run's one end, for that round
//
// The stream republishes each on <prefix>.t.<tenant>.run.<run>.<what>, for
// the tenant's watchers. The dispatchers share a durable consumer on the
// definitions, node ends, cancels and retries (RunsConsumer): each message
// is handled by one dispatcher, which queues the nodes it releases (see
// internal/runs).

// Subjects and names of runs.
func (n Names) RunsStream() string { return n.stream("RUNS") }

// RunsConsumer is the durable consumer the dispatchers share on the runs'
// stream.
func (n Names) RunsConsumer() string { return "releaser" }

// AllRuns matches every message of every run.
func (n Names) AllRuns() string { return n.prefix() + ".r.>" }

func (n Names) run(tenant, run string) string { return n.prefix() + ".r." + tenant + "." + run }

// RunDef is the subject of a run's definition.
func (n Names) RunDef(tenant, run string) string { return n.run(tenant, run) + ".def" }

// RunNodeEnded is the subject of the end of a node's job.
func (n Names) RunNodeEnded(tenant, run, pool, node string) string {
	return n.run(tenant, run) + ".node." + pool + "." + node
}

// RunNodesEnded matches the node ends of a run.
func (n Names) RunNodesEnded(tenant, run string) string { return n.run(tenant, run) + ".node.>" }

// RunCancel is the subject of a cancel of a run's round.
func (n Names) RunCancel(tenant, run string, round int) string {
	return n.run(tenant, run) + ".cancel." + strconv.Itoa(round)
}

// RunRetry is the subject of the retry that starts a run's round.
func (n Names) RunRetry(tenant, run string, round int) string {
	return n.run(tenant, run) + ".retry." + strconv.Itoa(round)
}

// RunEnd is the subject of the summary of a run's round.
func (n Names) RunEnd(tenant, run string, round int) string {
	return n.run(tenant, run) + ".end." + strconv.Itoa(round)
}

// RunAll matches every message of one run.
func (n Names) RunAll(tenant, run string) string { return n.run(tenant, run) + ".>" }

// TenantRunDefs matches the definitions of a tenant's runs.
func (n Names) TenantRunDefs(tenant string) string { return n.prefix() + ".r." + tenant + ".*.def" }

// RunLive is the subject a run's message on <what> is republished on.
func (n Names) RunLive(tenant, run, what string) string {
	return n.prefix() + ".t." + tenant + ".run." + run + "." + what
}

// AllRunRoundsLive matches the live copies of every run's messages but its
// node ends: its definition, cancels, retries and summaries, what changes
// a run's round or state.
func (n Names) AllRunRoundsLive() []string {
	p := n.prefix() + ".t.*.run.*."
	return []string{p + "def", p + "cancel.*", p + "retry.*", p + "end.*"}
}

// ParseRunLive reads the subject a run's message is republished on, as
// ParseRun reads the message's own.
func (n Names) ParseRunLive(subject string) (RunMessage, bool) {
	rest, ok := strings.CutPrefix(subject, n.prefix()+".t.")
	if !ok {
		return RunMessage{}, false
	}
	tenant, rest, ok1 := strings.Cut(rest, ".")
	rest, ok2 := strings.CutPrefix(rest, "run.")
	run, what, ok3 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || !ok3 {
		return RunMessage{}, false
	}
	return n.ParseRun(n.run(tenant, run) + "." + what)
}

// RunRequest is the subject of a tenant's request about runs: verb is
// submit or list (run empty), or status, cancel or retry.
func (n Names) RunRequest(tenant, verb, run string) string {
	s := n.prefix() + ".t." + tenant + ".runs." + verb
	if run != "" {
		s += "." + run
	}
	return s
}

// AllRunRequests matches every tenant's requests about runs.
func (n Names) AllRunRequests() string { return n.prefix() + ".t.*.runs.>" }

// ParseRunRequest reads the subject of a request about runs.
func (n Names) ParseRunRequest(subject string) (tenant, verb, run string, ok bool) {
	rest, ok := strings.CutPrefix(subject, n.prefix()+".t.")
	if !ok {
		return "", "", "", false
	}
	parts := strings.Split(rest, ".")
	switch {
	case len(parts) == 3 && parts[1] == "runs":
		return parts[0], parts[2], "", true
	case len(parts) == 4 && parts[1] == "runs":
		return parts[0], parts[2], parts[3], true
	}
	return "", "", "", false
}

// RunMessage is what a message of the runs' stream is about.
type RunMessage struct {
	Tenant, Run string
	// What: "def", "node", "cancel", "retry" or "end".
	What string
	// Pool and Node, for a node's end; Round, for a cancel, a retry or an
	// end.
	Pool, Node string
	Round      int
}

// ParseRun reads a subject of the runs' stream.
func (n Names) ParseRun(subject string) (RunMessage, bool) {
	rest, ok := strings.CutPrefix(subject, n.prefix()+".r.")
	if !ok {
		return RunMessage{}, false
	}
	parts := strings.Split(rest, ".")
	if len(parts) < 3 || !job.ValidTenant(parts[0]) || !job.ValidRunID(parts[1]) {
		return RunMessage{}, false
	}
	m := RunMessage{Tenant: parts[0], Run: parts[1], What: parts[2]}
	switch {
	case m.What == "def" && len(parts) == 3:
		return m, true
	case m.What == "node" && len(parts) == 5 && job.ValidPool(parts[3]) && job.ValidNodeID(parts[4]):
		m.Pool, m.Node = parts[3], parts[4]
		return m, true
	case (m.What == "cancel" || m.What == "retry" || m.What == "end") && len(parts) == 4:
		r, err := strconv.Atoi(parts[3])
		if err != nil || r < 1 || strconv.Itoa(r) != parts[3] {
			return RunMessage{}, false
		}
		m.Round = r
		return m, true
	}
	return RunMessage{}, false
}

// RunsStream returns the configuration of the runs' stream.
func (c Config) RunsStream() jetstream.StreamConfig {
	c = c.WithDefaults()
	p := c.prefix()
	return jetstream.StreamConfig{
		Name: c.Names.RunsStream(), Description: "Runs: their definitions, their nodes' ends, cancels, retries and summaries",
		Subjects: []string{c.AllRuns()}, Storage: c.storage(), Replicas: c.Replicas, Duplicates: c.DuplicateWindow,
		Retention: jetstream.LimitsPolicy, Discard: jetstream.DiscardOld, MaxAge: c.Retention,
		MaxMsgs: -1, MaxBytes: -1, MaxMsgsPerSubject: -1, MaxConsumers: -1, AllowDirect: true,
		RePublish: &jetstream.RePublish{Source: p + ".r.*.*.>", Destination: p + ".t.{{wildcard(1)}}.run.{{wildcard(2)}}.>"},
	}
}

// RunsGroup is the priority group the dispatchers pull the runs' messages
// in: one client of it is pinned, and receives them all.
const RunsGroup = "releasers"

// RunsConsumerConfig is the durable consumer the dispatchers share on the
// runs' stream: every message but a summary, in the stream's order, to the
// one dispatcher pinned in RunsGroup, until it acknowledges it; when the
// pinned one has not pulled for pinnedTTL, another is pinned.
func (c Config) RunsConsumerConfig(pinnedTTL time.Duration) jetstream.ConsumerConfig {
	c = c.WithDefaults()
	p := c.prefix()
	return jetstream.ConsumerConfig{
		Durable: c.Names.RunsConsumer(), Description: "Runs: the dispatchers release the nodes the messages make ready",
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: 10 * time.Second, MaxDeliver: -1, MaxAckPending: 10000,
		FilterSubjects: []string{p + ".r.*.*.def", p + ".r.*.*.node.*.*", p + ".r.*.*.cancel.*", p + ".r.*.*.retry.*"},
		Replicas:       c.Replicas,
		PriorityGroups: []string{RunsGroup}, PriorityPolicy: jetstream.PriorityPolicyPinned, PinnedTTL: pinnedTTL,
	}
}

// Runs keeps the messages of runs in the runs' stream.
type Runs struct {
	nc    *nats.Conn
	js    jetstream.JetStream
	names Names
}

// NewRuns returns the runs' store of a connection.
func NewRuns(js jetstream.JetStream, names Names) *Runs {
	return &Runs{nc: js.Conn(), js: js, names: names}
}

// ErrRunExists: a run with that id exists already.
var ErrRunExists = errors.New("a run with that id exists")

// putOnce writes v on subject unless the subject has a message already
// (ErrRunExists then): a compare-and-set on the subject's last sequence
// being none, with a message id of the write's own (see writeID), so
// that the write sent again after its answer was lost is not taken for
// another's.
func (r *Runs) putOnce(ctx context.Context, subject, what string, v any) (uint64, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return 0, fmt.Errorf("encode %s: %w", subject, err)
	}
	m := nats.NewMsg(subject)
	m.Data = data
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "0")
	m.Header.Set(jetstream.MsgIDHeader, writeID(what))
	var seq uint64
	dup := false
	err = Retry(ctx, func(ctx context.Context) error {
		ack, err := r.js.PublishMsg(ctx, m)
		if err == nil {
			seq, dup = ack.Sequence, ack.Duplicate
		}
		return err
	}, nil)
	switch {
	case IsWrongLastSequence(err):
		return 0, ErrRunExists
	case err != nil:
		return 0, fmt.Errorf("write %s: %w", subject, err)
	case dup:
		// Its own first try's, whose answer was lost: no other write has
		// its id.
		return seq, nil
	}
	return seq, nil
}

// writeID is the message id of one write of what: what, and a random
// part that only this write has, the same in each of its tries. The
// runs' stream takes messages from every pool's workers (a node's end, on
// its pool's subjects) and keeps the ids of its messages for its
// duplicate window, whatever their subjects: an id that others could
// know beforehand (a run's, a node's job's) would let a pool's workers
// write it first, on their own subject, and have the fleet's message
// dropped as a duplicate of theirs.
func writeID(what string) string { return what + "/" + job.NewID() }

// Define writes a run's definition, the run's first message: ErrRunExists
// when the tenant has a run of that id.
func (r *Runs) Define(ctx context.Context, rec *job.RunRecord) (uint64, error) {
	return r.putOnce(ctx, r.names.RunDef(rec.Tenant, rec.RunID), rec.Tenant+"/"+rec.RunID+"/def", rec)
}

// Cancel writes a cancel of a run's round: ErrRunExists when one was
// written already.
func (r *Runs) Cancel(ctx context.Context, c *job.RunCancel) error {
	_, err := r.putOnce(ctx, r.names.RunCancel(c.Tenant, c.RunID, c.Round), c.Tenant+"/"+c.RunID+"/cancel/"+strconv.Itoa(c.Round), c)
	return err
}

// Retry writes the retry that starts a run's round: ErrRunExists when the
// round has started already.
func (r *Runs) Retry(ctx context.Context, rt *job.RunRetry) error {
	_, err := r.putOnce(ctx, r.names.RunRetry(rt.Tenant, rt.RunID, rt.Round), rt.Tenant+"/"+rt.RunID+"/retry/"+strconv.Itoa(rt.Round), rt)
	return err
}

// End writes the summary of a run's round, once: ErrRunExists when it
// has one.
func (r *Runs) End(ctx context.Context, e *job.RunEnd) error {
	_, err := r.putOnce(ctx, r.names.RunEnd(e.Tenant, e.RunID, e.Round), e.Tenant+"/"+e.RunID+"/end/"+strconv.Itoa(e.Round), e)
	return err
}

// NodeEndedMsg is the message that says a node's job ended: on the node's
// subject of its pool, with a message id of its own (see writeID), so
// that the message sent again after its answer was lost is stored once.
// One said again (by a later delivery of the job, or a dispatcher) is
// stored again: its readers take an end they know as nothing new.
func (n Names) NodeEndedMsg(e *job.NodeEnded, tenant string) (*nats.Msg, error) {
	data, err := json.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("encode the end of node %s: %w", e.NodeID, err)
	}
	m := nats.NewMsg(n.RunNodeEnded(tenant, e.RunID, e.Pool, e.NodeID))
	m.Data = data
	m.Header.Set(jetstream.MsgIDHeader, writeID(tenant+"/"+e.JobID+"/ended"))
	return m, nil
}

// NodeEnded writes that a node's job ended, and waits until it is stored.
func (r *Runs) NodeEnded(ctx context.Context, e *job.NodeEnded, tenant string) error {
	m, err := r.names.NodeEndedMsg(e, tenant)
	if err != nil {
		return err
	}
	err = Retry(ctx, func(ctx context.Context) error {
		_, err := r.js.PublishMsg(ctx, m)
		return err
	}, nil)
	if err != nil {
		return fmt.Errorf("write the end of node %s of run %s: %w", e.NodeID, e.RunID, err)
	}
	return nil
}

// last reads the last message on subject from the stream's leader; nil
// when there is none.
func (r *Runs) last(ctx context.Context, subject string) ([]byte, error) {
	var data []byte
	err := Retry(ctx, func(ctx context.Context) (err error) {
		data, err = leaderLast(ctx, r.nc, r.names.RunsStream(), subject)
		return err
	}, nil)
	return data, err
}

// Def reads a run's definition: ErrNotFound when the tenant has no such
// run.
func (r *Runs) Def(ctx context.Context, tenant, run string) (*job.RunRecord, error) {
	data, err := r.last(ctx, r.names.RunDef(tenant, run))
	if err != nil {
		return nil, fmt.Errorf("read run %s: %w", run, err)
	}
	if data == nil {
		return nil, fmt.Errorf("%w: run %s", ErrNotFound, run)
	}
	return DecodeDef(data, tenant, run)
}

// DecodeDef decodes a run's definition, the body of its def message,
// which must name the run of its subject.
func DecodeDef(data []byte, tenant, run string) (*job.RunRecord, error) {
	var rec job.RunRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, fmt.Errorf("read run %s: %w", run, err)
	}
	if rec.Tenant != tenant || rec.RunID != run {
		return nil, fmt.Errorf("read run %s: its definition names run %s/%s", run, rec.Tenant, rec.RunID)
	}
	return &rec, nil
}

// Rounds reads what a run's rounds say: its retries (from round 2 on,
// in order), which rounds were cancelled, and which ended, with their
// summaries. The messages are read from the stream's leader, by the
// subjects' last messages.
func (r *Runs) Rounds(ctx context.Context, tenant, run string) (*RunRounds, error) {
	out := &RunRounds{Cancelled: map[int]bool{}, Ended: map[int]*job.RunEnd{}}
	msgs, err := r.read(ctx, r.names.RunAll(tenant, run), jetstream.DeliverLastPerSubjectPolicy)
	if err != nil {
		return nil, fmt.Errorf("read the rounds of run %s: %w", run, err)
	}
	for _, m := range msgs {
		rm, ok := r.names.ParseRun(m.Subject())
		if !ok || rm.Tenant != tenant || rm.Run != run {
			continue
		}
		switch rm.What {
		case "retry":
			var rt job.RunRetry
			if json.Unmarshal(m.Data(), &rt) == nil && rt.Round == rm.Round {
				out.Retries = append(out.Retries, &rt)
			}
		case "cancel":
			out.Cancelled[rm.Round] = true
		case "end":
			var e job.RunEnd
			if json.Unmarshal(m.Data(), &e) == nil && e.Round == rm.Round {
				out.Ended[rm.Round] = &e
			}
		}
	}
	return out, nil
}

// RunRounds is what a run's rounds say (see Runs.Rounds).
type RunRounds struct {
	Retries   []*job.RunRetry
	Cancelled map[int]bool
	Ended     map[int]*job.RunEnd
}

// Round is the run's last round: 1, or its last retry's.
func (rr *RunRounds) Round() int {
	n := 1
	for _, rt := range rr.Retries {
		n = max(n, rt.Round)
	}
	return n
}

// NodesEnded reads every end written of a run's nodes, in stream order.
// A node has one pool, but every pool's workers may write on their own
// pool's subject of any node, and an end of an earlier round may be
// written again after a later round's (a copy of an old round's job
// acknowledged, a cancel of it): the reader keeps the ends of the node's
// pool and its job in the run's round (see runs.run.apply), so that no
// end written later hides the one that counts. (The last end of each
// subject alone would: the subject names no round.)
func (r *Runs) NodesEnded(ctx context.Context, tenant, run string) ([]*job.NodeEnded, error) {
	msgs, err := r.read(ctx, r.names.RunNodesEnded(tenant, run), jetstream.DeliverAllPolicy)
	if err != nil {
		return nil, fmt.Errorf("read the node ends of run %s: %w", run, err)
	}
	var out []*job.NodeEnded
	for _, m := range msgs {
		rm, ok := r.names.ParseRun(m.Subject())
		if !ok || rm.What != "node" || rm.Tenant != tenant || rm.Run != run {
			continue
		}
		var e job.NodeEnded
		if json.Unmarshal(m.Data(), &e) == nil && e.NodeID == rm.Node && e.RunID == run && e.Pool == rm.Pool {
			out = append(out, &e)
		}
	}
	return out, nil
}

// Runs lists the ids of a tenant's runs still in the stream, oldest first.
func (r *Runs) List(ctx context.Context, tenant string) ([]string, error) {
	msgs, err := r.read(ctx, r.names.TenantRunDefs(tenant), jetstream.DeliverLastPerSubjectPolicy)
	if err != nil {
		return nil, fmt.Errorf("list the runs of %s: %w", tenant, err)
	}
	var out []string
	for _, m := range msgs {
		if rm, ok := r.names.ParseRun(m.Subject()); ok && rm.What == "def" && rm.Tenant == tenant {
			out = append(out, rm.Run)
		}
	}
	return out, nil
}

// read reads the messages that filter matches, as policy says (the last
// of each subject, or all), in stream order (see readAll, which reads
// again until the read is whole).
func (r *Runs) read(ctx context.Context, filter string, policy jetstream.DeliverPolicy) ([]jetstream.Msg, error) {
	var out []jetstream.Msg
	err := readAll(ctx, r.js, r.names.RunsStream(), jetstream.ConsumerConfig{
		FilterSubjects: []string{filter}, DeliverPolicy: policy}, 1000,
		func(m jetstream.Msg) error { out = append(out, m); return nil })
	return out, err
}
