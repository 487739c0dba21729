// Package artifact keeps the fleet's files of any size in the NATS
// JetStream Object Store: outputs too large for a result or not text,
// inputs that producers upload and requests name by reference, and the
// whole log of every attempt.
//
// Buckets (contract v2, see queue's objects.go): one per pool,
// <prefix>-artifacts-<pool>, which that pool's workers write (outputs,
// logs) and nobody else; one per tenant, <prefix>-uploads-<tenant>, which
// that tenant's producers write and workers read. An object is stored in
// the object store's format, its chunks first, then one description (meta)
// message on $O.<bucket>.M.<base64 name> that makes it visible; an upload
// cut short (a worker SIGKILLed) leaves no object, and its chunks go with
// the bucket's TTL.
//
// Chunks have subjects of their own, named by the object's tenant:
//
//	$O.<bucket>.C.<tenant>.<id>.<n>    chunk n (from 0) of an object
//
// where <id> is derived from the bucket and the key (a letter and 32 hex
// digits of their SHA-256), and the description's nuid is
// "<tenant>.<id>.*", so that `nats object get` (which reads
// $O.<bucket>.C.<nuid>) reads them in order. This is what lets the NATS
// roles scope reading by tenant: a tenant's producers may direct-get
// $O.*.C.<tenant>.> and nothing else of any bucket, which gives them the
// bytes of their own outputs, logs and uploads, one chunk per request,
// and no description (a description's subject names the object by its
// base64 name, which a permission cannot scope). So a reader that knows
// an object's size and digest from its reference (a job's result names
// its outputs so) reads it without its description (OpenRef); a log is
// read chunk by chunk until its attempt has ended. Dispatchers, workers
// and operators read descriptions too (Stat, Open).
//
// Every put streams: a bounded window of chunks is in flight, whatever the
// size of the object, and its size and SHA-256 are computed on the way;
// a put first purges what an earlier put of the same name left. Every
// read checks the bytes against the digest, and a read through a
// reference also against the reference's digest and size.
//
// Keys (the tenant is the job's, in a pool's bucket):
//
//	outputs/<tenant>/<job_id>/<attempt>/<output name>   an output stored as an object
//	logs/<tenant>/<job_id>/<attempt>                    an attempt's log
//	<anything>                                          an upload (a tenant's uploads bucket)
package artifact

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// Errors.
var (
	// ErrNotFound: no object of that name.
	ErrNotFound = errors.New("object not found")
	// ErrChanged: the object's bytes differ from its digest or size, or
	// from the reference's.
	ErrChanged = errors.New("object differs from its digest")
	// ErrTooLarge: a put went over its limit.
	ErrTooLarge = errors.New("object over the limit")
)

// Defaults of Config.
const (
	// DefaultChunkSize is the size of one chunk message, as the object
	// store's own default.
	DefaultChunkSize = 128 << 10
	// DefaultWindow is how many chunks of one put are in flight at once.
	DefaultWindow = 16
	// DefaultStall bounds the wait for one chunk's acknowledgement.
	DefaultStall = 30 * time.Second
)

// Config configures a Store.
type Config struct {
	// Names gives the buckets' names (the subject prefix).
	Names queue.Names
	// ChunkSize of puts. Defaults to DefaultChunkSize (128 KiB).
	ChunkSize int
	// Window is how many chunks of a put are in flight. Defaults to
	// DefaultWindow (16): with the chunk size, what a put holds in memory.
	Window int
	// Stall bounds the wait for one chunk's acknowledgement. Defaults to
	// DefaultStall (30 seconds).
	Stall time.Duration
	// NoDescriptions is for a user that may not read objects'
	// descriptions, a tenant's producer under the NATS roles of
	// deploy/nats: outputs are read by their result's reference alone
	// (OpenOutput), logs by their chunks (OpenLog).
	NoDescriptions bool
}

// Store reads and writes the fleet's objects. It is safe for concurrent
// use.
type Store struct {
	js    jetstream.JetStream
	nc    *nats.Conn
	names queue.Names
	cfg   Config
}

// New returns a Store on js.
func New(js jetstream.JetStream, cfg Config) *Store {
	if cfg.Names.Prefix == "" {
		cfg.Names.Prefix = queue.DefaultPrefix
	}
	if cfg.ChunkSize <= 0 {
		cfg.ChunkSize = DefaultChunkSize
	}
	if cfg.Window <= 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.Stall <= 0 {
		cfg.Stall = DefaultStall
	}
	return &Store{js: js, nc: js.Conn(), names: cfg.Names, cfg: cfg}
}

// Artifacts is the bucket of outputs and logs of the default pool.
func (s *Store) Artifacts() string { return s.names.ArtifactsBucket(job.DefaultPool) }

// ArtifactsOf is the bucket of outputs and logs of a pool.
func (s *Store) ArtifactsOf(pool string) string { return s.names.ArtifactsBucket(pool) }

// Uploads is the bucket of inputs uploaded by the default tenant.
func (s *Store) Uploads() string { return s.names.UploadsBucket(job.DefaultTenant) }

// UploadsOf is the bucket of inputs uploaded by a tenant.
func (s *Store) UploadsOf(tenant string) string { return s.names.UploadsBucket(tenant) }

// OutputKey is the key of an output stored as an object, in its pool's
// bucket.
func OutputKey(tenant, jobID string, attempt int, name string) string {
	return "outputs/" + tenant + "/" + jobID + "/" + strconv.Itoa(attempt) + "/" + name
}

// LogKey is the key of an attempt's log, in its pool's bucket.
func LogKey(tenant, jobID string, attempt int) string {
	return "logs/" + tenant + "/" + jobID + "/" + strconv.Itoa(attempt)
}

// Info describes a stored object.
type Info struct {
	Bucket string
	Key    string
	Size   int64
	// SHA256 is the digest of the bytes, in lower-case hex.
	SHA256      string
	ContentType string
	chunks      int
	id          string // names its chunks (see chunkID)
}

// Artifact is i as a result's reference.
func (i *Info) Artifact() job.Artifact {
	return job.Artifact{Bucket: i.Bucket, Key: i.Key, Size: i.Size, SHA256: i.SHA256, ContentType: i.ContentType}
}

// InputRef is i as a request's reference.
func (i *Info) InputRef() job.InputRef {
	size := i.Size
	return job.InputRef{Bucket: i.Bucket, Key: i.Key, SHA256: i.SHA256, Size: &size}
}

func stream(bucket string) string { return "OBJ_" + bucket }
func metaSubject(bucket, key string) string {
	return "$O." + bucket + ".M." + base64.URLEncoding.EncodeToString([]byte(key))
}

// chunkID names the chunks of an object: its tenant, then a letter (L for
// a log, O for anything else) and 32 hex digits derived from its bucket
// and key.
func chunkID(tenant, bucket, key string) string {
	sum := sha256.Sum256([]byte(bucket + "\x00" + key))
	kind := "O"
	if strings.HasPrefix(key, "logs/") {
		kind = "L"
	}
	return tenant + "." + kind + hex.EncodeToString(sum[:16])
}

// chunkSubject is the subject of chunk n of the object whose chunks are
// named id.
func chunkSubject(bucket, id string, n int) string {
	return "$O." + bucket + ".C." + id + "." + strconv.Itoa(n)
}

// ChunkSubject is the subject of chunk n (from 0) of the object key of
// bucket, as the fleet stores it: what an outside client direct-gets
// ($JS.API.DIRECT.GET.OBJ_<bucket>.<subject>) to read an object without
// its description. The id is a letter (L for a log, O for anything else)
// and the first 32 hex digits of the SHA-256 of "<bucket>\x00<key>".
func (s *Store) ChunkSubject(bucket, key string, n int) (string, error) {
	tenant, err := s.owner(bucket, key)
	if err != nil {
		return "", err
	}
	return chunkSubject(bucket, chunkID(tenant, bucket, key), n), nil
}

// chunkFilter matches every chunk of an object: what its description
// names as its nuid, after $O.<bucket>.C.
func chunkFilter(bucket, id string) string { return "$O." + bucket + ".C." + id + ".*" }

// owner is the tenant an object belongs to: an uploads bucket's, or the
// one a key of a pool's bucket names (outputs/<tenant>/... or
// logs/<tenant>/...).
func (s *Store) owner(bucket, key string) (string, error) {
	pool, tenant, ok := s.names.BucketOwner(bucket)
	switch {
	case !ok:
		return "", fmt.Errorf("bucket %q is not one of the fleet's (%s, %s)", bucket,
			s.names.ArtifactsBucket("<pool>"), s.names.UploadsBucket("<tenant>"))
	case pool == "":
		return tenant, nil
	}
	parts := strings.SplitN(key, "/", 3)
	if len(parts) == 3 && (parts[0] == "outputs" || parts[0] == "logs") && job.ValidTenant(parts[1]) {
		return parts[1], nil
	}
	return "", fmt.Errorf("key %q of bucket %s: a pool's bucket holds outputs/<tenant>/... and logs/<tenant>/...", key, bucket)
}

// digestOf turns the object store's digest ("SHA-256=" and URL-safe
// base64) into lower-case hex.
func digestOf(d string) (string, error) {
	raw, err := jetstream.DecodeObjectDigest(d)
	if err != nil || len(raw) != sha256.Size {
		return "", fmt.Errorf("digest %q is not a SHA-256", d)
	}
	return hex.EncodeToString(raw), nil
}

// objectDigest is the object store's form of a SHA-256 sum.
func objectDigest(sum []byte) string {
	return "SHA-256=" + base64.URLEncoding.EncodeToString(sum)
}

// checkBucket refuses a bucket that is not one of the fleet's.
func (s *Store) checkBucket(bucket string) error {
	if _, _, ok := s.names.BucketOwner(bucket); !ok {
		return fmt.Errorf("bucket %q is not one of the fleet's (%s, %s)", bucket,
			s.names.ArtifactsBucket("<pool>"), s.names.UploadsBucket("<tenant>"))
	}
	return nil
}

// Stat reads an object's description: ErrNotFound when there is none (or
// it was deleted). It is one direct get of the meta message, answered by
// any replica.
func (s *Store) Stat(ctx context.Context, bucket, key string) (*Info, error) {
	if err := s.checkBucket(bucket); err != nil {
		return nil, err
	}
	if err := job.CheckObjectKey(key); err != nil {
		return nil, fmt.Errorf("object key: %w", err)
	}
	m, err := s.directLast(ctx, stream(bucket), metaSubject(bucket, key))
	if err != nil {
		return nil, fmt.Errorf("stat %s/%s: %w", bucket, key, err)
	}
	if m == nil {
		return nil, fmt.Errorf("%s/%s: %w", bucket, key, ErrNotFound)
	}
	var oi jetstream.ObjectInfo
	if err := json.Unmarshal(m.Data, &oi); err != nil {
		return nil, fmt.Errorf("stat %s/%s: unreadable description: %w", bucket, key, err)
	}
	if oi.Deleted {
		return nil, fmt.Errorf("%s/%s: %w", bucket, key, ErrNotFound)
	}
	id, ok := strings.CutSuffix(oi.NUID, ".*")
	if !ok {
		return nil, fmt.Errorf("stat %s/%s: its chunks (nuid %q) are not named as the fleet names them: store it with the fleet (fleetctl upload)", bucket, key, oi.NUID)
	}
	i := &Info{Bucket: bucket, Key: key, Size: int64(oi.Size), chunks: int(oi.Chunks), id: id}
	if oi.Headers != nil {
		i.ContentType = oi.Headers.Get("Content-Type")
	}
	if i.SHA256, err = digestOf(oi.Digest); err != nil {
		return nil, fmt.Errorf("stat %s/%s: %w", bucket, key, err)
	}
	return i, nil
}

// directLast reads the last message on subject in stream with one direct
// get (the object stores allow them), or nil when there is none. The
// subject is in the request's subject, so that the NATS roles can allow
// reading a bucket's descriptions and a tenant's chunks by subject.
func (s *Store) directLast(ctx context.Context, stream, subject string) (*nats.Msg, error) {
	var m *nats.Msg
	err := queue.Retry(ctx, func(ctx context.Context) (err error) {
		m, err = s.nc.RequestWithContext(ctx, "$JS.API.DIRECT.GET."+stream+"."+subject, nil)
		return err
	}, nil)
	if err != nil {
		return nil, err
	}
	switch m.Header.Get("Status") {
	case "":
		return m, nil
	case "404":
		return nil, nil
	default:
		return nil, fmt.Errorf("%s %s", m.Header.Get("Status"), m.Header.Get("Description"))
	}
}

// chunk reads chunk n of the object whose chunks are named id: nil when
// it is not there.
func (s *Store) chunk(ctx context.Context, bucket, id string, n int) ([]byte, error) {
	m, err := s.directLast(ctx, stream(bucket), chunkSubject(bucket, id, n))
	if err != nil {
		return nil, fmt.Errorf("chunk %d: %w", n, err)
	}
	if m == nil {
		return nil, nil
	}
	if m.Data == nil {
		return []byte{}, nil
	}
	return m.Data, nil
}

// purge removes the messages of subject from bucket's stream, the chunks
// of a put cut short. It needs the stream's purge permission; without it,
// the chunks stay, invisible, until the bucket's TTL drops them.
func (s *Store) purge(ctx context.Context, bucket, subject string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	req, _ := json.Marshal(map[string]string{"filter": subject})
	m, err := s.nc.RequestWithContext(ctx, "$JS.API.STREAM.PURGE."+stream(bucket), req)
	if err != nil {
		return fmt.Errorf("purge %s: %w", subject, err)
	}
	var resp struct {
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return fmt.Errorf("purge %s: %w", subject, err)
	}
	if resp.Error != nil {
		return fmt.Errorf("purge %s: %w", subject, resp.Error)
	}
	return nil
}
