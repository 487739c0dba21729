package console

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/fleet-dev/fleet/job"
)

// decodeRecord reads the fields of a job record the index needs. It runs
// in every dispatcher for every record write, so it scans the document
// once, without reflection, skipping what it does not need (the history);
// a document it cannot follow goes to encoding/json, which judges it.
func decodeRecord(data []byte, r *recordView, in *interner) error {
	s := scanner{b: data, in: in}
	if err := s.record(r); err != nil {
		var rec job.Record
		if err := json.Unmarshal(data, &rec); err != nil {
			*r = recordView{}
			return err
		}
		*r = viewOf(&rec)
	}
	return nil
}

var errScan = errors.New("unexpected JSON")

type scanner struct {
	b  []byte
	i  int
	in *interner // nil: no interning
}

// interner gives the strings many records share (pools, states, workers,
// failure classes and codes) one copy, without allocating for a known
// one.
type interner struct {
	mu sync.Mutex
	m  map[string]string
}

func (in *interner) get(b []byte) string {
	if in == nil {
		return string(b)
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if v, ok := in.m[string(b)]; ok {
		return v
	}
	v := string(b)
	if in.m == nil {
		in.m = map[string]string{}
	}
	if len(in.m) < 50_000 {
		in.m[v] = v
	}
	return v
}

// name reads a string value worth interning.
func (s *scanner) name() (string, error) {
	start := s.i
	if s.peek() == '"' {
		if b, err := s.rawString(); err == nil {
			return s.in.get(b), nil
		}
		s.i = start
	}
	return s.str()
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) peek() byte {
	s.ws()
	if s.i >= len(s.b) {
		return 0
	}
	return s.b[s.i]
}

func (s *scanner) expect(c byte) error {
	if s.peek() != c {
		return errScan
	}
	s.i++
	return nil
}

// object calls field for each key of an object, the scanner at its value.
func (s *scanner) object(field func(key []byte) error) error {
	if err := s.expect('{'); err != nil {
		return err
	}
	if s.peek() == '}' {
		s.i++
		return nil
	}
	for {
		key, err := s.rawString()
		if err != nil {
			return err
		}
		if err := s.expect(':'); err != nil {
			return err
		}
		if err := field(key); err != nil {
			return err
		}
		switch s.peek() {
		case ',':
			s.i++
		case '}':
			s.i++
			return nil
		default:
			return errScan
		}
	}
}

// rawString returns the bytes of a string without escapes; a string with
// escapes is an error here (keys never have them).
func (s *scanner) rawString() ([]byte, error) {
	if err := s.expect('"'); err != nil {
		return nil, err
	}
	start := s.i
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case '"':
			s.i++
			return s.b[start : s.i-1], nil
		case '\\':
			return nil, errScan
		}
		if s.b[s.i] < 0x20 || s.b[s.i] >= 0x80 {
			return nil, errScan
		}
		s.i++
	}
	return nil, errScan
}

// str reads a string value (or null, as "").
func (s *scanner) str() (string, error) {
	if s.null() {
		return "", nil
	}
	if s.peek() != '"' {
		return "", errScan
	}
	start := s.i
	s.i++
	escaped := false // or not ASCII: encoding/json replaces invalid UTF-8
	for s.i < len(s.b) {
		switch c := s.b[s.i]; {
		case c >= 0x80:
			escaped = true
		case c == '"':
			s.i++
			if !escaped {
				return string(s.b[start+1 : s.i-1]), nil
			}
			var v string
			if err := json.Unmarshal(s.b[start:s.i], &v); err != nil {
				return "", err
			}
			return v, nil
		case c == '\\':
			escaped = true
			s.i += 2
			continue
		case c < 0x20:
			return "", errScan
		}
		s.i++
	}
	return "", errScan
}

func (s *scanner) null() bool {
	if s.peek() == 'n' && bytes.HasPrefix(s.b[s.i:], []byte("null")) {
		s.i += 4
		return true
	}
	return false
}

func (s *scanner) int() (int, error) {
	s.ws()
	start := s.i
	for s.i < len(s.b) && (s.b[s.i] == '-' || s.b[s.i] >= '0' && s.b[s.i] <= '9') {
		s.i++
	}
	n, err := strconv.Atoi(string(s.b[start:s.i]))
	if err != nil {
		return 0, errScan
	}
	return n, nil
}

func (s *scanner) bool() (bool, error) {
	switch {
	case bytes.HasPrefix(s.b[s.i:], []byte("true")):
		s.i += 4
		return true, nil
	case bytes.HasPrefix(s.b[s.i:], []byte("false")):
		s.i += 5
		return false, nil
	}
	return false, errScan
}

func (s *scanner) time() (time.Time, error) {
	if s.null() {
		return time.Time{}, nil
	}
	b, err := s.rawString()
	if err != nil {
		return time.Time{}, err
	}
	// time.Parse takes a string; the conversion does not allocate when its
	// result does not escape.
	t, err := time.Parse(time.RFC3339Nano, string(b))
	if err != nil {
		return time.Time{}, errScan
	}
	return t, nil
}

// skip passes over any value.
func (s *scanner) skip() error {
	switch s.peek() {
	case '"':
		_, err := s.str()
		return err
	case '{':
		return s.object(func([]byte) error { return s.skip() })
	case '[':
		s.i++
		if s.peek() == ']' {
			s.i++
			return nil
		}
		for {
			if err := s.skip(); err != nil {
				return err
			}
			switch s.peek() {
			case ',':
				s.i++
			case ']':
				s.i++
				return nil
			default:
				return errScan
			}
		}
	case 't', 'f':
		_, err := s.bool()
		return err
	case 'n':
		if s.null() {
			return nil
		}
		return errScan
	default:
		start := s.i
		for s.i < len(s.b) && bytes.IndexByte([]byte("+-.0123456789eE"), s.b[s.i]) >= 0 {
			s.i++
		}
		if s.i == start {
			return errScan
		}
		return nil
	}
}

func (s *scanner) record(r *recordView) error {
	err := s.object(func(key []byte) error {
		var err error
		switch string(key) {
		case "pool":
			r.Pool, err = s.name()
		case "state":
			var v string
			v, err = s.name()
			r.State = job.State(v)
		case "attempt":
			r.Attempt, err = s.int()
		case "max_attempts":
			r.MaxAttempts, err = s.int()
		case "worker_id":
			r.WorkerID, err = s.name()
		case "backend":
			r.Backend, err = s.name()
		case "submitted_at":
			r.SubmittedAt, err = s.time()
		case "updated_at":
			r.UpdatedAt, err = s.time()
		case "started_at":
			r.StartedAt, err = s.time()
		case "finished_at":
			r.FinishedAt, err = s.time()
		case "next_attempt_at":
			r.NextAttemptAt, err = s.time()
		case "exit_code":
			if !s.null() {
				var n int
				n, err = s.int()
				r.ExitCode = &n
			}
		case "cancel_requested":
			s.ws()
			r.CancelRequested, err = s.bool()
		case "trace_id":
			r.TraceID, err = s.str()
		case "failure":
			if s.null() {
				return nil
			}
			f := &job.Failure{}
			err = s.object(func(k []byte) error {
				var err error
				switch string(k) {
				case "class":
					var v string
					v, err = s.name()
					f.Class = job.FailureClass(v)
				case "code":
					var v string
					v, err = s.name()
					f.Code = job.FailureCode(v)
				case "message":
					f.Message, err = s.str()
				default:
					if folds(k) {
						return errScan
					}
					err = s.skip()
				}
				return err
			})
			r.Failure = f
		case "labels":
			if s.null() {
				return nil
			}
			r.Labels = map[string]string{}
			err = s.object(func(k []byte) error {
				v, err := s.str()
				r.Labels[string(k)] = v
				return err
			})
		default:
			if folds(key) {
				return errScan // encoding/json matches keys in any case
			}
			err = s.skip()
		}
		return err
	})
	if err != nil {
		return err
	}
	if s.peek() != 0 {
		return errScan
	}
	return nil
}

var recordKeys = [][]byte{[]byte("pool"), []byte("state"), []byte("attempt"), []byte("max_attempts"),
	[]byte("worker_id"), []byte("backend"), []byte("submitted_at"), []byte("updated_at"), []byte("started_at"),
	[]byte("finished_at"), []byte("next_attempt_at"), []byte("exit_code"), []byte("cancel_requested"),
	[]byte("trace_id"), []byte("failure"), []byte("labels"), []byte("class"), []byte("code"), []byte("message")}

// folds reports whether an unknown key is a known one in another case.
func folds(key []byte) bool {
	for _, k := range recordKeys {
		if len(k) == len(key) && bytes.EqualFold(k, key) {
			return true
		}
	}
	return false
}
