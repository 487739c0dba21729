package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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

// findRequest looks for a job's request in its pool's queue, where it
// stays until the job ends: from the first message stored at its
// submission time, one message of the pool at a time, by its message id.
// It gives up after a bounded look (the request is then not shown).
func (c *Console) findRequest(ctx context.Context, rec *job.Record) (*RequestView, error) {
	nc := c.cfg.JS.Conn()
	subject := c.names.Jobs(rec.Pool)
	stream, err := c.cfg.JS.StreamNameBySubject(ctx, subject)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil // the pool's stream is gone, with the request
	}
	if err != nil {
		return nil, fmt.Errorf("the queue of %s: %w", rec.Pool, err)
	}
	start := rec.SubmittedAt.Add(-5 * time.Second)
	seq := uint64(0)
	for range 200 {
		req := map[string]any{"next_by_subj": subject}
		if seq == 0 {
			req["start_time"] = start
		} else {
			req["seq"] = seq + 1
		}
		data, _ := json.Marshal(req)
		m, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+stream, data)
		if err != nil {
			return nil, fmt.Errorf("read the queue of %s: %w", rec.Pool, err)
		}
		var resp struct {
			Message *struct {
				Seq  uint64    `json:"seq"`
				Hdrs []byte    `json:"hdrs"`
				Data []byte    `json:"data"`
				Time time.Time `json:"time"`
			} `json:"message"`
			Error *jetstream.APIError `json:"error"`
		}
		if err := json.Unmarshal(m.Data, &resp); err != nil {
			return nil, fmt.Errorf("read the queue of %s: %w", rec.Pool, err)
		}
		if resp.Error != nil || resp.Message == nil {
			return nil, nil // no more messages
		}
		msg := resp.Message
		seq = msg.Seq
		if msg.Time.After(rec.SubmittedAt.Add(time.Minute)) {
			return nil, nil
		}
		if headerValue(msg.Hdrs, nats.MsgIdHdr) != rec.ID {
			continue
		}
		r, err := job.DecodeRequest(msg.Data, job.Limits{MaxRequestBytes: math.MaxInt})
		if err != nil {
			return nil, err
		}
		return viewRequest(r), nil
	}
	return nil, nil
}

// headerValue reads one header from a stored message's header block.
func headerValue(block []byte, key string) string {
	for _, line := range strings.Split(string(block), "\r\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && strings.EqualFold(strings.TrimSpace(k), key) {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// timeline follows one job's events while its page is open.
type timeline struct {
	mu      sync.Mutex
	events  []*job.Event // every event but logs, at most maxEvents
	logs    []*job.Event // the last maxLog log lines
	dropped int          // log lines before those
	version uint64
	seq     uint64 // the stream sequence of the last event read
	err     error
}

func (tl *timeline) addMsg(m jetstream.Msg) {
	if meta, err := m.Metadata(); err == nil {
		tl.mu.Lock()
		tl.seq = meta.Sequence.Stream
		tl.mu.Unlock()
	}
	if e, err := job.DecodeEvent(m.Data()); err == nil {
		tl.add(e)
	}
}

func (tl *timeline) last() uint64 {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return tl.seq
}

func (tl *timeline) fail(err error) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.err = err
	tl.version++
}

const (
	maxEvents = 500
	maxLog    = 300
)

func (tl *timeline) add(e *job.Event) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if e.Type == job.EventLog {
		tl.logs = append(tl.logs, e)
		if len(tl.logs) > maxLog {
			tl.dropped += len(tl.logs) - maxLog
			tl.logs = slices.Delete(tl.logs, 0, len(tl.logs)-maxLog)
		}
	} else if len(tl.events) < maxEvents {
		tl.events = append(tl.events, e)
	}
	tl.version++
}

func (tl *timeline) snapshot() (events, logs []*job.Event, dropped int, version uint64) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return slices.Clone(tl.events), slices.Clone(tl.logs), tl.dropped, tl.version
}

// followEvents reads a job's events after those tl holds, as they come,
// until ctx ends.
func (c *Console) followEvents(ctx context.Context, id string, tl *timeline) {
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{c.names.Events(id)}}
	if seq := tl.last(); seq > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, seq+1
	}
	cons, err := c.cfg.JS.OrderedConsumer(ctx, c.names.EventsStream(), cfg)
	if err != nil {
		tl.fail(err)
		return
	}
	msgs, err := cons.Messages()
	if err != nil {
		tl.fail(err)
		return
	}
	defer msgs.Stop()
	stop := context.AfterFunc(ctx, msgs.Stop)
	defer stop()
	for {
		m, err := msgs.Next()
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				tl.fail(err)
			}
			return
		}
		tl.addMsg(m)
	}
}

// readEvents reads what a job's events are now, at most for a few
// seconds.
func (c *Console) readEvents(ctx context.Context, id string) *timeline {
	tl := &timeline{}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cons, err := c.cfg.JS.OrderedConsumer(ctx, c.names.EventsStream(), jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{c.names.Events(id)}})
	if err != nil {
		tl.err = err
		return tl
	}
	for {
		batch, err := cons.FetchNoWait(256)
		if err != nil {
			tl.err = err
			return tl
		}
		got := 0
		for m := range batch.Messages() {
			got++
			tl.addMsg(m)
		}
		if got == 0 {
			return tl
		}
	}
}

// jobDetail is what a job's page shows.
type jobDetail struct {
	Record   *job.Record
	Result   *job.Result
	Request  *RequestView
	FromDLQ  bool // the request shown is the dead letter's
	Events   []*job.Event
	Logs     []*job.Event
	Dropped  int
	Attempts []job.Attempt
	Retries  []string // jobs that retried this one (ID-retry-N)
	Err      string
}

// detail reads what a job's page shows: its record (with its history),
// its result, its request where it is still kept, and the events in tl.
func (c *Console) detail(ctx context.Context, id string, tl *timeline, withRequest bool) (*jobDetail, error) {
	s, _, err := c.store.Status(ctx, id)
	if err != nil {
		return nil, err
	}
	d := &jobDetail{Record: s.Job, Result: s.Result}
	d.Events, d.Logs, d.Dropped, _ = tl.snapshot()
	if tl.err != nil {
		d.Err = "events: " + tl.err.Error()
	}
	d.Attempts = slices.Clone(s.Job.History)
	if last := lastAttempt(s.Job, s.Result); last != nil {
		d.Attempts = append(d.Attempts, *last)
	}
	if withRequest {
		if dl := c.dead.find(id); dl != nil {
			d.Request, d.FromDLQ = dl.Request, true
		} else if !s.Job.State.Final() && s.Job.State != job.StateRejected {
			if d.Request, err = c.findRequest(ctx, s.Job); err != nil {
				c.log.Debug("reading a job's request", "job_id", id, "err", err)
			}
		}
	}
	for k := 1; k <= 100; k++ {
		rid := job.RetryID(id, k)
		if !c.index.Has(rid) {
			break
		}
		d.Retries = append(d.Retries, rid)
	}
	return d, nil
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
