package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/fleet-dev/fleet/internal/artifact"
	"github.com/fleet-dev/fleet/job"
)

// inputCheck refuses at admission a request whose inputs by reference
// name objects that are not in the fleet's object store, or that differ
// from their reference: one direct get per input, for the requests that
// have some. A worker checks again, against the bytes, before the job
// runs. Then the next admission, if any, decides.
type inputCheck struct {
	s     *artifact.Store
	limit int64
	next  Admission
}

func (c inputCheck) Admit(ctx context.Context, r *job.Request) (string, error) {
	if len(r.InputRefs) > 0 {
		if err := c.check(ctx, r); err != nil {
			return "", err
		}
	}
	if c.next == nil {
		return "", nil
	}
	return c.next.Admit(ctx, r)
}

func (c inputCheck) check(ctx context.Context, r *job.Request) error {
	names := make([]string, 0, len(r.InputRefs))
	for name := range r.InputRefs {
		names = append(names, name)
	}
	sort.Strings(names)
	var total int64
	for _, name := range names {
		ref := r.InputRefs[name]
		bucket := ref.Bucket
		switch bucket {
		case "":
			bucket = c.s.Uploads()
		case c.s.Uploads(), c.s.Artifacts():
		default:
			return fmt.Errorf("input_refs[%s].bucket: %q is not one of the fleet's buckets (%s, %s)", name, bucket, c.s.Uploads(), c.s.Artifacts())
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
