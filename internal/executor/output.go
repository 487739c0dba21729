package executor

import (
	"bytes"
	"sync"
	"unicode/utf8"
)

// Output collects one stream of an attempt's output: it passes each
// complete line to a Reporter and keeps the last TailBytes bytes for the
// result. Executors write process or container output into it.
type Output struct {
	stream string
	report Reporter
	limit  int

	mu      sync.Mutex
	partial []byte
	tail    []byte
}

// TailBytes is how much of each stream a result keeps by default.
const TailBytes = 16 << 10

// maxLine bounds a line passed on to the reporter; longer lines are cut.
const maxLine = 4 << 10

// NewOutput returns an Output for stream ("stdout" or "stderr"). report may
// be nil.
func NewOutput(stream string, report Reporter, tailBytes int) *Output {
	if tailBytes <= 0 {
		tailBytes = TailBytes
	}
	return &Output{stream: stream, report: report, limit: tailBytes}
}

// Write implements io.Writer. It never fails.
func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.tail = append(o.tail, p...)
	if len(o.tail) > 2*o.limit {
		o.tail = append(o.tail[:0], o.tail[len(o.tail)-o.limit:]...)
	}
	if o.report == nil {
		return len(p), nil
	}
	data := p
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			// A line longer than maxLine goes out in pieces.
			o.partial = append(o.partial, data...)
			for len(o.partial) >= maxLine {
				o.emit(o.partial[:maxLine])
				o.partial = append(o.partial[:0], o.partial[maxLine:]...)
			}
			break
		}
		if len(o.partial) > 0 {
			o.partial = append(o.partial, data[:i]...)
			o.emit(o.partial)
			o.partial = o.partial[:0]
		} else {
			o.emit(data[:i])
		}
		data = data[i+1:]
	}
	return len(p), nil
}

func (o *Output) emit(line []byte) {
	line = bytes.TrimSuffix(line, []byte("\r"))
	if len(line) > maxLine {
		line = line[:maxLine]
	}
	o.report.Log(o.stream, string(bytes.ToValidUTF8(line, []byte("\uFFFD"))))
}

// Close passes on a last line without a newline.
func (o *Output) Close() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.report != nil && len(o.partial) > 0 {
		o.emit(o.partial)
		o.partial = nil
	}
	return nil
}

// Tail returns the last bytes written, at most the tail size, starting at a
// character boundary.
func (o *Output) Tail() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	t := o.tail
	if len(t) > o.limit {
		t = t[len(t)-o.limit:]
	}
	for len(t) > 0 && !utf8.RuneStart(t[0]) {
		t = t[1:]
	}
	return string(bytes.ToValidUTF8(t, []byte("\uFFFD")))
}
