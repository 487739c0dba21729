package dispatcher

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/fleet-dev/fleet/internal/artifact"
	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// inputCheck refuses at admission a request whose inputs by reference
// name objects that are not its tenant's (see artifact.CheckInputRef),
// that are not in the fleet's object store, or that differ from their
// reference: one direct get per input, for the requests that have some.
// A worker checks again, against the bytes, before the job runs. Then the
// next admission, if any, decides.
type inputCheck struct {
	s     *artifact.Store
	limit int64
	next  Admission
}

// tenantKey carries the tenant of a request to the admissions.
type tenantKey struct{}

// withTenant is ctx for admitting a request of tenant.
func withTenant(ctx context.Context, tenant string) context.Context {
	return context.WithValue(ctx, tenantKey{}, tenant)
}

// submissionKey carries a submission's job.SubmissionHeader to admit.
type submissionKey struct{}

// withSubmission is ctx for a submission its producer named token; an
// invalid token is ignored.
func withSubmission(ctx context.Context, token string) context.Context {
	if token == "" || !job.ValidID(token) {
		return ctx
	}
	return context.WithValue(ctx, submissionKey{}, token)
}

// submissionFrom is the submission's token, "" when it has none.
func submissionFrom(ctx context.Context) string {
	s, _ := ctx.Value(submissionKey{}).(string)
	return s
}

// tenantFrom is the tenant of the request being admitted: the default
// tenant's unless withTenant said otherwise.
func tenantFrom(ctx context.Context) string {
	t, _ := ctx.Value(tenantKey{}).(string)
	return cmp.Or(t, job.DefaultTenant)
}

func (c inputCheck) Admit(ctx context.Context, r *job.Request) (string, error) {
	if len(r.InputRefs) > 0 {
		if err := c.check(ctx, tenantFrom(ctx), r); err != nil {
			return "", err
		}
	}
	if c.next == nil {
		return "", nil
	}
	return c.next.Admit(ctx, r)
}

func (c inputCheck) check(ctx context.Context, tenant string, r *job.Request) error {
	names := make([]string, 0, len(r.InputRefs))
	for name := range r.InputRefs {
		names = append(names, name)
	}
	sort.Strings(names)
	var total int64
	for _, name := range names {
		ref := r.InputRefs[name]
		bucket := cmp.Or(ref.Bucket, c.s.UploadsOf(tenant))
		if err := c.s.CheckInputRef(tenant, bucket, ref.Key); err != nil {
			return fmt.Errorf("input_refs[%s]: %w", name, err)
		}
		info, err := c.s.Stat(ctx, bucket, ref.Key)
		switch {
		case errors.Is(err, artifact.ErrNotFound):
			return fmt.Errorf("input_refs[%s]: there is no object %s in bucket %s (upload it first, e.g. with fleetctl upload)", name, ref.Key, bucket)
		case err != nil:
			return errTransient{fmt.Errorf("input_refs[%s]: %w", name, err)}
		}
		if err := info.Check(artifact.Expect{SHA256: ref.SHA256, Size: ref.Size}); err != nil {
			return fmt.Errorf("input_refs[%s]: %w", name, err)
		}
		total += info.Size
		if total > c.limit {
			return fmt.Errorf("input_refs: the objects are over the limit of %d bytes together (--max-input-ref-bytes; %s is %d bytes)", c.limit, name, info.Size)
		}
	}
	return nil
}

// Uploads makes sure tenant's uploads bucket exists, and names it: the
// answer to the tenant's request <prefix>.t.<tenant>.uploads, which its
// producers send before they first upload (they may write their bucket,
// not create it).
func (d *Dispatcher) Uploads(ctx context.Context, tenant string) (*queue.UploadsReply, error) {
	v, _ := d.uploads.LoadOrStore(tenant, &poolSetup{})
	p := v.(*poolSetup)
	bucket := d.names.UploadsBucket(tenant)
	if p.done.Load() {
		return &queue.UploadsReply{Bucket: bucket}, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.done.Load() {
		if _, err := queue.EnsureUploads(ctx, d.js, d.cfg.Queue, tenant, d.log); err != nil {
			return nil, err
		}
		p.done.Store(true)
	}
	return &queue.UploadsReply{Bucket: bucket}, nil
}
