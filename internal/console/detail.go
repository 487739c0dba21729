package console

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// RequestView is what a page shows of a request: never the env's values,
// only their names, nor the inputs' contents, only their names.
type RequestView struct {
	Image, Workdir, PullPolicy    string
	Command                       []string
	EnvNames, InputNames, Outputs []string
	CPU, Memory                   string
	GPU                           int
	Timeout, QueueTimeout         string
	Deadline                      string
	MaxAttempts                   int
	RetryOn                       []job.FailureClass
	Labels                        map[string]string
	RunID, NodeID                 string
}

func viewRequest(r *job.Request) *RequestView {
	v := &RequestView{Image: r.Image, Workdir: r.Workdir, PullPolicy: string(r.PullPolicy), Command: r.Command,
		Outputs: r.Outputs, Labels: r.Labels, RunID: r.RunID, NodeID: r.NodeID}
	for k := range r.Env {
		v.EnvNames = append(v.EnvNames, k)
	}
	for k := range r.Inputs {
		v.InputNames = append(v.InputNames, k)
	}
	slices.Sort(v.EnvNames)
	slices.Sort(v.InputNames)
	if r.Resources != nil {
		v.CPU, v.Memory, v.GPU = r.Resources.CPU, r.Resources.Memory, r.Resources.GPU
	}
	dur := func(d *job.Duration) string {
		if d == nil {
			return ""
		}
		return d.String()
	}
	v.Timeout, v.QueueTimeout, v.Deadline = dur(r.Timeout), dur(r.QueueTimeout), dur(r.Deadline)
	if r.Retry != nil {
		v.MaxAttempts, v.RetryOn = r.Retry.MaxAttempts, r.Retry.RetryOn
	}
	return v
}

// follow is what a job's page knows of the job: every version of its
// record and its notices, read through the dispatcher's History when the
// page opens and, while its stream is open, as they come on the job's
// tenant's subjects.
type follow struct {
	key queue.JobKey

	mu      sync.Mutex
	latest  *job.Record // the last version
	seq     uint64      // its sequence in the pool's stream
	request *RequestView
	result  *job.Result
	events  []*job.Event // the versions' events and the notices that say something, by time
	logs    []*job.Event // the last maxLog log lines
	dropped int          // log lines before those
	beats   int          // plain heartbeats, not listed
	beat    time.Time    // the last one
	seen    map[string]bool
	version uint64
	subs    []*nats.Subscription
	// early holds what came live before the history was read.
	early   []any
	history bool
}

const (
	maxEvents = 500
	maxLog    = 300
)

// openJob reads a job's history; with live set, it first subscribes to
// the job's subjects, so that nothing stored meanwhile is missed, and
// follows them until close.
func (c *Console) openJob(ctx context.Context, k queue.JobKey, live bool) (*follow, error) {
	fl := &follow{key: k, seen: map[string]bool{}}
	if live {
		nc := c.cfg.JS.Conn()
		for _, subject := range []string{c.names.JobLive(k.Tenant, k.Pool, "*", k.ID), c.names.JobNotices(k.Tenant, k.Pool, k.ID)} {
			sub, err := nc.Subscribe(subject, fl.receive)
			if err != nil {
				fl.close()
				return nil, fmt.Errorf("follow job %s: %w", k.ID, err)
			}
			fl.subs = append(fl.subs, sub)
		}
		if err := nc.FlushTimeout(5 * time.Second); err != nil {
			fl.close()
			return nil, fmt.Errorf("follow job %s: %w", k.ID, err)
		}
	}
	h, err := c.history(ctx, k)
	if err != nil {
		fl.close()
		return nil, err
	}
	fl.mu.Lock()
	defer fl.mu.Unlock()
	for i, rec := range h.Records {
		fl.addRecord(rec, h.Seqs[i])
	}
	for _, n := range h.Notices {
		fl.addNotice(n)
	}
	fl.history = true
	for _, x := range fl.early {
		fl.add(x)
	}
	fl.early = nil
	if fl.latest == nil {
		fl.close()
		return nil, fmt.Errorf("%w: job %s/%s/%s", queue.ErrNotFound, k.Tenant, k.Pool, k.ID)
	}
	return fl, nil
}

// history reads a job's history through the dispatcher. The dispatcher
// finds a tenant's job id in the pool a dispatcher queued it in (the most
// recently queued, when several did); when that is not the pool asked
// for, the pool's stream is read here, without the request's secrets, as
// the dispatcher does.
func (c *Console) history(ctx context.Context, k queue.JobKey) (*job.HistoryReply, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	h, err := c.cfg.History(ctx, k.Tenant, k.ID)
	if err != nil {
		return nil, err
	}
	if len(h.Records) == 0 || len(h.Seqs) != len(h.Records) {
		return nil, fmt.Errorf("%w: job %s/%s/%s", queue.ErrNotFound, k.Tenant, k.Pool, k.ID)
	}
	if h.Records[0].Pool == k.Pool {
		return h, nil
	}
	recs, seqs, err := queue.NewJobs(c.cfg.JS, c.names).History(ctx, k)
	if err != nil {
		return nil, err
	}
	if len(recs) == 0 {
		return nil, fmt.Errorf("%w: job %s/%s/%s", queue.ErrNotFound, k.Tenant, k.Pool, k.ID)
	}
	for _, r := range recs {
		r.Secrets = ""
	}
	notices, err := queue.Notices(ctx, c.cfg.JS, c.names, k)
	if err != nil {
		c.log.Debug("a job's history without its notices", "job_id", k.ID, "err", err)
	}
	return &job.HistoryReply{Records: recs, Seqs: seqs, Notices: notices}, nil
}

// receive takes a version or a notice that came live.
func (fl *follow) receive(m *nats.Msg) {
	var x any
	if seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64); err == nil {
		var rec job.Record
		if err := json.Unmarshal(m.Data, &rec); err != nil {
			return
		}
		x = versioned{&rec, seq}
	} else {
		e, err := job.DecodeEvent(m.Data)
		if err != nil {
			return
		}
		x = e
	}
	fl.mu.Lock()
	defer fl.mu.Unlock()
	if !fl.history {
		fl.early = append(fl.early, x)
		return
	}
	fl.add(x)
}

type versioned struct {
	rec *job.Record
	seq uint64
}

func (fl *follow) add(x any) {
	switch x := x.(type) {
	case versioned:
		fl.addRecord(x.rec, x.seq)
	case *job.Event:
		fl.addNotice(x)
	}
}

// addRecord takes a version of the record, once.
func (fl *follow) addRecord(rec *job.Record, seq uint64) {
	if seq <= fl.seq {
		return
	}
	rec.Secrets = "" // never kept: only dispatchers and workers open them
	fl.seq = seq
	if rec.Request != nil {
		fl.request = viewRequest(rec.Request)
	}
	if rec.Result != nil {
		fl.result = rec.Result
	}
	latest := *rec
	latest.Request, latest.Result = nil, nil
	fl.latest = &latest
	for _, e := range job.EventsOf(rec) {
		fl.insert(e)
	}
	fl.version++
}

// addNotice takes a heartbeat or log event, once: a notice may come live
// and in the history.
func (fl *follow) addNotice(e *job.Event) {
	key := fmt.Sprint(e.Type, e.Time.UnixNano(), e.Attempt, e.Phase, e.Stream, e.Line)
	if fl.seen[key] {
		return
	}
	fl.seen[key] = true
	switch {
	case e.Type == job.EventLog:
		fl.logs = append(fl.logs, e)
		if len(fl.logs) > maxLog {
			fl.dropped += len(fl.logs) - maxLog
			fl.logs = slices.Delete(fl.logs, 0, len(fl.logs)-maxLog)
		}
	case e.Type == job.EventHeartbeat && (e.Phase == "" || e.Phase == job.PhaseUsage) && e.Message == "":
		// A running attempt's periodic heartbeat: counted, not listed.
		fl.beats++
		if e.Time.After(fl.beat) {
			fl.beat = e.Time
		}
	default:
		fl.insert(e)
	}
	fl.version++
}

// insert places an event by time; the last ones are kept.
func (fl *follow) insert(e *job.Event) {
	i := len(fl.events)
	for i > 0 && fl.events[i-1].Time.After(e.Time) {
		i--
	}
	fl.events = slices.Insert(fl.events, i, e)
	if len(fl.events) > maxEvents {
		fl.events = slices.Delete(fl.events, 0, len(fl.events)-maxEvents)
	}
}

func (fl *follow) changed() uint64 {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	return fl.version
}

// close stops following the job.
func (fl *follow) close() {
	for _, s := range fl.subs {
		_ = s.Unsubscribe()
	}
	fl.subs = nil
}

// jobDetail is what a job's page shows.
type jobDetail struct {
	Key      queue.JobKey
	Record   *job.Record
	Result   *job.Result
	Request  *RequestView
	Events   []*job.Event
	Logs     []*job.Event
	Dropped  int
	Beats    int
	Beat     time.Time
	Attempts []job.Attempt
	Retries  []Row // jobs that retried this one (ID-retry-N)
}

// detail is what fl knows of the job now.
func (c *Console) detail(fl *follow) *jobDetail {
	fl.mu.Lock()
	d := &jobDetail{Key: fl.key, Record: fl.latest, Result: fl.result, Request: fl.request, Events: slices.Clone(fl.events),
		Logs: slices.Clone(fl.logs), Dropped: fl.dropped, Beats: fl.beats, Beat: fl.beat}
	fl.mu.Unlock()
	d.Attempts = slices.Clone(d.Record.History)
	if last := lastAttempt(d.Record, d.Result); last != nil {
		d.Attempts = append(d.Attempts, *last)
	}
	for k := 1; k <= 100; k++ {
		rk := queue.JobKey{Tenant: fl.key.Tenant, Pool: fl.key.Pool, ID: job.RetryID(fl.key.ID, k)}
		row, _, ok := c.index.Job(rk)
		if !ok {
			break
		}
		d.Retries = append(d.Retries, row)
	}
	return d
}

// lastAttempt is the attempt the record's fields describe (the one that
// runs, or that ended the job), if the job ever started one.
func lastAttempt(rec *job.Record, res *job.Result) *job.Attempt {
	if rec.Attempt == 0 || rec.StartedAt == nil {
		return nil
	}
	for _, h := range rec.History {
		if h.Attempt >= rec.Attempt {
			return nil // the record is between attempts: its last is in the history
		}
	}
	a := &job.Attempt{Attempt: rec.Attempt, WorkerID: rec.WorkerID, FinishedAt: rec.FinishedAt, ExitCode: rec.ExitCode,
		Failure: rec.Failure}
	if res != nil {
		a.StartedAt, a.WorkerID, a.ExitCode = res.StartedAt, res.WorkerID, res.ExitCode
	}
	if a.StartedAt == nil && len(rec.History) == 0 {
		a.StartedAt = rec.StartedAt
	}
	if rec.State == job.StateRetrying {
		return nil
	}
	return a
}
