package job

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// Duration is a time.Duration that travels in JSON as a Go duration string
// such as "90s" or "1m30s". Numbers are refused: "timeout": 60 is ambiguous.
type Duration time.Duration

// Std returns d as a time.Duration.
func (d Duration) Std() time.Duration { return time.Duration(d) }

// String formats d like time.Duration does.
func (d Duration) String() string { return time.Duration(d).String() }

// MarshalJSON encodes d as a duration string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

// UnmarshalJSON decodes a duration string. Negative durations are refused.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if len(b) >= 2 && b[0] == '"' && b[len(b)-1] == '"' && bytes.IndexByte(b, '\\') < 0 {
		s = string(b[1 : len(b)-1]) // no escapes: no need for a decoder
	} else if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string like \"30s\", got %s", truncate(string(b), 32))
	}
	v, err := ParseDuration(s)
	if err != nil {
		return &durationError{value: s, err: err}
	}
	*d = Duration(v)
	return nil
}

// durationError lets DecodeRequest find which field held a bad duration:
// encoding/json does not say when a field's own UnmarshalJSON fails.
type durationError struct {
	value string
	err   error
}

func (e *durationError) Error() string { return e.err.Error() }
func (e *durationError) Unwrap() error { return e.err }

// ParseDuration parses a Go duration string that is not negative.
func ParseDuration(s string) (time.Duration, error) {
	v, err := time.ParseDuration(s)
	if err != nil || strings.HasPrefix(s, "+") {
		return 0, fmt.Errorf("%q is not a duration (use Go syntax such as \"500ms\", \"30s\", \"1h\")", truncate(s, 32))
	}
	if v < 0 {
		return 0, fmt.Errorf("duration %q must not be negative", s)
	}
	return v, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
