package job

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// InputRef names an input that is an object in the fleet's object store,
// uploaded by the producer before it submits (fleetctl upload, or
// client.Upload). The worker streams it into the attempt's inputs before
// the job runs, and checks it against SHA256 (and Size, when given): an
// object that is missing or changed fails the attempt, rejected, and no
// half-written file is ever seen by the job.
type InputRef struct {
	// Bucket is the object store bucket: the fleet's uploads bucket
	// (<prefix>-uploads) when empty, or its artifacts bucket
	// (<prefix>-artifacts), so that an output of one job can be an input
	// of another. No other bucket is accepted.
	Bucket string `json:"bucket,omitempty"`
	// Key is the object's name in the bucket.
	Key string `json:"key"`
	// SHA256 is the object's digest, 64 lower-case hex digits.
	SHA256 string `json:"sha256"`
	// Size is the object's size in bytes; checked when given.
	Size *int64 `json:"size,omitempty"`
}

// Artifact is an output stored as an object in the fleet's artifacts
// bucket, because it did not fit in the result as text (it was too large,
// or not UTF-8). The result carries this reference instead of the bytes.
type Artifact struct {
	Bucket string `json:"bucket"`
	Key    string `json:"key"`
	Size   int64  `json:"size"`
	// SHA256 is the digest of the bytes, 64 lower-case hex digits.
	SHA256 string `json:"sha256"`
	// ContentType is the media type, when the output's name tells it.
	ContentType string `json:"content_type,omitempty"`
}

// LogInfo describes an attempt's log as kept in the object store, when it
// was truncated at the worker's --max-log-bytes: what was kept, and how
// much was left out. A result or an attempt carries it only then.
type LogInfo struct {
	Truncated bool `json:"truncated"`
	// Bytes and Lines are what the kept log holds.
	Bytes int64 `json:"bytes"`
	Lines int64 `json:"lines"`
	// DroppedLines were printed after the limit was reached.
	DroppedLines int64 `json:"dropped_lines"`
	// Limit is the worker's limit, in bytes.
	Limit int64 `json:"limit"`
}

var (
	sha256RE = regexp.MustCompile(`^[0-9a-f]{64}$`)
	// A bucket's name holds the subject prefix and a pool or a tenant
	// (<prefix>-artifacts-<pool>, <prefix>-uploads-<tenant>): up to
	// 32 + 16 + 64 characters.
	bucketRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)
)

// MaxObjectKey bounds the length of an object key, in bytes.
const MaxObjectKey = 512

// ValidSHA256 reports whether s is a SHA-256 digest in lower-case hex.
func ValidSHA256(s string) bool { return sha256RE.MatchString(s) }

// ValidBucket reports whether s may name an object store bucket.
func ValidBucket(s string) bool { return bucketRE.MatchString(s) }

// CheckObjectKey says what is wrong with key as the name of an object, or
// returns nil: 1 to 512 bytes of UTF-8, segments separated by "/", none of
// them empty, "." or "..", no leading "/", no control characters.
func CheckObjectKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("is empty")
	case len(key) > MaxObjectKey:
		return fmt.Errorf("is %d bytes, over the limit of %d", len(key), MaxObjectKey)
	case !utf8.ValidString(key):
		return fmt.Errorf("is not UTF-8")
	case strings.HasPrefix(key, "/"):
		return fmt.Errorf("%q is an absolute path", truncate(key, 40))
	}
	for _, r := range key {
		if unicode.IsControl(r) {
			return fmt.Errorf("%q contains a control character", truncate(key, 40))
		}
	}
	for _, seg := range strings.Split(key, "/") {
		switch seg {
		case "":
			return fmt.Errorf("%q has an empty segment", truncate(key, 40))
		case ".", "..":
			return fmt.Errorf("%q has a %q segment", truncate(key, 40), seg)
		}
	}
	return nil
}

// inputRefs checks the inputs by reference of a request.
func (v *validator) inputRefs(r *Request, l Limits) {
	if n := len(r.Inputs) + len(r.InputRefs); n > l.MaxInputs {
		v.add("input_refs", "inputs and input_refs have %d files together, over the limit of %d", n, l.MaxInputs)
	}
	var total int64
	for _, name := range sortedRefKeys(r.InputRefs) {
		ref := r.InputRefs[name]
		field := "input_refs[" + truncate(name, 40) + "]"
		if !ValidFileName(name) {
			v.add("input_refs", "name %q must be a relative path of [A-Za-z0-9_.-] segments", truncate(name, 40))
		}
		if _, dup := r.Inputs[name]; dup {
			v.add("input_refs", "%q is also an inline input", truncate(name, 40))
		}
		if ref.Bucket != "" && !ValidBucket(ref.Bucket) {
			v.add(field+".bucket", "%q must be 1 to 128 characters of [A-Za-z0-9_-]", truncate(ref.Bucket, 40))
		}
		if err := CheckObjectKey(ref.Key); err != nil {
			v.add(field+".key", "%v", err)
		}
		if !ValidSHA256(ref.SHA256) {
			v.add(field+".sha256", "must be 64 lower-case hex digits")
		}
		if ref.Size != nil {
			if *ref.Size < 0 {
				v.add(field+".size", "must not be negative")
			} else {
				total += *ref.Size
			}
		}
	}
	if l.MaxInputRefBytes > 0 && total > l.MaxInputRefBytes {
		v.add("input_refs", "are %d bytes together, over the limit of %d", total, l.MaxInputRefBytes)
	}
}

func sortedRefKeys(m map[string]InputRef) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// artifact checks an artifact reference of a result.
func (v *validator) artifact(field string, a Artifact) {
	if !ValidBucket(a.Bucket) {
		v.add(field+".bucket", "%q must be 1 to 128 characters of [A-Za-z0-9_-]", truncate(a.Bucket, 40))
	}
	if err := CheckObjectKey(a.Key); err != nil {
		v.add(field+".key", "%v", err)
	}
	if a.Size < 0 {
		v.add(field+".size", "must not be negative")
	}
	if !ValidSHA256(a.SHA256) {
		v.add(field+".sha256", "must be 64 lower-case hex digits")
	}
}

func (v *validator) logInfo(field string, l *LogInfo) {
	if l == nil {
		return
	}
	if l.Bytes < 0 || l.Lines < 0 || l.DroppedLines < 0 || l.Limit < 0 {
		v.add(field, "counts must not be negative")
	}
}

func sortedArtifactKeys(m map[string]Artifact) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// UnmarshalJSON decodes an artifact strictly: every field but content_type
// is required, as in the schema, and unknown fields are refused.
func (a *Artifact) UnmarshalJSON(data []byte) error {
	type plain Artifact
	var p plain
	if err := decodeStrict(data, &p); err != nil {
		return err
	}
	if err := requireKeys(data, "bucket", "key", "size", "sha256"); err != nil {
		return fmt.Errorf("artifact: %w", err)
	}
	*a = Artifact(p)
	return nil
}

// UnmarshalJSON decodes a log description strictly: every field is
// required, as in the schema, and unknown fields are refused.
func (l *LogInfo) UnmarshalJSON(data []byte) error {
	type plain LogInfo
	var p plain
	if err := decodeStrict(data, &p); err != nil {
		return err
	}
	if err := requireKeys(data, "truncated", "bytes", "lines", "dropped_lines", "limit"); err != nil {
		return fmt.Errorf("log: %w", err)
	}
	*l = LogInfo(p)
	return nil
}
