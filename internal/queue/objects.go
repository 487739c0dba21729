package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/job"
)

// The object store buckets (contract v2): one per pool for what its
// workers store, one per tenant for what its producers upload, so that
// the NATS roles can name each by its owner. A pool's workers write only
// their pool's bucket, <prefix>-artifacts-<pool> (outputs stored as
// objects and the attempts' logs, keyed by the job's tenant); a tenant's
// producers write only their tenant's, <prefix>-uploads-<tenant> (inputs
// by reference). Neither can write, overwrite or purge an object of
// another pool or tenant. Reads are scoped by tenant through the chunks'
// subjects (see package artifact).
//
// A pool's bucket is made with its stream (EnsurePoolStream), a tenant's
// when its producers first ask for it (the request <prefix>.t.<tenant>.uploads,
// answered by a dispatcher with EnsureUploads); Setup makes those of the
// default pool and the default tenant.

// ArtifactsBucket holds a pool's outputs stored as objects and its
// attempts' logs (stream OBJ_<prefix>-artifacts-<pool>).
func (n Names) ArtifactsBucket(pool string) string { return n.prefix() + "-artifacts-" + pool }

// UploadsBucket holds the inputs a tenant's producers upload for their
// requests (stream OBJ_<prefix>-uploads-<tenant>).
func (n Names) UploadsBucket(tenant string) string { return n.prefix() + "-uploads-" + tenant }

// BucketOwner reads a bucket's name: the pool of an artifacts bucket, or
// the tenant of an uploads bucket.
func (n Names) BucketOwner(bucket string) (pool, tenant string, ok bool) {
	if p, found := strings.CutPrefix(bucket, n.prefix()+"-artifacts-"); found && job.ValidPool(p) {
		return p, "", true
	}
	if t, found := strings.CutPrefix(bucket, n.prefix()+"-uploads-"); found && job.ValidTenant(t) {
		return "", t, true
	}
	return "", "", false
}

// UploadsRequest is where a tenant's producers ask a dispatcher for their
// uploads bucket, made if need be; the answer is an UploadsReply.
func (n Names) UploadsRequest(tenant string) string { return n.prefix() + ".t." + tenant + ".uploads" }

// AllUploadsRequests matches every tenant's UploadsRequest.
func (n Names) AllUploadsRequests() string { return n.prefix() + ".t.*.uploads" }

// UploadsReply answers an UploadsRequest.
type UploadsReply struct {
	// Bucket is the tenant's uploads bucket.
	Bucket string `json:"bucket"`
}

func (c Config) objectStore(bucket, desc string) jetstream.ObjectStoreConfig {
	c = c.WithDefaults()
	return jetstream.ObjectStoreConfig{Bucket: bucket, Description: desc,
		TTL: c.Retention, Storage: c.storage(), Replicas: c.Replicas}
}

// ArtifactsStore is the configuration of a pool's bucket: replicated as
// the streams are, and kept for the job retention, so that a job's
// artifacts go about when its record does.
func (c Config) ArtifactsStore(pool string) jetstream.ObjectStoreConfig {
	return c.objectStore(c.ArtifactsBucket(pool), "Outputs stored as objects, and every attempt's log, of pool "+pool)
}

// UploadsStore is the configuration of a tenant's uploads bucket.
func (c Config) UploadsStore(tenant string) jetstream.ObjectStoreConfig {
	return c.objectStore(c.UploadsBucket(tenant), "Inputs uploaded by tenant "+tenant+", named by its requests' input_refs")
}

// ObjectStores returns the configurations of the buckets Setup makes:
// those of the default pool and of the default tenant (an open fleet's
// only tenant).
func (c Config) ObjectStores() []jetstream.ObjectStoreConfig {
	return []jetstream.ObjectStoreConfig{c.ArtifactsStore(job.DefaultPool), c.UploadsStore(job.DefaultTenant)}
}

// EnsureObjectStore creates or updates a bucket, waiting as Setup does.
func EnsureObjectStore(ctx context.Context, js jetstream.JetStream, oc jetstream.ObjectStoreConfig, log *slog.Logger) error {
	if err := retry(ctx, js, log, "bucket "+oc.Bucket, func(ctx context.Context) error {
		// Updated only when it exists with another configuration (see
		// ensureStream).
		_, err := js.CreateObjectStore(ctx, oc)
		if errors.Is(err, jetstream.ErrBucketExists) {
			_, err = js.UpdateObjectStore(ctx, oc)
		}
		return err
	}); err != nil {
		return fmt.Errorf("create bucket %s: %w", oc.Bucket, err)
	}
	return nil
}

// EnsureUploads creates or updates a tenant's uploads bucket and returns
// its name. Dispatchers call it when a tenant's producers ask.
func EnsureUploads(ctx context.Context, js jetstream.JetStream, c Config, tenant string, log *slog.Logger) (string, error) {
	if !job.ValidTenant(tenant) {
		return "", fmt.Errorf("tenant %q must be 1 to 64 characters of [A-Za-z0-9_-]", tenant)
	}
	oc := c.UploadsStore(tenant)
	return oc.Bucket, EnsureObjectStore(ctx, js, oc, log)
}
