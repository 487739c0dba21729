package artifact

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// What producers read of a job: its outputs, by their name in its result,
// and its attempts' logs. The Go client and the dispatcher's HTTP API both
// read through these.

// Output is a job's output being read: text carried in its result, or a
// stored object, checked against the digest the result names.
type Output struct {
	io.Reader
	Size        int64
	SHA256      string
	ContentType string
	// Inline is true for an output carried in the result as text.
	Inline bool
	close  func() error
}

// Close stops reading.
func (o *Output) Close() error { return o.close() }

// OpenOutput opens output name of res. ErrNotFound: res has no such
// output, or its object is gone (expired with the retention).
func OpenOutput(ctx context.Context, s *Store, res *job.Result, name string) (*Output, error) {
	if text, ok := res.Outputs[name]; ok {
		sum := sha256.Sum256([]byte(text))
		return &Output{Reader: strings.NewReader(text), Size: int64(len(text)), SHA256: hex.EncodeToString(sum[:]),
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
		have := "none"
		if len(names) > 0 {
			have = strings.Join(names, ", ")
		}
		return nil, fmt.Errorf("%w: job %s has no output %q (it has %s)", ErrNotFound, res.JobID, name, have)
	}
	var r *Reader
	var err error
	if s.cfg.NoDescriptions {
		r, err = s.OpenRef(ctx, a.Bucket, a.Key, a.Size, a.SHA256)
	} else {
		size := a.Size
		r, err = s.Open(ctx, a.Bucket, a.Key, Expect{SHA256: a.SHA256, Size: &size})
	}
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return nil, fmt.Errorf("output %s of job %s: its object is gone (expired with the retention?): %w", name, res.JobID, err)
		}
		return nil, fmt.Errorf("output %s of job %s: %w", name, res.JobID, err)
	}
	return &Output{Reader: r, Size: a.Size, SHA256: a.SHA256, ContentType: a.ContentType, close: r.Close}, nil
}

// JobLogOptions choose what OpenJobLog reads.
type JobLogOptions struct {
	// Attempt is the attempt whose log to read, from 1. Zero means the
	// job's latest, and with Follow, the ones after it too, until the job
	// ends.
	Attempt int
	// Follow keeps reading while the attempt runs.
	Follow bool
}

// RecordFunc reads a job's record, which says which attempt runs.
type RecordFunc func(ctx context.Context) (*job.Record, error)

// OpenJobLog reads the logs of job id: one attempt's, or with Follow and
// no attempt named, the latest attempt's and those after it until the
// job ends. rec reads the job's record.
func OpenJobLog(ctx context.Context, s *Store, rec RecordFunc, id string, o JobLogOptions) io.ReadCloser {
	return &logStream{ctx: ctx, s: s, rec: rec, id: id, o: o}
}

// logStream reads the log of an attempt, and when following the latest,
// those of the attempts after it.
type logStream struct {
	ctx     context.Context
	s       *Store
	rec     RecordFunc
	id      string
	o       JobLogOptions
	attempt int // being read; 0 before the first
	cur     *LogReader
	done    bool
}

// recordPoll is how often a follower looks at the job's record while it
// waits for an attempt to start.
const recordPoll = 500 * time.Millisecond

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
		rec, err := l.rec(l.ctx)
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
			r, err := l.s.OpenLog(l.ctx, queue.Key(rec), want, ReadLogOptions{Follow: l.o.Follow, Ended: l.ended(want)})
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
		case <-time.After(recordPoll):
		}
	}
}

// ended tells a follower of attempt n that it is over: the job has moved
// on to another attempt, or ended.
func (l *logStream) ended(n int) func(context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		rec, err := l.rec(ctx)
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
