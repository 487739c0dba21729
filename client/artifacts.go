package client

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"mime"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/fleet-dev/fleet/internal/artifact"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// Files of any size travel through the fleet's object store (the NATS
// JetStream Object Store), never through requests and results: a producer
// uploads an input and names it in a request's input_refs; a job's large
// or binary outputs, and the whole log of each of its attempts, are read
// back from the store. Everything streams: nothing here holds a file in
// memory.

func (c *Client) artifacts() *artifact.Store {
	c.once.Do(func() { c.arts = artifact.New(c.js, artifact.Config{Names: c.names}) })
	return c.arts
}

// Upload stores what r yields in the fleet's uploads bucket under key,
// replacing any object of that name, and returns the reference to put in
// a request's input_refs: the worker checks the object against its digest
// and size before the job sees it.
func (c *Client) Upload(ctx context.Context, key string, r io.Reader) (*job.InputRef, error) {
	s := c.artifacts()
	info, err := s.Put(ctx, s.Uploads(), key, r, artifact.PutOptions{ContentType: mime.TypeByExtension(path.Ext(key))})
	if err != nil {
		return nil, fmt.Errorf("upload: %w", err)
	}
	ref := info.InputRef()
	return &ref, nil
}

// UploadFile uploads the file at name. An empty key stores it as
// <new id>/<the file's base name>.
func (c *Client) UploadFile(ctx context.Context, name, key string) (*job.InputRef, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("upload: %w", err)
	}
	defer f.Close()
	if key == "" {
		key = job.NewID() + "/" + filepath.Base(name)
	}
	return c.Upload(ctx, key, f)
}

// Object is a job's output being read. Read it to its end: a stored
// object whose bytes differ from the result's digest fails the last Read
// instead of ending it.
type Object struct {
	io.Reader
	// Name is the output's name.
	Name string
	// Size, SHA256 (hex) and ContentType describe the bytes.
	Size        int64
	SHA256      string
	ContentType string
	// Inline is true for an output carried in the result as text.
	Inline bool
	close  func() error
}

// Close stops reading.
func (o *Object) Close() error { return o.close() }

// Output opens a declared output of a finished job: text carried in its
// result, or an object stored in the artifacts bucket, checked against the
// digest and size the result names. ErrNotFound: no such job, or the job
// has no such output.
func (c *Client) Output(ctx context.Context, id, name string) (*Object, error) {
	res, err := c.finished(ctx, id)
	if err != nil {
		return nil, err
	}
	return OpenOutput(ctx, c.artifacts(), res, name)
}

// finished returns a job's result; an error when it has none yet.
func (c *Client) finished(ctx context.Context, id string) (*job.Result, error) {
	if !job.ValidID(id) {
		return nil, fmt.Errorf("%w: %q is not a job id", ErrNotFound, id)
	}
	res, err := queue.LastResult(ctx, c.js, c.names, id)
	if err != nil {
		return nil, fmt.Errorf("result of %s: %w", id, err)
	}
	if res != nil {
		return res, nil
	}
	st, err := c.Status(ctx, id)
	if err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("job %s has not finished (it is %s): its outputs come with its result", id, st.Job.State)
}

// OpenOutput opens output name of res from the fleet's object store s: for
// the dispatcher's HTTP API and for Client.Output.
func OpenOutput(ctx context.Context, s *artifact.Store, res *job.Result, name string) (*Object, error) {
	if text, ok := res.Outputs[name]; ok {
		sum := sha256.Sum256([]byte(text))
		return &Object{Reader: strings.NewReader(text), Name: name, Size: int64(len(text)), SHA256: hex.EncodeToString(sum[:]),
			ContentType: "text/plain; charset=utf-8", Inline: true, close: func() error { return nil }}, nil
	}
	a, ok := res.Artifacts[name]
	if !ok {
		var names []string
		for n := range res.Outputs {
			names = append(names, n)
		}
		for n := range res.Artifacts {
			names = append(names, n)
		}
		sort.Strings(names)
		return nil, fmt.Errorf("%w: job %s has no output %q (it has %s)", ErrNotFound, res.JobID, name, listOrNone(names))
	}
	size := a.Size
	r, err := s.Open(ctx, a.Bucket, a.Key, artifact.Expect{SHA256: a.SHA256, Size: &size})
	if errors.Is(err, artifact.ErrNotFound) {
		return nil, fmt.Errorf("%w: output %s of job %s: its object is gone (expired with the retention?): %w", ErrNotFound, name, res.JobID, err)
	}
	if err != nil {
		return nil, fmt.Errorf("output %s of job %s: %w", name, res.JobID, err)
	}
	return &Object{Reader: r, Name: name, Size: a.Size, SHA256: a.SHA256, ContentType: a.ContentType, close: r.Close}, nil
}

func listOrNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// LogOptions choose what Logs reads.
type LogOptions struct {
	// Attempt is the attempt whose log to read, from 1. Zero means the
	// job's latest attempt, and with Follow, the ones after it too, until
	// the job ends.
	Attempt int
	// Follow keeps reading while the attempt runs, as its lines are
	// stored (about every half second), until it ends.
	Follow bool
}

// LogLine is one line of an attempt's log: when the worker heard it, on
// which stream ("stdout", "stderr", or "fleet" for the fleet's own notes,
// such as where a log was truncated), and the line as the job printed it.
type LogLine struct {
	Time   time.Time `json:"time"`
	Stream string    `json:"stream"`
	Line   string    `json:"line"`
}

// ParseLogLine parses one line of what Logs yields, without its newline:
// "<time RFC 3339, UTC> <stream> <line>".
func ParseLogLine(s string) (LogLine, error) {
	l, err := artifact.ParseLogLine(s)
	return LogLine(l), err
}

// Logs opens the archived log of a job's attempt: every line of its
// stdout and stderr in the order the worker heard them, one per line in
// the form ParseLogLine reads. A job that has not started has an empty
// log, unless Follow waits for it to start.
func (c *Client) Logs(ctx context.Context, id string, o LogOptions) (io.ReadCloser, error) {
	if !job.ValidID(id) {
		return nil, fmt.Errorf("%w: %q is not a job id", ErrNotFound, id)
	}
	if o.Attempt < 0 {
		return nil, fmt.Errorf("attempt %d: attempts count from 1", o.Attempt)
	}
	store, err := c.bucket(ctx)
	if err != nil {
		return nil, err
	}
	rec, _, err := store.Get(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("logs of %s: %w", id, err)
	}
	if o.Attempt > rec.Attempt && !o.Follow {
		return nil, fmt.Errorf("%w: job %s has had %d attempts, not %d", ErrNotFound, id, rec.Attempt, o.Attempt)
	}
	return OpenLogs(ctx, c.artifacts(), store, id, o), nil
}

// OpenLogs reads the logs of job id as Client.Logs does, with the job
// store st to follow its attempts: for the dispatcher's HTTP API.
func OpenLogs(ctx context.Context, s *artifact.Store, st *queue.Store, id string, o LogOptions) io.ReadCloser {
	return &logStream{ctx: ctx, s: s, st: st, id: id, o: o, attempt: o.Attempt}
}

// logStream reads the log of an attempt, and when following the latest,
// those of the attempts after it.
type logStream struct {
	ctx     context.Context
	s       *artifact.Store
	st      *queue.Store
	id      string
	o       LogOptions
	attempt int // being read; 0 before the first
	cur     *artifact.LogReader
	done    bool
}

// poll is how often a follower looks at the job's record while it waits
// for an attempt to start.
const poll = 500 * time.Millisecond

func (l *logStream) Read(p []byte) (int, error) {
	for !l.done {
		if l.cur == nil {
			if err := l.next(); err != nil {
				return 0, err
			}
			continue
		}
		n, err := l.cur.Read(p)
		if err == io.EOF {
			_ = l.cur.Close()
			l.cur = nil
			if !l.o.Follow || l.o.Attempt != 0 {
				l.done = true
			}
			if n > 0 {
				return n, nil
			}
			continue
		}
		return n, err
	}
	return 0, io.EOF
}

// next opens the log of the next attempt to read, waiting for it to start
// when following; it sets done when there is none.
func (l *logStream) next() error {
	for {
		rec, _, err := l.st.Get(l.ctx, l.id)
		if err != nil {
			return fmt.Errorf("logs of %s: %w", l.id, err)
		}
		want := l.attempt + 1
		switch {
		case l.o.Attempt != 0:
			want = l.o.Attempt
		case l.attempt == 0:
			want = max(rec.Attempt, 1) // the latest
		}
		if rec.Attempt >= want {
			r, err := l.s.OpenLog(l.ctx, l.id, want, artifact.ReadLogOptions{Follow: l.o.Follow, Ended: l.ended(want)})
			if err != nil {
				return err
			}
			l.cur, l.attempt = r, want
			return nil
		}
		if !l.o.Follow || rec.State.Final() {
			l.done = true
			return nil
		}
		select {
		case <-l.ctx.Done():
			return l.ctx.Err()
		case <-time.After(poll):
		}
	}
}

// ended tells a follower of attempt n that it is over: the job has moved
// on to another attempt, or ended.
func (l *logStream) ended(n int) func(context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		rec, _, err := l.st.Get(ctx, l.id)
		if err != nil {
			return false, err
		}
		return rec.Attempt != n || rec.State != job.StateRunning, nil
	}
}

func (l *logStream) Close() error {
	l.done = true
	if l.cur != nil {
		return l.cur.Close()
	}
	return nil
}
