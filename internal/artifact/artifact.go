// Package artifact keeps the fleet's files of any size in the NATS
// JetStream Object Store: outputs too large for a result or not text,
// inputs that producers upload and requests name by reference, and the
// whole log of every attempt.
//
// Two buckets, set up by the dispatchers with the streams (see
// queue.Config.ObjectStores): <prefix>-artifacts, which workers write
// (outputs, logs) and producers read; <prefix>-uploads, which producers
// write and workers read. Objects are stored in the object store's own
// format (chunks on $O.<bucket>.C.<nuid>, then one meta message on
// $O.<bucket>.M.<base64 name>), so `nats object get` reads them too; an
// object is visible only once its meta message is stored, after its last
// chunk, so an upload cut short (a worker SIGKILLed) leaves no partial
// object: its chunks go with the bucket's TTL.
//
// Every put streams: a bounded window of chunks is in flight, whatever the
// size of the object, and its size and SHA-256 are computed on the way.
// Every read checks the bytes against the digest, and a read through a
// reference also against the reference's digest and size.
//
// Keys:
//
//	outputs/<job_id>/<attempt>/<output name>   an output stored as an object
//	logs/<job_id>/<attempt>                    an attempt's log
//	<anything>                                 an upload (uploads bucket)
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

// Artifacts is the bucket of outputs and logs.
func (s *Store) Artifacts() string { return s.names.ArtifactsBucket() }

// Uploads is the bucket of inputs uploaded by producers.
func (s *Store) Uploads() string { return s.names.UploadsBucket() }

// OutputKey is the key of an output stored as an object.
func OutputKey(jobID string, attempt int, name string) string {
	return "outputs/" + jobID + "/" + strconv.Itoa(attempt) + "/" + name
}

// LogKey is the key of an attempt's log.
func LogKey(jobID string, attempt int) string {
	return "logs/" + jobID + "/" + strconv.Itoa(attempt)
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
	nuid        string
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

func stream(bucket string) string             { return "OBJ_" + bucket }
func chunkSubject(bucket, nuid string) string { return "$O." + bucket + ".C." + nuid }
func metaSubject(bucket, key string) string {
	return "$O." + bucket + ".M." + base64.URLEncoding.EncodeToString([]byte(key))
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
	if bucket != s.Artifacts() && bucket != s.Uploads() {
		return fmt.Errorf("bucket %q is not one of the fleet's (%s, %s)", bucket, s.Artifacts(), s.Uploads())
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
	i := &Info{Bucket: bucket, Key: key, Size: int64(oi.Size), chunks: int(oi.Chunks), nuid: oi.NUID}
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
// reading a bucket's descriptions and chunks one bucket at a time.
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
