package artifact

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// Defaults of Limits, and of the worker's flags.
const (
	DefaultMaxOutputBytes    = 1 << 30  // 1 GiB
	DefaultMaxJobOutputBytes = 4 << 30  // 4 GiB
	DefaultMaxLogBytes       = 64 << 20 // 64 MiB
)

// Limits bound what one attempt stores and fetches.
type Limits struct {
	// MaxOutputBytes bounds one output stored as an object (the worker's
	// --max-artifact-bytes). Defaults to DefaultMaxOutputBytes (1 GiB).
	MaxOutputBytes int64
	// MaxJobOutputBytes bounds an attempt's outputs stored as objects,
	// together (--max-job-artifact-bytes). Defaults to
	// DefaultMaxJobOutputBytes (4 GiB).
	MaxJobOutputBytes int64
	// MaxInputBytes bounds an attempt's inputs by reference, together.
	// Defaults to job.DefaultMaxInputRefBytes (8 GiB).
	MaxInputBytes int64
	// MaxLogBytes bounds an attempt's log (--max-log-bytes). Defaults to
	// DefaultMaxLogBytes (64 MiB); negative turns log archiving off.
	MaxLogBytes int64
}

// WithDefaults returns l with every zero limit set to its default.
func (l Limits) WithDefaults() Limits {
	if l.MaxOutputBytes <= 0 {
		l.MaxOutputBytes = DefaultMaxOutputBytes
	}
	if l.MaxJobOutputBytes <= 0 {
		l.MaxJobOutputBytes = DefaultMaxJobOutputBytes
	}
	if l.MaxInputBytes <= 0 {
		l.MaxInputBytes = job.DefaultMaxInputRefBytes
	}
	if l.MaxLogBytes == 0 {
		l.MaxLogBytes = DefaultMaxLogBytes
	}
	return l
}

// Attempt is what one attempt stores and fetches: its inputs by reference,
// its outputs stored as objects, and its log. The worker makes one per
// attempt and hands it to the executor (executor.Task.Artifacts).
type Attempt struct {
	s      *Store
	tenant string
	pool   string
	jobID  string
	n      int
	req    *job.Request
	lim    Limits
	logCtx context.Context
	purge  bool

	mu     sync.Mutex
	stored int64
	log    *LogWriter
}

// AttemptOptions configure an Attempt.
type AttemptOptions struct {
	// Tenant and Pool are the job's. Default to job.DefaultTenant and
	// job.DefaultPool.
	Tenant string
	Pool   string
	Limits Limits
	// LogContext bounds the log's stores: the worker's, so that the lines
	// of a cancelled attempt are kept.
	LogContext context.Context
	// Rerun says the attempt may have run before under its number (the job
	// was handed back): its log starts afresh.
	Rerun bool
}

// Attempt returns what attempt n of job jobID stores and fetches.
func (s *Store) Attempt(jobID string, n int, req *job.Request, o AttemptOptions) *Attempt {
	if o.LogContext == nil {
		o.LogContext = context.Background()
	}
	return &Attempt{s: s, tenant: cmp.Or(o.Tenant, job.DefaultTenant), pool: cmp.Or(o.Pool, job.DefaultPool),
		jobID: jobID, n: n, req: req, lim: o.Limits.WithDefaults(), logCtx: o.LogContext, purge: o.Rerun}
}

// FetchInputs writes the request's inputs by reference into dir, each
// whole and checked against its reference, or fails: ClassRejected when
// an object is missing (input_missing) or differs from its reference
// (input_changed), ClassInfrastructure when the store cannot be read.
func (a *Attempt) FetchInputs(ctx context.Context, dir string) error {
	names := make([]string, 0, len(a.req.InputRefs))
	for name := range a.req.InputRefs {
		names = append(names, name)
	}
	sort.Strings(names)
	var total int64
	for _, name := range names {
		ref := a.req.InputRefs[name]
		bucket := cmp.Or(ref.Bucket, a.s.UploadsOf(a.tenant))
		if err := a.s.CheckInputRef(a.tenant, bucket, ref.Key); err != nil {
			return job.Failf(job.ClassRejected, job.CodeInvalid, "input %s: %v", name, err)
		}
		if !job.ValidFileName(name) {
			return job.Failf(job.ClassRejected, job.CodeInvalid, "input name %q is not a relative file name", name)
		}
		info, err := a.s.Stat(ctx, bucket, ref.Key)
		if err == nil {
			total += info.Size
			if total > a.lim.MaxInputBytes {
				return job.Failf(job.ClassRejected, job.CodeInvalid,
					"inputs by reference are over the limit of %d bytes together (%s is %d bytes)", a.lim.MaxInputBytes, name, info.Size)
			}
		}
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err == nil {
			err = os.MkdirAll(filepath.Dir(p), 0o755)
		}
		if err == nil {
			_, err = a.s.FetchFile(ctx, bucket, ref.Key, Expect{SHA256: ref.SHA256, Size: ref.Size}, p, 0o444)
		}
		if err != nil {
			return inputFailure(name, bucket, ref.Key, err)
		}
	}
	return nil
}

// CheckInputRef refuses an input by reference that tenant may not use:
// one in a bucket that is not the fleet's, in another tenant's uploads
// bucket, or of a pool's bucket but not of the tenant's outputs
// (outputs/<tenant>/...). Ids are a tenant's own, and so are objects: a
// job reads only its tenant's.
func (s *Store) CheckInputRef(tenant, bucket, key string) error {
	if err := job.CheckObjectKey(key); err != nil {
		return fmt.Errorf("object key: %w", err)
	}
	pool, owner, ok := s.names.BucketOwner(bucket)
	switch {
	case !ok:
		return fmt.Errorf("bucket %q is not one of the fleet's buckets (%s, or a pool's %s)", bucket,
			s.UploadsOf(tenant), s.names.ArtifactsBucket("<pool>"))
	case pool == "" && owner != tenant:
		return fmt.Errorf("bucket %s is tenant %s's: a job of tenant %s reads its own tenant's uploads (%s)", bucket, owner, tenant, s.UploadsOf(tenant))
	case pool != "" && !strings.HasPrefix(key, "outputs/"+tenant+"/"):
		return fmt.Errorf("object %s of bucket %s is not an output of tenant %s (outputs/%s/...)", key, bucket, tenant, tenant)
	}
	return nil
}

func inputFailure(name, bucket, key string, err error) *job.Failure {
	switch {
	case errors.Is(err, ErrNotFound):
		return job.Failf(job.ClassRejected, job.CodeInputMissing,
			"input %s: there is no object %s in bucket %s (never uploaded, or expired with the retention)", name, key, bucket)
	case errors.Is(err, ErrChanged):
		return job.Failf(job.ClassRejected, job.CodeInputChanged, "input %s: %v", name, err)
	}
	return job.Failf(job.ClassInfrastructure, job.CodeInputNotFetched, "input %s: %v", name, err)
}

// StoreOutput stores one output of the attempt, read from r, which holds
// size bytes, as outputs/<tenant>/<job>/<attempt>/<name> in its pool's
// bucket.
// An output over the limits fails the attempt, execution/output_too_large,
// naming the limit; a store that fails, infrastructure/output_not_stored.
func (a *Attempt) StoreOutput(ctx context.Context, name string, r io.Reader, size int64) (*job.Artifact, error) {
	if size > a.lim.MaxOutputBytes {
		return nil, job.Failf(job.ClassExecution, job.CodeOutputLarge,
			"output %s is %d bytes, over the limit of %d bytes per output (--max-artifact-bytes)", name, size, a.lim.MaxOutputBytes)
	}
	a.mu.Lock()
	left := a.lim.MaxJobOutputBytes - a.stored
	if size > left {
		a.mu.Unlock()
		return nil, job.Failf(job.ClassExecution, job.CodeOutputLarge,
			"outputs are over the limit of %d bytes together (--max-job-artifact-bytes; %s is %d bytes)", a.lim.MaxJobOutputBytes, name, size)
	}
	a.stored += size
	a.mu.Unlock()
	info, err := a.s.Put(ctx, a.s.ArtifactsOf(a.pool), OutputKey(a.tenant, a.jobID, a.n, name), r,
		PutOptions{ContentType: mime.TypeByExtension(path.Ext(name)), MaxBytes: min(a.lim.MaxOutputBytes, left)})
	if err != nil {
		a.mu.Lock()
		a.stored -= size
		a.mu.Unlock()
	}
	switch {
	case errors.Is(err, ErrTooLarge):
		return nil, job.Failf(job.ClassExecution, job.CodeOutputLarge, "output %s grew over the limits while it was stored: %v", name, err)
	case err != nil:
		return nil, job.Failf(job.ClassInfrastructure, job.CodeOutputNotStored, "output %s: %v", name, err)
	}
	art := info.Artifact()
	return &art, nil
}

// Log archives one line of the attempt's output.
func (a *Attempt) Log(stream, line string) {
	if a.lim.MaxLogBytes < 0 {
		return
	}
	t := time.Now()
	a.mu.Lock()
	if a.log == nil {
		a.log = a.s.NewLog(a.logCtx, queue.JobKey{Tenant: a.tenant, Pool: a.pool, ID: a.jobID}, a.n,
			LogOptions{MaxBytes: a.lim.MaxLogBytes, PurgeFirst: a.purge})
	}
	w := a.log
	a.mu.Unlock()
	w.Line(t, stream, line)
}

// CloseLog stores the rest of the log and its description, and returns
// the log's description for the result when it was truncated (nil
// otherwise, and when the attempt printed nothing).
func (a *Attempt) CloseLog(ctx context.Context) (*job.LogInfo, error) {
	a.mu.Lock()
	w := a.log
	a.mu.Unlock()
	if w == nil {
		return nil, nil
	}
	sum, err := w.Close(ctx)
	if sum == nil || !sum.Truncated {
		return nil, err
	}
	return sum.Info(), err
}

// AbortLog drops the log of an attempt handed back.
func (a *Attempt) AbortLog(ctx context.Context) error {
	a.mu.Lock()
	w := a.log
	a.mu.Unlock()
	if w == nil {
		return nil
	}
	if err := w.Abort(ctx); err != nil {
		return fmt.Errorf("drop the log of a handed-back attempt: %w", err)
	}
	return nil
}
