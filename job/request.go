package job

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"
)

// Defaults applied to a request by Normalize, as in the Rust seed.
const (
	DefaultPool           = "default"
	DefaultPriority       = 3
	DefaultCPU            = "1"
	DefaultMemory         = "256Mi"
	DefaultTimeout        = 60 * time.Second
	DefaultMaxAttempts    = 1
	DefaultMaxLost        = 3
	DefaultInitialBackoff = time.Second
	DefaultMaxBackoff     = time.Minute
	DefaultMultiplier     = 2.0
	DefaultJitter         = 0.2
)

// DefaultRetryOn lists the failure classes retried when a policy names none.
// image, cancelled and rejected failures are never worth another attempt by
// default: the same image is still missing, the user still wants it stopped.
var DefaultRetryOn = []FailureClass{ClassExecution, ClassTimeout, ClassInfrastructure}

// PullPolicy says when an executor pulls the image before running it.
type PullPolicy string

// Pull policies.
const (
	PullIfNotPresent PullPolicy = "if_not_present"
	PullAlways       PullPolicy = "always"
	PullNever        PullPolicy = "never"
)

// Request is an execution request (schema execution-request.v1).
type Request struct {
	// ID names the job and is its idempotency key: a second request with an
	// ID the fleet has seen is not run again. Generated when empty.
	ID     string `json:"id,omitempty"`
	RunID  string `json:"run_id,omitempty"`
	NodeID string `json:"node_id,omitempty"`
	// Pool selects the workers that may run the job. Defaults to "default".
	Pool string `json:"pool,omitempty"`
	// Priority orders the jobs of a pool: 1 is the highest, 5 the lowest.
	// A job of a higher priority starts before any queued job of a lower
	// one. Defaults to 3 (schema v2).
	Priority int `json:"priority,omitempty"`
	// Image is the container image; required by docker and kubernetes pools.
	Image   string            `json:"image,omitempty"`
	Command []string          `json:"command,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	// Workdir is the working directory; relative paths resolve under the
	// attempt's work directory (/fleet/work in a container).
	Workdir    string     `json:"workdir,omitempty"`
	PullPolicy PullPolicy `json:"pull_policy,omitempty"`
	Resources  *Resources `json:"resources,omitempty"`
	// Timeout bounds one attempt's run time. Defaults to 60s.
	Timeout *Duration `json:"timeout,omitempty"`
	// QueueTimeout bounds how long the job may wait before its first attempt
	// starts, counted from NotBefore when that is later than the
	// submission. Unset means no bound.
	QueueTimeout *Duration `json:"queue_timeout,omitempty"`
	// NotBefore delays the job's first attempt: the job is accepted at once
	// and does not start before this time (RFC 3339).
	NotBefore *time.Time `json:"not_before,omitempty"`
	// Deadline bounds the whole job, all attempts and the waits between them,
	// measured from submission. Unset means no bound.
	Deadline *Duration    `json:"deadline,omitempty"`
	Retry    *RetryPolicy `json:"retry,omitempty"`
	// Inputs are files, by relative name, made read-only under /fleet/inputs.
	Inputs map[string]string `json:"inputs,omitempty"`
	// InputRefs are inputs that are objects in the fleet's object store,
	// by relative name, streamed into /fleet/inputs before the job runs.
	InputRefs map[string]InputRef `json:"input_refs,omitempty"`
	// Outputs names the files read from /fleet/outputs after the run and
	// carried in the result.
	Outputs []string          `json:"outputs,omitempty"`
	Labels  map[string]string `json:"labels,omitempty"`
	// Persist asks for a data directory that every attempt of the job
	// sees, in $FLEET_DATA (see Persist).
	Persist *Persist `json:"persist,omitempty"`
	// Placement says where the job may run, among what its pool allows.
	Placement *Placement `json:"placement,omitempty"`
}

// Resources a job needs. Quantities use Kubernetes notation.
type Resources struct {
	CPU    string `json:"cpu,omitempty"`
	Memory string `json:"memory,omitempty"`
	GPU    int    `json:"gpu,omitempty"`
	// GPUModel asks for GPUs of one model, as the node label
	// nvidia.com/gpu.product names it ("H100", "NVIDIA-A100-SXM4-80GB"):
	// a node selector on Kubernetes, devices of that model on Docker.
	GPUModel string `json:"gpu_model,omitempty"`
}

// CPUMilli returns the CPU request in millicores. The request must be valid.
func (r *Resources) CPUMilli() int64 {
	v, _ := ParseCPU(r.CPU)
	return v
}

// MemoryBytes returns the memory request in bytes. The request must be valid.
func (r *Resources) MemoryBytes() int64 {
	v, _ := ParseMemory(r.Memory)
	return v
}

// RetryPolicy governs what happens after a failed attempt.
type RetryPolicy struct {
	// MaxAttempts counts all attempts, the first included. Defaults to 1.
	MaxAttempts int `json:"max_attempts,omitempty"`
	// MaxLost bounds the attempts lost to the fleet itself (a worker that
	// died or was cut off mid-attempt), which are run again without
	// counting against MaxAttempts. Defaults to 3; 0 allows none.
	MaxLost        *int      `json:"max_lost,omitempty"`
	InitialBackoff *Duration `json:"initial_backoff,omitempty"` // Defaults to 1s.
	MaxBackoff     *Duration `json:"max_backoff,omitempty"`     // Defaults to 1m.
	Multiplier     float64   `json:"multiplier,omitempty"`      // Defaults to 2.
	// Jitter is the randomization factor: a delay d becomes a random value in
	// [d*(1-jitter), d*(1+jitter)]. Defaults to 0.2; 0 disables it.
	Jitter *float64 `json:"jitter,omitempty"`
	// RetryOn lists the failure classes that are retried.
	// Defaults to execution, timeout and infrastructure.
	RetryOn []FailureClass `json:"retry_on,omitempty"`
	// NonRetryableExitCodes are exit codes that end the job at once.
	NonRetryableExitCodes []int `json:"non_retryable_exit_codes,omitempty"`
	// OOMMemoryMultiplier, when above 1, raises the memory limit of the next
	// attempt by this factor after an oom failure, up to MaxMemory.
	OOMMemoryMultiplier float64 `json:"oom_memory_multiplier,omitempty"`
	// MaxMemory caps the memory that OOM retries may grow to.
	// Defaults to four times the request's memory.
	MaxMemory string `json:"max_memory,omitempty"`
}

// Retries reports whether a failure of class c with the given exit code may
// be retried under p (attempts aside).
func (p *RetryPolicy) Retries(c FailureClass, exitCode *int) bool {
	if !slices.Contains(p.RetryOn, c) {
		return false
	}
	if exitCode != nil && slices.Contains(p.NonRetryableExitCodes, *exitCode) {
		return false
	}
	return true
}

// DecodeRequest decodes one request strictly: unknown fields, trailing data,
// wrong types and documents larger than l.MaxRequestBytes are errors. It does
// not validate values; call Validate for that.
func DecodeRequest(data []byte, l Limits) (*Request, error) {
	l = l.WithDefaults()
	if len(data) > l.MaxRequestBytes {
		return nil, &TooLargeError{What: "request", Size: len(data), Limit: l.MaxRequestBytes}
	}
	if t := bytes.TrimLeft(data, " \t\r\n"); len(t) > 0 && t[0] != '{' {
		return nil, errors.New("invalid request: expected a JSON object")
	}
	var r Request
	if err := decodeStrict(data, &r); err != nil {
		var de *durationError
		if errors.As(err, &de) {
			return nil, fmt.Errorf("invalid request: %s: %w", durationField(data, de.value), err)
		}
		var te *time.ParseError
		if errors.As(err, &te) {
			return nil, fmt.Errorf("invalid request: not_before: must be an RFC 3339 time such as 2026-12-01T09:30:00Z, got %s", te.Value)
		}
		return nil, fmt.Errorf("invalid request: %w", err)
	}
	return &r, nil
}

// DecodeJob decodes a request as a dispatcher publishes it to workers:
// normalized and encoded by the fleet, so neither held to the request size
// limit (escaping can make the encoding larger than what was submitted)
// nor decoded strictly, which costs twice as much. Validate it still.
func DecodeJob(data []byte) (*Request, error) {
	var r Request
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("invalid job message: %w", describeJSONError(err))
	}
	return &r, nil
}

// durationField names the duration field of a request document that holds
// the string value.
func durationField(data []byte, value string) string {
	var doc struct {
		Timeout      json.RawMessage `json:"timeout"`
		QueueTimeout json.RawMessage `json:"queue_timeout"`
		Deadline     json.RawMessage `json:"deadline"`
		Retry        struct {
			InitialBackoff json.RawMessage `json:"initial_backoff"`
			MaxBackoff     json.RawMessage `json:"max_backoff"`
		} `json:"retry"`
	}
	_ = json.Unmarshal(data, &doc)
	for _, f := range []struct {
		name string
		raw  json.RawMessage
	}{
		{"timeout", doc.Timeout}, {"queue_timeout", doc.QueueTimeout}, {"deadline", doc.Deadline},
		{"retry.initial_backoff", doc.Retry.InitialBackoff}, {"retry.max_backoff", doc.Retry.MaxBackoff},
	} {
		var s string
		if json.Unmarshal(f.raw, &s) == nil && s == value {
			return f.name
		}
	}
	return "duration"
}

// TooLargeError reports a document or field over its limit.
type TooLargeError struct {
	What        string
	Size, Limit int
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("%s is %d bytes, over the limit of %d", e.What, e.Size, e.Limit)
}

func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return describeJSONError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("unexpected data after the JSON document")
	}
	return nil
}

// describeJSONError turns encoding/json's errors into messages that name the
// field, which is what a producer needs to fix the request.
func describeJSONError(err error) error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return fmt.Errorf("malformed JSON at byte %d: %v", syn.Offset, syn)
	case errors.As(err, &typ):
		if typ.Field != "" {
			return fmt.Errorf("%s: expected %s, got JSON %s", typ.Field, typ.Type, typ.Value)
		}
		return fmt.Errorf("expected a JSON object, got JSON %s", typ.Value)
	case errors.Is(err, io.EOF):
		return errors.New("empty document")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return errors.New("malformed JSON: unexpected end of document")
	}
	return err
}

// Normalize fills in every default, so that workers see a complete request.
// It is idempotent.
func (r *Request) Normalize() {
	if r.Pool == "" {
		r.Pool = DefaultPool
	}
	if r.Priority == 0 {
		r.Priority = DefaultPriority
	}
	if r.PullPolicy == "" {
		r.PullPolicy = PullIfNotPresent
	}
	if r.Resources == nil {
		r.Resources = &Resources{}
	}
	if r.Resources.CPU == "" {
		r.Resources.CPU = DefaultCPU
	}
	if r.Resources.Memory == "" {
		r.Resources.Memory = DefaultMemory
	}
	if r.Timeout == nil {
		d := Duration(DefaultTimeout)
		r.Timeout = &d
	}
	if r.Retry == nil {
		r.Retry = &RetryPolicy{}
	}
	p := r.Retry
	if p.MaxAttempts == 0 {
		p.MaxAttempts = DefaultMaxAttempts
	}
	if p.MaxLost == nil {
		n := DefaultMaxLost
		p.MaxLost = &n
	}
	if p.InitialBackoff == nil {
		d := Duration(DefaultInitialBackoff)
		p.InitialBackoff = &d
	}
	if p.MaxBackoff == nil {
		d := Duration(DefaultMaxBackoff)
		p.MaxBackoff = &d
	}
	if p.Multiplier == 0 {
		p.Multiplier = DefaultMultiplier
	}
	if p.Jitter == nil {
		j := DefaultJitter
		p.Jitter = &j
	}
	if p.RetryOn == nil {
		p.RetryOn = slices.Clone(DefaultRetryOn)
	}
	if p.OOMMemoryMultiplier > 1 && p.MaxMemory == "" {
		p.MaxMemory = FormatMemory(4 * r.Resources.MemoryBytes())
	}
	if r.Persist != nil && !r.Persist.Enabled {
		r.Persist = nil
	}
	if r.Placement != nil && len(r.Placement.NodeSelector) == 0 {
		r.Placement = nil
	}
}

// Clone returns a deep copy of r.
func (r *Request) Clone() *Request {
	c := *r
	c.Command = slices.Clone(r.Command)
	c.Outputs = slices.Clone(r.Outputs)
	c.Env = cloneMap(r.Env)
	c.Inputs = cloneMap(r.Inputs)
	if r.InputRefs != nil {
		c.InputRefs = make(map[string]InputRef, len(r.InputRefs))
		for k, ref := range r.InputRefs {
			if ref.Size != nil {
				n := *ref.Size
				ref.Size = &n
			}
			c.InputRefs[k] = ref
		}
	}
	c.Labels = cloneMap(r.Labels)
	if r.Resources != nil {
		res := *r.Resources
		c.Resources = &res
	}
	if r.Retry != nil {
		p := *r.Retry
		p.RetryOn = slices.Clone(r.Retry.RetryOn)
		p.NonRetryableExitCodes = slices.Clone(r.Retry.NonRetryableExitCodes)
		if r.Retry.MaxLost != nil {
			n := *r.Retry.MaxLost
			p.MaxLost = &n
		}
		c.Retry = &p
	}
	if r.Persist != nil {
		p := *r.Persist
		c.Persist = &p
	}
	c.Placement = r.Placement.Clone()
	return &c
}

func cloneMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	c := make(map[string]string, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}
