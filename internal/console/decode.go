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

// decodeRecord reads the fields of a job record version the index needs.
// It runs in every dispatcher for every record version, so it scans the
// document once, without reflection, and reads only its prefix: the
// fleet writes records with encoding/json, in job.Record's field order,
// and every field the index needs comes before the history, the request
// (the first version carries the whole request), its secrets and the
// result (the final version carries the result), where the scan stops. A
// document it cannot follow goes to encoding/json, which judges it.
func decodeRecord(data []byte, r *recordView, in *interner) error {
	return decodeWith(data, r, in, false)
}

// decodeWith is decodeRecord, reading the whole document when full is set.
func decodeWith(data []byte, r *recordView, in *interner, full bool) error {
	s := scanner{b: data, in: in, full: full}
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

var (
	errScan = errors.New("unexpected JSON")
	// errEnough ends a scan at a key after which the index needs nothing.
	errEnough = errors.New("the rest is not needed")
)

type scanner struct {
	b  []byte
	i  int
	in *interner // nil: no interning
	// full scans to the end: for documents not in job.Record's field
	// order (see decodeRecord).
	full bool
}

// interner gives the strings many records share (tenants, pools, states,
// workers, failure classes and codes, labels) one copy, without
// allocating for a known one.
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
// escapes, or not ASCII, is an error here (keys never have them).
func (s *scanner) rawString() ([]byte, error) {
	if err := s.expect('"'); err != nil {
		return nil, err
	}
	n := bytes.IndexByte(s.b[s.i:], '"')
	if n < 0 {
		return nil, errScan
	}
	b := s.b[s.i : s.i+n]
	for _, c := range b {
		if c < 0x20 || c >= 0x80 || c == '\\' {
			return nil, errScan
		}
	}
	s.i += n + 1
	return b, nil
}

// quoted passes over a string value, the scanner at its opening quote,
// and returns its bytes as written and whether they need unescaping (an
// escape, or not ASCII: encoding/json replaces invalid UTF-8).
func (s *scanner) quoted() (raw []byte, plain bool, err error) {
	start := s.i
	s.i++
	plain = true
	for {
		n := bytes.IndexByte(s.b[s.i:], '"')
		if n < 0 {
			return nil, false, errScan
		}
		seg := s.b[s.i : s.i+n]
		s.i += n + 1
		escaped := false
		for _, c := range seg {
			switch {
			case c < 0x20:
				return nil, false, errScan
			case c >= 0x80:
				plain = false
			case c == '\\':
				plain, escaped = false, true
			}
		}
		if !escaped || !oddBackslashes(seg) {
			return s.b[start:s.i], plain, nil
		}
		// The quote was escaped: the string goes on.
	}
}

// oddBackslashes reports whether seg ends with an odd number of
// backslashes, which escape the quote after it.
func oddBackslashes(seg []byte) bool {
	n := 0
	for i := len(seg) - 1; i >= 0 && seg[i] == '\\'; i-- {
		n++
	}
	return n%2 == 1
}

// str reads a string value (or null, as "").
func (s *scanner) str() (string, error) {
	if s.null() {
		return "", nil
	}
	if s.peek() != '"' {
		return "", errScan
	}
	raw, plain, err := s.quoted()
	if err != nil {
		return "", err
	}
	if plain {
		return string(raw[1 : len(raw)-1]), nil
	}
	var v string
	if err := json.Unmarshal(raw, &v); err != nil {
		return "", err
	}
	return v, nil
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
	// Atoi does not allocate for a []byte converted in its call.
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

// time reads a time as Unix nanoseconds, 0 for null.
func (s *scanner) time() (int64, error) {
	if s.null() {
		return 0, nil
	}
	b, err := s.rawString()
	if err != nil {
		return 0, err
	}
	if n, ok := parseStamp(b); ok {
		return n, nil
	}
	// time.Parse takes a string; the conversion does not allocate when its
	// result does not escape.
	t, err := time.Parse(time.RFC3339Nano, string(b))
	if err != nil {
		return 0, errScan
	}
	return nanos(t), nil
}

// parseStamp reads the times encoding/json writes, RFC 3339 with up to
// nine digits of fraction, in UTC (Z) or at an offset, as Unix nanoseconds,
// some 10 times faster than time.Parse. It refuses anything else, which
// time.Parse then judges.
func parseStamp(b []byte) (int64, bool) {
	if len(b) < 20 || b[4] != '-' || b[7] != '-' || b[10] != 'T' || b[13] != ':' || b[16] != ':' {
		return 0, false
	}
	num := func(from, to int) (int, bool) {
		n := 0
		for _, c := range b[from:to] {
			if c < '0' || c > '9' {
				return 0, false
			}
			n = n*10 + int(c-'0')
		}
		return n, true
	}
	year, ok1 := num(0, 4)
	month, ok2 := num(5, 7)
	day, ok3 := num(8, 10)
	hour, ok4 := num(11, 13)
	minute, ok5 := num(14, 16)
	sec, ok6 := num(17, 19)
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6) || month < 1 || month > 12 || day < 1 || hour > 23 || minute > 59 || sec > 59 {
		return 0, false
	}
	if year < 1678 || year > 2261 { // beyond Unix nanoseconds in an int64
		return 0, false
	}
	if day > daysIn(month, year) {
		return 0, false
	}
	i, frac := 19, 0
	if i < len(b) && b[i] == '.' {
		i++
		digits := 0
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			if digits == 9 {
				return 0, false
			}
			frac = frac*10 + int(b[i]-'0')
			digits++
			i++
		}
		if digits == 0 {
			return 0, false
		}
		for ; digits < 9; digits++ {
			frac *= 10
		}
	}
	offset := 0
	switch {
	case i == len(b)-1 && b[i] == 'Z':
	case i == len(b)-6 && (b[i] == '+' || b[i] == '-') && b[i+3] == ':':
		oh, ok1 := num(i+1, i+3)
		om, ok2 := num(i+4, i+6)
		if !ok1 || !ok2 || oh > 23 || om > 59 {
			return 0, false
		}
		offset = (oh*60 + om) * 60
		if b[i] == '-' {
			offset = -offset
		}
	default:
		return 0, false
	}
	secs := daysFromCivil(year, month, day)*86400 + int64(hour*3600+minute*60+sec) - int64(offset)
	return secs*int64(time.Second) + int64(frac), true
}

func daysIn(month, year int) int {
	switch month {
	case 2:
		if year%4 == 0 && (year%100 != 0 || year%400 == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}

// daysFromCivil is the number of days from 1970-01-01 to a date of the
// proleptic Gregorian calendar (H. Hinnant's algorithm).
func daysFromCivil(y, m, d int) int64 {
	if m <= 2 {
		y--
	}
	era := y / 400
	yoe := y - era*400
	mp := (m + 9) % 12
	doy := (153*mp+2)/5 + d - 1
	doe := yoe*365 + yoe/4 - yoe/100 + doy
	return int64(era)*146097 + int64(doe) - 719468
}

// skip passes over any value.
func (s *scanner) skip() error {
	switch s.peek() {
	case '"':
		raw, plain, err := s.quoted()
		if err == nil && !plain && !json.Valid(raw) {
			return errScan
		}
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
		case "id":
			r.ID, err = s.str()
		case "tenant":
			r.Tenant, err = s.name()
		case "pool":
			r.Pool, err = s.name()
		case "priority":
			r.Priority, err = s.int()
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
			r.HasExit = false
			if !s.null() {
				r.ExitCode, err = s.int()
				r.HasExit = true
			}
		case "cancel_requested":
			s.ws()
			r.CancelRequested, err = s.bool()
		case "failure":
			// As encoding/json does: null clears it, an object fills it in.
			if s.null() {
				r.Failure = nil
				return nil
			}
			f := r.Failure
			if f == nil {
				f = &job.Failure{}
			}
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
				r.Labels = nil
				return nil
			}
			err = s.object(func(k []byte) error {
				v, err := s.name()
				r.Labels = setLabel(r.Labels, s.in.get(k), v)
				return err
			})
		case "history", "request", "secrets", "result", "dead_lettered":
			if !s.full {
				return errEnough
			}
			err = s.skip()
		default:
			if folds(key) {
				return errScan // encoding/json matches keys in any case
			}
			err = s.skip()
		}
		return err
	})
	if errors.Is(err, errEnough) {
		return nil
	}
	if err != nil {
		return err
	}
	if s.peek() != 0 {
		return errScan
	}
	return nil
}

var recordKeys = [][]byte{[]byte("id"), []byte("tenant"), []byte("pool"), []byte("priority"), []byte("state"),
	[]byte("attempt"), []byte("max_attempts"), []byte("worker_id"), []byte("submitted_at"), []byte("updated_at"),
	[]byte("started_at"), []byte("finished_at"), []byte("next_attempt_at"), []byte("exit_code"),
	[]byte("cancel_requested"), []byte("failure"), []byte("labels"), []byte("class"), []byte("code"), []byte("message")}

// lastKeys are the keys of job.Record after every key the index reads:
// the scan stops at the first of them.
var lastKeys = []string{"history", "request", "secrets", "result", "dead_lettered"}

// folds reports whether an unknown key is a known one in another case.
func folds(key []byte) bool {
	for _, k := range recordKeys {
		if len(k) == len(key) && bytes.EqualFold(k, key) {
			return true
		}
	}
	for _, k := range lastKeys {
		if len(k) == len(key) && bytes.EqualFold([]byte(k), key) {
			return true
		}
	}
	return false
}
