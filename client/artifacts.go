package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"os"
	"path"
	"path/filepath"
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

// The client reads as a tenant's producer may under the fleet's NATS
// roles (deploy/nats): the chunks of its own tenant's objects, never an
// object's description. So an output is read by the reference its result
// carries, and a log by its chunks until its attempt has ended.
func (c *Client) artifacts() *artifact.Store {
	c.once.Do(func() { c.arts = artifact.New(c.js, artifact.Config{Names: c.names, NoDescriptions: true}) })
	return c.arts
}

// Upload stores what r yields in the tenant's uploads bucket
// (<prefix>-uploads-<tenant>, which a dispatcher makes when asked) under
// key, replacing any object of that name, and returns the reference to
// put in a request's input_refs: the worker checks the object against its
// digest and size before the job sees it.
func (c *Client) Upload(ctx context.Context, key string, r io.Reader) (*job.InputRef, error) {
	bucket, err := c.uploadsBucket(ctx)
	if err != nil {
		return nil, fmt.Errorf("upload: %w", err)
	}
	info, err := c.artifacts().Put(ctx, bucket, key, r, artifact.PutOptions{ContentType: mime.TypeByExtension(path.Ext(key))})
	if err != nil {
		return nil, fmt.Errorf("upload: %w", err)
	}
	ref := info.InputRef()
	return &ref, nil
}

// uploadsBucket asks a dispatcher for the tenant's uploads bucket, which
// it makes if need be, sending the request again while no dispatcher is
// there to answer, until ctx ends (10 seconds without a deadline).
func (c *Client) uploadsBucket(ctx context.Context) (string, error) {
	ctx, cancel := withDefaultTimeout(ctx, 10*time.Second)
	defer cancel()
	// The bucket is made once: asking again changes nothing (see ask).
	m, err := c.ask(ctx, c.names.UploadsRequest(c.tenant), nil, sendAgain)
	if err != nil {
		return "", fmt.Errorf("the uploads bucket of tenant %s: %w", c.tenant, err)
	}
	var e job.ErrorReply
	if json.Unmarshal(m.Data, &e) == nil && e.Error != "" {
		return "", fmt.Errorf("the uploads bucket of tenant %s: %s", c.tenant, e.Error)
	}
	var reply queue.UploadsReply
	if err := json.Unmarshal(m.Data, &reply); err != nil || reply.Bucket == "" {
		return "", fmt.Errorf("the uploads bucket of tenant %s: unreadable answer %q", c.tenant, m.Data)
	}
	return reply.Bucket, nil
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

// Errors of the object store.
var (
	// ErrNoObject: the job has no such output, or its object is gone
	// (expired with the retention); an upload's object is missing.
	ErrNoObject = artifact.ErrNotFound
	// ErrObjectChanged: an object's bytes differ from the digest or size
	// its reference names.
	ErrObjectChanged = artifact.ErrChanged
)

// Output opens a declared output of a finished job: text carried in its
// result, or an object stored in its pool's bucket, checked against the
// digest and size the result names. ErrNotFound: no such job; ErrNoObject:
// the job has no such output, or its object is gone.
func (c *Client) Output(ctx context.Context, id, name string) (*Object, error) {
	res, err := c.finished(ctx, id)
	if err != nil {
		return nil, err
	}
	o, err := artifact.OpenOutput(ctx, c.artifacts(), res, name)
	if err != nil {
		return nil, err
	}
	return &Object{Reader: o, Name: name, Size: o.Size, SHA256: o.SHA256, ContentType: o.ContentType, Inline: o.Inline,
		close: o.Close}, nil
}

// finished returns a job's result; an error when it has none yet.
func (c *Client) finished(ctx context.Context, id string) (*job.Result, error) {
	if !job.ValidID(id) {
		return nil, fmt.Errorf("%w: %q is not a job id", ErrNotFound, id)
	}
	st, err := c.Status(ctx, id)
	if err != nil {
		return nil, err
	}
	if st.Result != nil {
		return st.Result, nil
	}
	return nil, fmt.Errorf("job %s has not finished (it is %s): its outputs come with its result", id, st.Job.State)
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
	record := func(ctx context.Context) (*job.Record, error) {
		st, err := c.Status(ctx, id)
		if err != nil {
			return nil, err
		}
		return st.Job, nil
	}
	rec, err := record(ctx)
	if err != nil {
		return nil, fmt.Errorf("logs of %s: %w", id, err)
	}
	if o.Attempt > rec.Attempt && !o.Follow {
		return nil, fmt.Errorf("%w: job %s has had %d attempts, not %d", ErrNotFound, id, rec.Attempt, o.Attempt)
	}
	return artifact.OpenJobLog(ctx, c.artifacts(), record, id, artifact.JobLogOptions{Attempt: o.Attempt, Follow: o.Follow}), nil
}
