package artifact

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleet-dev/fleet/internal/lifecycle"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// The log of an attempt is one object, logs/<tenant>/<job_id>/<attempt>
// in its pool's bucket, of text lines in the order the worker heard them:
//
//	2026-11-30T10:00:00.123456Z stdout the line as the job printed it
//
// the time (UTC, microseconds), the stream (stdout, stderr, or fleet for
// the fleet's own notes, such as where a log was truncated), and the line
// without its newline. Lines are as the executor passes them on: valid
// UTF-8, cut at 4 KiB.
//
// Its chunks are stored while the attempt runs, every LogFlush or every
// chunk's worth of lines, so that a reader can follow them; the object
// (its description) appears once the attempt has ended. Their subjects
// are derived from the key, as every object's are, so that a follower
// finds them before the object exists, a lost attempt's lines can still
// be read, and a tenant reads them without the description.

// Streams of a log line.
const (
	StreamStdout = "stdout"
	StreamStderr = "stderr"
	StreamFleet  = "fleet"
)

// timeLayout is the time of a log line: fixed width, UTC.
const timeLayout = "2006-01-02T15:04:05.000000Z"

// LogFlush is how often the lines of a running attempt are stored, at
// most, when they come slower than a chunk at a time.
const LogFlush = 500 * time.Millisecond

// AppendLogLine appends one line of the log format to b.
func AppendLogLine(b []byte, t time.Time, stream, text string) []byte {
	b = t.UTC().AppendFormat(b, timeLayout)
	b = append(b, ' ')
	b = append(b, stream...)
	b = append(b, ' ')
	b = append(b, text...)
	return append(b, '\n')
}

// LogLine is one line of an attempt's log.
type LogLine struct {
	Time   time.Time `json:"time"`
	Stream string    `json:"stream"`
	Line   string    `json:"line"`
}

// ParseLogLine parses one line of the log format, without its newline.
func ParseLogLine(s string) (LogLine, error) {
	ts, rest, ok1 := cutSpace(s)
	stream, text, ok2 := cutSpace(rest)
	if !ok1 || !ok2 {
		return LogLine{}, fmt.Errorf("log line %q: expected TIME STREAM TEXT", truncate(s))
	}
	t, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil {
		return LogLine{}, fmt.Errorf("log line %q: %w", truncate(s), err)
	}
	return LogLine{Time: t, Stream: stream, Line: text}, nil
}

func cutSpace(s string) (before, after string, ok bool) {
	i := bytes.IndexByte([]byte(s), ' ')
	if i < 0 {
		return "", "", false
	}
	return s[:i], s[i+1:], true
}

func truncate(s string) string {
	if len(s) > 60 {
		return s[:60] + "…"
	}
	return s
}

// LogSummary is what a LogWriter kept.
type LogSummary struct {
	Key          string
	Bytes        int64
	Lines        int64
	DroppedLines int64
	Truncated    bool
	Limit        int64
}

// Info is the summary as a result's log description.
func (s *LogSummary) Info() *job.LogInfo {
	return &job.LogInfo{Truncated: s.Truncated, Bytes: s.Bytes, Lines: s.Lines, DroppedLines: s.DroppedLines, Limit: s.Limit}
}

// LogWriter archives an attempt's lines. Line never fails: what cannot be
// stored is reported by Close. It holds at most a few chunks: lines are
// stored in the background, in order, and Line waits when the store falls
// behind.
type LogWriter struct {
	s          *Store
	ctx        context.Context
	bucket     string
	key        string
	id         string // names its chunks
	run        string // names this writer's messages, for de-duplication
	limit      int64
	marker     int // bytes kept for the truncation note
	purgeFirst bool

	mu        sync.Mutex
	buf       []byte
	kept      int64 // bytes accepted, stored or not yet
	lines     int64
	dropped   int64
	truncated bool
	closed    bool
	started   bool
	chunks    chan []byte
	stopTick  context.CancelFunc
	done      chan struct{}

	// Set by the publisher, read after done is closed.
	stored int
	size   int64
	h      hash.Hash
	err    error
}

// LogOptions configure a LogWriter.
type LogOptions struct {
	// MaxBytes bounds the log; lines past it are counted, not kept.
	MaxBytes int64
	// PurgeFirst removes chunks an earlier run of the same attempt left
	// (one handed back by a draining worker) before storing any.
	PurgeFirst bool
}

// NewLog starts the log of attempt n of job k. Nothing is stored until
// its first line. ctx bounds the stores: the worker's own, not the
// attempt's, so that a cancelled attempt's lines are kept.
func (s *Store) NewLog(ctx context.Context, k queue.JobKey, attempt int, o LogOptions) *LogWriter {
	bucket, key := s.ArtifactsOf(k.Pool), LogKey(k.Tenant, k.ID, attempt)
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultMaxLogBytes
	}
	w := &LogWriter{s: s, ctx: ctx, bucket: bucket, key: key, id: chunkID(k.Tenant, bucket, key), run: newNUID(),
		limit: o.MaxBytes, purgeFirst: o.PurgeFirst, h: sha256.New()}
	w.marker = len(AppendLogLine(nil, time.Now(), StreamFleet, w.note()))
	return w
}

func (w *LogWriter) note() string {
	return fmt.Sprintf("the log is truncated here: it reached the worker's limit of %d bytes (--max-log-bytes); later lines are not kept", w.limit)
}

// Line archives one line.
func (w *LogWriter) Line(t time.Time, stream, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.closed:
		return
	case w.truncated:
		w.dropped++
		return
	}
	if !w.started {
		w.start()
	}
	n := int64(len(timeLayout) + len(stream) + len(text) + 3)
	if w.kept+n > w.limit-int64(w.marker) {
		w.truncated = true
		w.dropped++
		w.append(time.Now(), StreamFleet, w.note())
		return
	}
	w.append(t, stream, text)
	w.lines++
}

func (w *LogWriter) append(t time.Time, stream, text string) {
	before := len(w.buf)
	w.buf = AppendLogLine(w.buf, t, stream, text)
	w.kept += int64(len(w.buf) - before)
	if len(w.buf) >= w.s.cfg.ChunkSize {
		w.flush()
	}
}

// flush hands the lines gathered so far to the publisher; mu is held.
func (w *LogWriter) flush() {
	if len(w.buf) == 0 {
		return
	}
	w.chunks <- w.buf
	w.buf = make([]byte, 0, w.s.cfg.ChunkSize+4<<10)
}

// start starts the publisher and the ticker that stores lines that come
// slowly; mu is held.
func (w *LogWriter) start() {
	w.started = true
	w.buf = make([]byte, 0, w.s.cfg.ChunkSize+4<<10)
	w.chunks = make(chan []byte, 4)
	w.done = make(chan struct{})
	var tick context.Context
	tick, w.stopTick = context.WithCancel(context.Background())
	go w.publish()
	go lifecycle.Tick(tick, LogFlush, func(context.Context) {
		w.mu.Lock()
		if !w.closed {
			w.flush()
		}
		w.mu.Unlock()
	})
}

// publish stores the chunks one at a time, in order: a chunk is sent
// again while its answer is ambiguous (its id makes a second copy a
// duplicate), never after the next one.
func (w *LogWriter) publish() {
	defer close(w.done)
	if w.purgeFirst {
		if err := w.s.purge(w.ctx, w.bucket, chunkFilter(w.bucket, w.id)); err != nil {
			w.err = err
		}
	}
	for chunk := range w.chunks {
		if w.err != nil {
			continue // drain, so that Line never blocks for good
		}
		m := nats.NewMsg(chunkSubject(w.bucket, w.id, w.stored))
		m.Data = chunk
		m.Header.Set(queue.HeaderMsgID, w.run+"."+strconv.Itoa(w.stored))
		if _, err := queue.Publish(w.ctx, w.s.js, m); err != nil {
			w.err = fmt.Errorf("store log chunk %d: %w", w.stored, err)
			continue
		}
		w.stored++
		w.size += int64(len(chunk))
		w.h.Write(chunk)
	}
}

// Close stores what is left and the log's description, which makes it
// readable as an object, and says what was kept. A log without lines
// stores nothing.
func (w *LogWriter) Close(ctx context.Context) (*LogSummary, error) {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil, errors.New("log closed twice")
	}
	w.closed = true
	started := w.started
	if started {
		w.flush()
		close(w.chunks)
		w.stopTick()
	}
	sum := &LogSummary{Key: w.key, Lines: w.lines, DroppedLines: w.dropped, Truncated: w.truncated, Limit: w.limit}
	w.mu.Unlock()
	if !started {
		return sum, nil
	}
	select {
	case <-w.done:
	case <-ctx.Done():
		return sum, fmt.Errorf("log %s: %w", w.key, ctx.Err())
	}
	sum.Bytes = w.size
	if w.stored == 0 {
		return sum, w.err
	}
	info := &Info{Bucket: w.bucket, Key: w.key, Size: w.size, SHA256: hex.EncodeToString(w.h.Sum(nil)),
		ContentType: "text/plain; charset=utf-8", chunks: w.stored, id: w.id}
	if err := w.s.publishMeta(ctx, info, w.run); err != nil {
		return sum, errors.Join(w.err, fmt.Errorf("log %s: %w", w.key, err))
	}
	return sum, w.err
}

// Abort drops the log: what was stored of it is purged. For an attempt
// handed back, which runs again under the same number.
func (w *LogWriter) Abort(ctx context.Context) error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	started := w.started
	if started {
		w.buf = nil
		close(w.chunks)
		w.stopTick()
	}
	w.mu.Unlock()
	if !started {
		return nil
	}
	select {
	case <-w.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	return w.s.purge(ctx, w.bucket, chunkFilter(w.bucket, w.id))
}

// ReadLogOptions configure OpenLog.
type ReadLogOptions struct {
	// Follow keeps reading while the attempt runs, until its log is
	// complete or Ended says the attempt is over.
	Follow bool
	// Ended reports whether the attempt is over, when a follower has heard
	// nothing for Poll and the log is not complete: its worker was lost, or
	// it never printed. Required with Follow.
	Ended func(ctx context.Context) (bool, error)
	// Poll is how long a follower waits for more before it looks whether
	// the log is complete. Defaults to LogFlush.
	Poll time.Duration
}

// LogReader reads an attempt's log in the log format.
type LogReader struct {
	io.Reader
	close func() error
	info  *Info
}

// Close stops reading.
func (r *LogReader) Close() error { return r.close() }

// Info describes the log when it was complete when opened (the attempt had
// ended); nil while it is being written, or when its attempt was lost.
func (r *LogReader) Info() *Info { return r.info }

// OpenLog opens the log of attempt n of job k: the whole object once the
// attempt has ended, checked against its digest; otherwise what is stored
// of it so far, and with Follow, what comes next. An attempt that printed
// nothing has an empty log. A store without descriptions (see Config)
// reads the chunks alone, until the attempt has ended.
func (s *Store) OpenLog(ctx context.Context, k queue.JobKey, attempt int, o ReadLogOptions) (*LogReader, error) {
	bucket, key := s.ArtifactsOf(k.Pool), LogKey(k.Tenant, k.ID, attempt)
	if o.Poll <= 0 {
		o.Poll = LogFlush
	}
	if o.Follow && o.Ended == nil {
		return nil, errors.New("following a log needs a way to tell its attempt has ended")
	}
	if !s.cfg.NoDescriptions {
		info, err := s.Stat(ctx, bucket, key)
		switch {
		case err == nil:
			r := s.open(ctx, info)
			return &LogReader{Reader: r, close: r.Close, info: info}, nil
		case !errors.Is(err, ErrNotFound):
			return nil, err
		}
	}
	id := chunkID(k.Tenant, bucket, key)
	f := &follower{s: s, ctx: ctx, f: s.fetch(ctx, bucket, id, -1, s.cfg.Window), bucket: bucket, key: key, o: o,
		h: sha256.New()}
	return &LogReader{Reader: f, close: func() error { f.f.stop(); return nil }}, nil
}

// follower reads a log's chunks as they are stored.
type follower struct {
	s      *Store
	ctx    context.Context
	f      *fetcher
	bucket string
	key    string
	o      ReadLogOptions
	h      hash.Hash
	got    int
	ended  bool // the attempt is over: what is stored is all there is
	cur    []byte
	err    error
}

func (f *follower) Read(p []byte) (int, error) {
	for len(f.cur) == 0 {
		if f.err != nil {
			return 0, f.err
		}
		f.err = f.next()
	}
	n := copy(p, f.cur)
	f.cur = f.cur[n:]
	return n, nil
}

// next reads the next chunk into cur, or returns why there is none.
func (f *follower) next() error {
	for {
		c, err := f.f.next()
		switch {
		case f.ctx.Err() != nil:
			return f.ctx.Err()
		case err != nil:
			return fmt.Errorf("log %s: %w", f.key, err)
		case c != nil:
			f.got++
			f.h.Write(c)
			f.cur = c
			return nil
		case !f.o.Follow || f.ended:
			return io.EOF
		}
		// Nothing more yet: is the log complete, or its attempt over?
		select {
		case <-f.ctx.Done():
			return f.ctx.Err()
		case <-time.After(f.o.Poll):
		}
		if !f.s.cfg.NoDescriptions {
			info, err := f.s.Stat(f.ctx, f.bucket, f.key)
			switch {
			case err == nil && f.got >= info.chunks:
				if f.got == info.chunks && hex.EncodeToString(f.h.Sum(nil)) != info.SHA256 {
					return fmt.Errorf("log %s: %w", f.key, ErrChanged)
				}
				return io.EOF
			case err == nil:
				continue // the rest is on its way
			case !errors.Is(err, ErrNotFound):
				return err
			}
		}
		// The attempt's worker closes the log before the attempt ends:
		// once it has ended, what is stored is all there is (and all
		// there will be, when its worker was lost).
		ended, err := f.o.Ended(f.ctx)
		if err != nil {
			return err
		}
		f.ended = ended
	}
}
