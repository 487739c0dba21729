package artifact

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleet-dev/fleet/internal/queue"
	"github.com/fleet-dev/fleet/job"
)

// PutOptions are the options of a put.
type PutOptions struct {
	// ContentType is kept with the object, when known.
	ContentType string
	// MaxBytes refuses an object larger than this, with an error wrapping
	// ErrTooLarge; 0 means no limit.
	MaxBytes int64
}

// Put stores what r yields as the object key of bucket, replacing any
// object of that name, and returns its size and digest. It streams: a
// window of chunks is in flight, never the object. What an earlier put of
// the name left is purged first; the object appears only when its last
// chunk and then its description are stored. A put that fails or is cut
// short leaves no object, and its chunks are purged (or, if the process
// dies, dropped with the bucket's TTL).
func (s *Store) Put(ctx context.Context, bucket, key string, r io.Reader, o PutOptions) (*Info, error) {
	if err := job.CheckObjectKey(key); err != nil {
		return nil, fmt.Errorf("object key: %w", err)
	}
	tenant, err := s.owner(bucket, key)
	if err != nil {
		return nil, err
	}
	id := chunkID(tenant, bucket, key)
	if err := s.purge(ctx, bucket, chunkFilter(bucket, id)); err != nil {
		return nil, fmt.Errorf("put %s/%s: %w", bucket, key, err)
	}
	info, err := s.put(ctx, bucket, key, id, r, o)
	if err != nil {
		// The chunks in flight are stored or refused first: a purge that
		// overtook them would leave them.
		if perr := s.purge(ctx, bucket, chunkFilter(bucket, id)); perr != nil && !errors.Is(err, ErrTooLarge) {
			err = errors.Join(err, perr)
		}
		return nil, fmt.Errorf("put %s/%s: %w", bucket, key, err)
	}
	return info, nil
}

func (s *Store) put(ctx context.Context, bucket, key, id string, r io.Reader, o PutOptions) (*Info, error) {
	h := sha256.New()
	// A ring of chunk buffers: a buffer is filled again only once the
	// chunk it held is stored, since a publish may be sent again.
	bufs := make([][]byte, s.cfg.Window)
	futures := make([]jetstream.PubAckFuture, s.cfg.Window)
	wait := func(f jetstream.PubAckFuture) error {
		stall := time.NewTimer(s.cfg.Stall)
		defer stall.Stop()
		select {
		case <-f.Ok():
			return nil
		case err := <-f.Err():
			return fmt.Errorf("store chunk: %w", err)
		case <-stall.C:
			return fmt.Errorf("store chunk: no answer in %s", s.cfg.Stall)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	defer func() {
		for _, f := range futures {
			if f != nil {
				_ = wait(f)
			}
		}
	}()
	var size int64
	chunks := 0
	for {
		slot := chunks % s.cfg.Window
		if f := futures[slot]; f != nil {
			if err := wait(f); err != nil {
				return nil, err
			}
			futures[slot] = nil
		}
		if bufs[slot] == nil {
			bufs[slot] = make([]byte, s.cfg.ChunkSize)
		}
		n, rerr := io.ReadFull(r, bufs[slot])
		if n > 0 {
			size += int64(n)
			if o.MaxBytes > 0 && size > o.MaxBytes {
				return nil, fmt.Errorf("%w of %d bytes", ErrTooLarge, o.MaxBytes)
			}
			h.Write(bufs[slot][:n])
			// No retries by the client: a chunk sent again after the next
			// one would be stored out of order (`nats object get` reads
			// them in the stream's order). A failed put fails whole.
			f, err := s.js.PublishMsgAsync(&nats.Msg{Subject: chunkSubject(bucket, id, chunks), Data: bufs[slot][:n]},
				jetstream.WithRetryAttempts(0))
			if err != nil {
				return nil, fmt.Errorf("store chunk: %w", err)
			}
			futures[slot] = f
			chunks++
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			return nil, fmt.Errorf("read: %w", rerr)
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
	for i, f := range futures {
		if f != nil {
			futures[i] = nil
			if err := wait(f); err != nil {
				return nil, err
			}
		}
	}
	sum := h.Sum(nil)
	info := &Info{Bucket: bucket, Key: key, Size: size, SHA256: hex.EncodeToString(sum), ContentType: o.ContentType,
		chunks: chunks, id: id}
	if err := s.publishMeta(ctx, info, newNUID()); err != nil {
		return nil, err
	}
	return info, nil
}

// publishMeta stores an object's description, which makes it visible and
// replaces the one before (a rollup on its subject). id is its message
// id: one per put, so that a description sent again (its answer lost) is
// a duplicate.
func (s *Store) publishMeta(ctx context.Context, info *Info, id string) error {
	oi := jetstream.ObjectInfo{
		ObjectMeta: jetstream.ObjectMeta{Name: info.Key,
			Opts: &jetstream.ObjectMetaOptions{ChunkSize: uint32(s.cfg.ChunkSize)}},
		Bucket: info.Bucket, NUID: info.id + ".*", Size: uint64(info.Size), Chunks: uint32(info.chunks),
		Digest: objectDigest(mustHex(info.SHA256)),
	}
	if info.ContentType != "" {
		oi.Headers = nats.Header{"Content-Type": []string{info.ContentType}}
	}
	data, err := json.Marshal(oi)
	if err != nil {
		return fmt.Errorf("encode description: %w", err)
	}
	m := nats.NewMsg(metaSubject(info.Bucket, info.Key))
	m.Data = data
	m.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	m.Header.Set(queue.HeaderMsgID, id)
	if _, err := queue.Publish(ctx, s.js, m); err != nil {
		return fmt.Errorf("store description: %w", err)
	}
	return nil
}

func mustHex(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(fmt.Sprintf("artifact: %q is not hex", s))
	}
	return b
}

// newNUID is a random id of 22 letters and digits, as the object store's
// own: it names one put's description, so that one sent again is a
// duplicate.
func newNUID() string {
	const digits = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	var b [22]byte
	_, _ = rand.Read(b[:])
	for i := range b {
		b[i] = digits[int(b[i])%len(digits)]
	}
	return string(b[:])
}
