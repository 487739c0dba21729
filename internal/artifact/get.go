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

	"github.com/fleet-dev/fleet/job"
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
	info *Info
	f    *fetcher
	h    hash.Hash
	cur  []byte
	n    int64 // bytes read
	err  error
}

// Open opens an object for reading, through its description. It fails
// with ErrNotFound when there is no such object, and with ErrChanged when
// its description already differs from want.
func (s *Store) Open(ctx context.Context, bucket, key string, want Expect) (*Reader, error) {
	info, err := s.Stat(ctx, bucket, key)
	if err != nil {
		return nil, err
	}
	if err := info.Check(want); err != nil {
		return nil, err
	}
	return s.open(ctx, info), nil
}

// OpenRef opens an object for reading without its description, which a
// tenant's producers may not read: its size and digest are the
// reference's (a result's artifact), its chunks are read until they hold
// size bytes. ErrNotFound: its first chunk is not there (it expired, or
// was never stored); ErrChanged: its bytes differ from the reference.
func (s *Store) OpenRef(ctx context.Context, bucket, key string, size int64, sha string) (*Reader, error) {
	if err := job.CheckObjectKey(key); err != nil {
		return nil, fmt.Errorf("object key: %w", err)
	}
	tenant, err := s.owner(bucket, key)
	if err != nil {
		return nil, err
	}
	info := &Info{Bucket: bucket, Key: key, Size: size, SHA256: sha, chunks: -1, id: chunkID(tenant, bucket, key)}
	r := s.open(ctx, info)
	if size > 0 {
		// The first chunk says whether the object is there at all.
		c, err := r.f.next()
		switch {
		case err != nil:
			r.Close()
			return nil, fmt.Errorf("read %s/%s: %w", bucket, key, err)
		case c == nil:
			r.Close()
			return nil, fmt.Errorf("%s/%s: %w", bucket, key, ErrNotFound)
		}
		r.take(c)
	}
	return r, nil
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

func (s *Store) open(ctx context.Context, info *Info) *Reader {
	return &Reader{info: info, h: sha256.New(), f: s.fetch(ctx, info.Bucket, info.id, info.chunks, s.cfg.Window)}
}

// Info describes the object being read.
func (r *Reader) Info() *Info { return r.info }

func (r *Reader) take(c []byte) {
	r.cur = c
	r.n += int64(len(c))
	r.h.Write(c)
}

// Read implements io.Reader.
func (r *Reader) Read(p []byte) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	for len(r.cur) == 0 {
		if r.n > r.info.Size {
			r.err = fmt.Errorf("%s/%s: %w: more than its %d bytes", r.info.Bucket, r.info.Key, ErrChanged, r.info.Size)
			return 0, r.err
		}
		if r.n == r.info.Size && (r.info.chunks < 0 || r.f.asked >= r.info.chunks) {
			r.err = r.finish()
			return 0, r.err
		}
		c, err := r.f.next()
		switch {
		case err != nil:
			r.err = fmt.Errorf("read %s/%s: %w", r.info.Bucket, r.info.Key, err)
			return 0, r.err
		case c == nil:
			r.err = fmt.Errorf("%s/%s: %w: chunk %d is missing (%d of its %d bytes read)", r.info.Bucket, r.info.Key,
				ErrChanged, r.f.asked, r.n, r.info.Size)
			return 0, r.err
		}
		r.take(c)
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
	r.f.stop()
	if r.err == nil {
		r.err = errors.New("reader closed")
	}
	return nil
}

// fetcher reads an object's chunks in order, one direct get each, with a
// window of them asked for ahead of the one being read.
type fetcher struct {
	s       *Store
	ctx     context.Context
	cancel  context.CancelFunc
	bucket  string
	id      string
	limit   int // chunks there are; -1 when not known
	window  int
	asked   int // chunks handed out by next
	sent    int // chunks asked for
	pending []chan fetched
}

type fetched struct {
	data []byte
	err  error
}

func (s *Store) fetch(ctx context.Context, bucket, id string, limit, window int) *fetcher {
	ctx, cancel := context.WithCancel(ctx)
	return &fetcher{s: s, ctx: ctx, cancel: cancel, bucket: bucket, id: id, limit: limit, window: max(window, 1)}
}

// next returns the next chunk, or nil when it is not there.
func (f *fetcher) next() ([]byte, error) {
	for len(f.pending) < f.window && (f.limit < 0 || f.sent < f.limit) {
		ch := make(chan fetched, 1)
		n := f.sent
		go func() {
			data, err := f.s.chunk(f.ctx, f.bucket, f.id, n)
			ch <- fetched{data, err}
		}()
		f.pending = append(f.pending, ch)
		f.sent++
	}
	if len(f.pending) == 0 {
		return nil, nil
	}
	var got fetched
	select {
	case got = <-f.pending[0]:
	case <-f.ctx.Done():
		return nil, f.ctx.Err()
	}
	f.pending = f.pending[1:]
	if got.data == nil || got.err != nil {
		// Not there (yet): the ones asked for after it are not wanted,
		// and the next call asks for it again.
		f.pending, f.sent = nil, f.asked
		return nil, got.err
	}
	f.asked++
	return got.data, nil
}

func (f *fetcher) stop() { f.cancel() }

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
