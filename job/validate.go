package job

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// Limits bound what one request may ask for. A zero field takes its default.
// The defaults are also the bounds written in the JSON Schema.
type Limits struct {
	MaxRequestBytes int // Defaults to 512 KiB.
	MaxInputBytes   int // Sum of input contents. Defaults to 256 KiB.
	MaxInputs       int // Inline and by reference together. Defaults to 64.
	// MaxInputRefBytes bounds the sum of the sizes of a request's inputs
	// by reference. Defaults to DefaultMaxInputRefBytes (8 GiB).
	MaxInputRefBytes int64
	MaxOutputs       int           // Defaults to 64.
	MaxEnv           int           // Defaults to 128 entries.
	MaxEnvBytes      int           // Sum of keys and values. Defaults to 64 KiB.
	MaxCommandArgs   int           // Defaults to 256.
	MaxCommandBytes  int           // Sum of arguments. Defaults to 64 KiB.
	MaxLabels        int           // Defaults to 32.
	MaxAttempts      int           // Defaults to 100.
	MaxTimeout       time.Duration // Longest timeout, queue_timeout or deadline. Defaults to 7 days.
	MaxGPU           int           // Defaults to 64.
}

// DefaultMaxInputRefBytes is the default bound on the sum of a request's
// inputs by reference.
const DefaultMaxInputRefBytes = 8 << 30

// DefaultLimits are the limits used when none are configured.
var DefaultLimits = Limits{}.WithDefaults()

// WithDefaults returns l with every zero limit set to its default.
func (l Limits) WithDefaults() Limits {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&l.MaxRequestBytes, 512<<10)
	def(&l.MaxInputBytes, 256<<10)
	def(&l.MaxInputs, 64)
	def(&l.MaxOutputs, 64)
	def(&l.MaxEnv, 128)
	def(&l.MaxEnvBytes, 64<<10)
	def(&l.MaxCommandArgs, 256)
	def(&l.MaxCommandBytes, 64<<10)
	def(&l.MaxLabels, 32)
	def(&l.MaxAttempts, 100)
	def(&l.MaxGPU, 64)
	if l.MaxTimeout <= 0 {
		l.MaxTimeout = 7 * 24 * time.Hour
	}
	if l.MaxInputRefBytes <= 0 {
		l.MaxInputRefBytes = DefaultMaxInputRefBytes
	}
	return l
}

// ValidationError lists every problem found in a request, each prefixed by
// the field it concerns.
type ValidationError struct {
	Problems []string
}

func (e *ValidationError) Error() string {
	return "invalid request: " + joinProblems(e.Problems)
}

func joinProblems(p []string) string { return strings.Join(p, "; ") }

var (
	minMemory = int64(6 << 20) // Docker refuses smaller limits.
	maxMemory = int64(1 << 50) // 1Pi: four times it (an OOM retry's cap) still counts
)

// The names a request, a record and a subject carry are checked on every
// submission and every delivery, so by these byte tests rather than
// regular expressions (a tenth of a worker's CPU per job went to them);
// names_test.go holds each to the expression it stands for.

// word reports whether c is one of [A-Za-z0-9_-].
func word(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

// ValidID reports whether s may be a job's id: one a producer may give
// (see ValidSubmittedID), or the id of a run's node (RunJobID).
func ValidID(s string) bool {
	if strings.IndexByte(s, ':') >= 0 {
		_, _, _, ok := ParseRunJobID(s)
		return ok
	}
	return ValidSubmittedID(s)
}

// ValidSubmittedID reports whether s may be used as the id of a job a
// producer submits: 1 to 128 characters of [A-Za-z0-9_.-], with dots only
// between other characters, because the id is a token of NATS subjects
// (`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`).
func ValidSubmittedID(s string) bool {
	if len(s) == 0 || len(s) > 128 || s[0] == '.' || s[len(s)-1] == '.' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '.' {
			if s[i-1] == '.' {
				return false
			}
		} else if !word(c) {
			return false
		}
	}
	return true
}

// ValidPool reports whether s may name a pool: 1 to 64 characters of
// [A-Za-z0-9_-].
func ValidPool(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !word(s[i]) {
			return false
		}
	}
	return true
}

// ValidTenant reports whether s may name a tenant: the same rule as a
// pool's, since both are tokens of subjects and parts of bucket names.
func ValidTenant(s string) bool { return ValidPool(s) }

// validEnvKey: `^[A-Za-z_][A-Za-z0-9_]*$`.
func validEnvKey(s string) bool {
	if len(s) == 0 || s[0] >= '0' && s[0] <= '9' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '-' || !word(c) {
			return false
		}
	}
	return true
}

// validFileName: segments of `[A-Za-z0-9_][A-Za-z0-9_.-]*` joined by
// slashes.
func validFileName(s string) bool {
	start := true
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '/':
			if start {
				return false
			}
			start = true
		case start:
			if c == '.' || c == '-' || !word(c) {
				return false
			}
			start = false
		case c != '.' && !word(c):
			return false
		}
	}
	return !start
}

// Priorities of a request.
const (
	HighestPriority = 1
	LowestPriority  = 5
)

// DefaultTenant is the tenant of every job on a fleet whose producers do
// not authenticate, and of v1 submissions.
const DefaultTenant = "default"

// Validate checks every field of r against the contract and the limits. It
// accepts a request before or after Normalize.
func (r *Request) Validate(l Limits) error {
	l = l.WithDefaults()
	var v validator

	if run, node, _, ok := ParseRunJobID(r.ID); ok {
		// A run's node, as the fleet queues it.
		if r.RunID != run || r.NodeID != node {
			v.add("id", "%q is the job of node %s of run %s, which its run_id and node_id must say", truncate(r.ID, 40), node, run)
		}
	} else if r.ID != "" && !ValidSubmittedID(r.ID) {
		v.add("id", "%q must be 1 to 128 characters of [A-Za-z0-9_.-], with dots only between other characters", truncate(r.ID, 40))
	}
	v.text("run_id", r.RunID, 256)
	v.text("node_id", r.NodeID, 256)
	if r.Pool != "" && !ValidPool(r.Pool) {
		v.add("pool", "%q must be 1 to 64 characters of [A-Za-z0-9_-]", truncate(r.Pool, 40))
	}
	if r.Priority != 0 && (r.Priority < HighestPriority || r.Priority > LowestPriority) {
		v.add("priority", "%d must be from %d (highest) to %d (lowest)", r.Priority, HighestPriority, LowestPriority)
	}
	if utf8.RuneCountInString(r.Image) > 512 || strings.ContainsAny(r.Image, " \t\n\f\r") {
		v.add("image", "%q is not an image reference", truncate(r.Image, 40))
	}

	// command
	if len(r.Command) > l.MaxCommandArgs {
		v.add("command", "has %d arguments, over the limit of %d", len(r.Command), l.MaxCommandArgs)
	}
	n := 0
	for i, a := range r.Command {
		n += len(a)
		if strings.IndexByte(a, 0) >= 0 {
			v.add(fmt.Sprintf("command[%d]", i), "contains a NUL byte")
		}
	}
	if n > l.MaxCommandBytes {
		v.add("command", "is %d bytes, over the limit of %d", n, l.MaxCommandBytes)
	}
	if len(r.Command) > 0 && r.Command[0] == "" {
		v.add("command[0]", "must name a program")
	}

	// env: never echo values, they may be secrets.
	if len(r.Env) > l.MaxEnv {
		v.add("env", "has %d entries, over the limit of %d", len(r.Env), l.MaxEnv)
	}
	n = 0
	for _, k := range slices.Sorted(maps.Keys(r.Env)) {
		n += len(k) + len(r.Env[k])
		switch {
		case !validEnvKey(k) || len(k) > 256:
			v.add("env", "key %q must match [A-Za-z_][A-Za-z0-9_]* (at most 256 characters)", truncate(k, 40))
		case strings.HasPrefix(k, "FLEET_"):
			v.add("env", "key %q is reserved: FLEET_ variables are set by the worker", k)
		case strings.IndexByte(r.Env[k], 0) >= 0:
			v.add("env", "value of %q contains a NUL byte", k)
		}
	}
	if n > l.MaxEnvBytes {
		v.add("env", "is %d bytes, over the limit of %d", n, l.MaxEnvBytes)
	}

	if r.Workdir != "" {
		if utf8.RuneCountInString(r.Workdir) > 1024 || strings.IndexByte(r.Workdir, 0) >= 0 || hasDotDot(r.Workdir) {
			v.add("workdir", "%q must be a path without \"..\" segments", truncate(r.Workdir, 40))
		}
	}

	switch r.PullPolicy {
	case "", PullIfNotPresent, PullAlways, PullNever:
	default:
		v.add("pull_policy", "%q must be one of if_not_present, always, never", truncate(string(r.PullPolicy), 40))
	}

	if res := r.Resources; res != nil {
		if res.CPU != "" {
			if c, err := ParseCPU(res.CPU); err != nil {
				v.add("resources.cpu", "%v", err)
			} else if c <= 0 {
				v.add("resources.cpu", "must be more than zero")
			}
		}
		if res.Memory != "" {
			if m, err := ParseMemory(res.Memory); err != nil {
				v.add("resources.memory", "%v", err)
			} else if m < minMemory {
				v.add("resources.memory", "%q is below the minimum of 6Mi", res.Memory)
			} else if m > maxMemory {
				v.add("resources.memory", "%q is over the maximum of 1Pi", res.Memory)
			}
		}
		if res.GPU < 0 || res.GPU > l.MaxGPU {
			v.add("resources.gpu", "%d must be between 0 and %d", res.GPU, l.MaxGPU)
		}
		if res.GPUModel != "" {
			if err := ValidateLabel(GPUModelLabel, res.GPUModel); err != nil || res.GPUModel == "" {
				v.add("resources.gpu_model", "%q must be at most 63 characters of [A-Za-z0-9_.-], starting and ending with a letter or digit", truncate(res.GPUModel, 70))
			}
			if res.GPU < 1 {
				v.add("resources.gpu_model", "asks for a GPU model, but resources.gpu is %d", res.GPU)
			}
		}
	}
	if p := r.Persist; p != nil && p.Size != "" {
		if b, err := ParseMemory(p.Size); err != nil {
			v.add("persist.size", "%v", err)
		} else if b < 1<<20 {
			v.add("persist.size", "%q is below the minimum of 1Mi", p.Size)
		}
	}
	if p := r.Placement; p != nil {
		if len(p.NodeSelector) > MaxNodeSelector {
			v.add("placement.node_selector", "has %d entries, over the limit of %d", len(p.NodeSelector), MaxNodeSelector)
		}
		for _, k := range slices.Sorted(maps.Keys(p.NodeSelector)) {
			if err := ValidateLabel(k, p.NodeSelector[k]); err != nil {
				v.add("placement.node_selector", "%v", err)
			}
		}
		if m, ok := p.NodeSelector[GPUModelLabel]; ok && r.Resources != nil && r.Resources.GPUModel != "" && m != r.Resources.GPUModel {
			v.add("placement.node_selector", "%s is %q, but resources.gpu_model is %q", GPUModelLabel, m, r.Resources.GPUModel)
		}
	}

	v.duration("timeout", r.Timeout, l.MaxTimeout)
	v.duration("queue_timeout", r.QueueTimeout, l.MaxTimeout)
	v.duration("deadline", r.Deadline, l.MaxTimeout)

	if p := r.Retry; p != nil {
		if p.MaxAttempts < 0 || p.MaxAttempts > l.MaxAttempts {
			v.add("retry.max_attempts", "%d must be between 1 and %d", p.MaxAttempts, l.MaxAttempts)
		}
		if p.MaxLost != nil && (*p.MaxLost < 0 || *p.MaxLost > l.MaxAttempts) {
			v.add("retry.max_lost", "%d must be between 0 and %d", *p.MaxLost, l.MaxAttempts)
		}
		v.duration("retry.initial_backoff", p.InitialBackoff, l.MaxTimeout)
		v.duration("retry.max_backoff", p.MaxBackoff, l.MaxTimeout)
		if p.InitialBackoff != nil && p.MaxBackoff != nil && *p.MaxBackoff < *p.InitialBackoff {
			v.add("retry.max_backoff", "%s is shorter than initial_backoff %s", p.MaxBackoff, p.InitialBackoff)
		}
		if p.Multiplier != 0 && (p.Multiplier < 1 || p.Multiplier > 100) {
			v.add("retry.multiplier", "%g must be between 1 and 100", p.Multiplier)
		}
		if p.Jitter != nil && (*p.Jitter < 0 || *p.Jitter > 1) {
			v.add("retry.jitter", "%g must be between 0 and 1", *p.Jitter)
		}
		for _, c := range p.RetryOn {
			if !c.Valid() {
				v.add("retry.retry_on", "%q is not a failure class (%s)", truncate(string(c), 40), strings.Join(classNames(), ", "))
			}
		}
		if len(p.RetryOn) > len(classNames()) {
			v.add("retry.retry_on", "lists %d classes; there are only %d", len(p.RetryOn), len(classNames()))
		}
		if len(p.NonRetryableExitCodes) > 256 {
			v.add("retry.non_retryable_exit_codes", "has %d codes, over the limit of 256", len(p.NonRetryableExitCodes))
		}
		if p.OOMMemoryMultiplier != 0 && (p.OOMMemoryMultiplier < 1 || p.OOMMemoryMultiplier > 16) {
			v.add("retry.oom_memory_multiplier", "%g must be between 1 and 16", p.OOMMemoryMultiplier)
		}
		if p.MaxMemory != "" {
			if _, err := ParseMemory(p.MaxMemory); err != nil {
				v.add("retry.max_memory", "%v", err)
			}
		}
	}

	// inputs and outputs are file names under the workspace.
	if len(r.Inputs) > l.MaxInputs {
		v.add("inputs", "has %d files, over the limit of %d", len(r.Inputs), l.MaxInputs)
	}
	n = 0
	for _, name := range slices.Sorted(maps.Keys(r.Inputs)) {
		n += len(r.Inputs[name])
		if !ValidFileName(name) {
			v.add("inputs", "name %q must be a relative path of [A-Za-z0-9_.-] segments", truncate(name, 40))
		}
	}
	if n > l.MaxInputBytes {
		v.add("inputs", "are %d bytes, over the limit of %d", n, l.MaxInputBytes)
	}
	v.inputRefs(r, l)
	if len(r.Outputs) > l.MaxOutputs {
		v.add("outputs", "has %d files, over the limit of %d", len(r.Outputs), l.MaxOutputs)
	}
	seen := make(map[string]bool, len(r.Outputs))
	for _, name := range r.Outputs {
		if !ValidFileName(name) {
			v.add("outputs", "name %q must be a relative path of [A-Za-z0-9_.-] segments", truncate(name, 40))
		}
		if seen[name] {
			v.add("outputs", "%q is listed twice", truncate(name, 40))
		}
		seen[name] = true
	}

	if len(r.Labels) > l.MaxLabels {
		v.add("labels", "has %d entries, over the limit of %d", len(r.Labels), l.MaxLabels)
	}
	for _, k := range slices.Sorted(maps.Keys(r.Labels)) {
		if err := ValidateLabel(k, r.Labels[k]); err != nil {
			v.add("labels", "%v", err)
		}
	}

	return v.err()
}

// ValidFileName reports whether name may name an input or output file: a
// relative path whose segments are made of [A-Za-z0-9_.-], start with a
// letter, digit or underscore, and are at most 255 characters in all.
func ValidFileName(name string) bool {
	return len(name) <= 255 && validFileName(name)
}

func hasDotDot(p string) bool {
	for _, seg := range strings.Split(p, "/") {
		if seg == ".." {
			return true
		}
	}
	return false
}

type validator struct{ problems []string }

func (v *validator) add(field, format string, args ...any) {
	v.problems = append(v.problems, field+": "+fmt.Sprintf(format, args...))
}

func (v *validator) text(field, s string, max int) {
	if n := utf8.RuneCountInString(s); n > max {
		v.add(field, "is %d characters, over the limit of %d", n, max)
	}
}

func (v *validator) duration(field string, d *Duration, max time.Duration) {
	if d == nil {
		return
	}
	switch {
	case *d <= 0:
		v.add(field, "must be more than zero")
	case d.Std() > max:
		v.add(field, "%s is over the limit of %s", d, max)
	}
}

func (v *validator) err() error {
	if len(v.problems) == 0 {
		return nil
	}
	return &ValidationError{Problems: v.problems}
}
