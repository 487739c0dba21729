package artifact

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Expect is what a read checks besides the object's own digest: the
// digest and size a reference names.
type Expect struct {
	SHA256 string
	Size   *int64
}

// Reader streams an object's bytes, chunk by chunk, and checks them: a
// Read that reaches the end of bytes that differ from the object's digest
// (or from what was expected) fails with ErrChanged instead of io.EOF.
type Reader struct {
	info  *Info
	ctx   context.Context
	it    jetstream.MessagesContext
	h     hash.Hash
	cur   []byte
	stall time.Duration
	got   int   // chunks read
	n     int64 // bytes read
	err   error
}

// Open opens an object for reading. It fails with ErrNotFound when there
// is no such object, and with ErrChanged when its description already
// differs from want.
func (s *Store) Open(ctx context.Context, bucket, key string, want Expect) (*Reader, error) {
	info, err := s.Stat(ctx, bucket, key)
	if err != nil {
		return nil, err
	}
	if err := info.Check(want); err != nil {
		return nil, err
	}
	return s.open(ctx, info)
}

// Check says how the object differs from what want expects, wrapping
// ErrChanged, or returns nil.
func (i *Info) Check(want Expect) error {
	if want.SHA256 != "" && want.SHA256 != i.SHA256 {
		return fmt.Errorf("%s/%s: %w: its SHA-256 is %s, not %s", i.Bucket, i.Key, ErrChanged, i.SHA256, want.SHA256)
	}
	if want.Size != nil && *want.Size != i.Size {
		return fmt.Errorf("%s/%s: %w: it is %d bytes, not %d", i.Bucket, i.Key, ErrChanged, i.Size, *want.Size)
	}
	return nil
}

func (s *Store) open(ctx context.Context, info *Info) (*Reader, error) {
	r := &Reader{info: info, ctx: ctx, h: sha256.New(), stall: s.cfg.Stall}
	if info.chunks == 0 {
		return r, nil
	}
	it, err := s.chunks(ctx, info.Bucket, info.nuid)
	if err != nil {
		return nil, fmt.Errorf("read %s/%s: %w", info.Bucket, info.Key, err)
	}
	r.it = it
	return r, nil
}

// chunks follows the chunks of nuid in bucket from the first, through an
// ordered consumer that buffers a window of them.
func (s *Store) chunks(ctx context.Context, bucket, nuid string) (jetstream.MessagesContext, error) {
	cons, err := s.js.OrderedConsumer(ctx, stream(bucket), jetstream.OrderedConsumerConfig{
		FilterSubjects:    []string{chunkSubject(bucket, nuid)},
		InactiveThreshold: 30 * time.Second,
	})
	if err != nil {
		return nil, err
	}
	return cons.Messages(jetstream.PullMaxMessages(s.cfg.Window))
}

// Info describes the object being read.
func (r *Reader) Info() *Info { return r.info }

// Read implements io.Reader.
func (r *Reader) Read(p []byte) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	for len(r.cur) == 0 {
		if r.got == r.info.chunks {
			r.err = r.finish()
			return 0, r.err
		}
		ctx, cancel := context.WithTimeout(r.ctx, r.stall)
		m, err := r.it.Next(jetstream.NextContext(ctx))
		cancel()
		if err != nil {
			switch {
			case r.ctx.Err() != nil:
				err = r.ctx.Err()
			case ctx.Err() != nil:
				err = fmt.Errorf("%w: chunk %d of %d did not come in %s", ErrChanged, r.got+1, r.info.chunks, r.stall)
			}
			r.err = fmt.Errorf("read %s/%s: %w", r.info.Bucket, r.info.Key, err)
			return 0, r.err
		}
		r.cur = m.Data()
		r.got++
		r.n += int64(len(r.cur))
		r.h.Write(r.cur)
		if r.n > r.info.Size {
			r.err = fmt.Errorf("%s/%s: %w: more than its %d bytes", r.info.Bucket, r.info.Key, ErrChanged, r.info.Size)
			return 0, r.err
		}
	}
	n := copy(p, r.cur)
	r.cur = r.cur[n:]
	return n, nil
}

func (r *Reader) finish() error {
	if r.n != r.info.Size {
		return fmt.Errorf("%s/%s: %w: %d bytes, not %d", r.info.Bucket, r.info.Key, ErrChanged, r.n, r.info.Size)
	}
	if sum := hex.EncodeToString(r.h.Sum(nil)); sum != r.info.SHA256 {
		return fmt.Errorf("%s/%s: %w: its bytes hash to %s, not %s", r.info.Bucket, r.info.Key, ErrChanged, sum, r.info.SHA256)
	}
	return io.EOF
}

// Close stops reading.
func (r *Reader) Close() error {
	if r.it != nil {
		r.it.Stop()
	}
	if r.err == nil {
		r.err = errors.New("reader closed")
	}
	return nil
}

// FetchFile writes an object to path, whole and checked or not at all: it
// streams into a temporary file beside path, checks the digest, and only
// then renames it into place, with mode perm.
func (s *Store) FetchFile(ctx context.Context, bucket, key string, want Expect, path string, perm os.FileMode) (*Info, error) {
	r, err := s.Open(ctx, bucket, key, want)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".part-"+hex.EncodeToString(rnd[:]))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("fetch %s/%s: %w", bucket, key, err)
	}
	_, err = io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp, perm)
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return nil, fmt.Errorf("fetch %s/%s: %w", bucket, key, err)
	}
	return r.info, nil
}
