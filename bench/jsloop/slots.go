package main

// The slot accounting: free slots in the process, and a lease per job in
// Redis, batched as the fleet's ledger batches them.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// slots counts the jobs the worker may run at once.
type slots struct {
	mu   sync.Mutex
	free int
	wake chan struct{} // closed and replaced whenever slots are released
}

func newSlots(n int) *slots { return &slots{free: n, wake: make(chan struct{})} }

// acquireAll waits until a slot is free, then takes every free slot, at
// most max.
func (s *slots) acquireAll(ctx context.Context, max int) (int, error) {
	for {
		s.mu.Lock()
		if s.free > 0 {
			n := min(s.free, max)
			s.free -= n
			s.mu.Unlock()
			return n, nil
		}
		wake := s.wake
		s.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// tryAcquire takes up to max free slots without waiting.
func (s *slots) tryAcquire(max int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := min(s.free, max)
	s.free -= n
	return n
}

func (s *slots) release(n int) {
	if n <= 0 {
		return
	}
	s.mu.Lock()
	s.free += n
	close(s.wake)
	s.wake = make(chan struct{})
	s.mu.Unlock()
}

var errNoSlot = errors.New("no slot left in Redis")

// leaseScript applies a batch of releases and reservations, in order, to a
// worker's slots hash: the fleet's script (internal/capacity/scripts.go)
// with slots alone, no CPU, memory or GPUs.
//
//	KEYS[1] -> the worker's slots hash: slots, used, l:<job>/<attempt> -> handle
//	ARGV[1] -> TTL of the hash, in milliseconds
//	ARGV[2..] -> "-", field             release
//	             "+", field, handle     reserve
//	Output: one string per reservation: "ok", "dup", "unknown" (no slot
//	count yet) or "no:slots".
var leaseScript = redis.NewScript(`
local key = KEYS[1]
local out = {}
local slots = tonumber(redis.call('HGET', key, 'slots'))
local i = 2
while i <= #ARGV do
  local op, f = ARGV[i], ARGV[i+1]
  if op == '-' then
    if redis.call('HDEL', key, f) == 1 then
      redis.call('HINCRBY', key, 'used', -1)
    end
    i = i + 2
  else
    local h = ARGV[i+2]
    i = i + 3
    if redis.call('HEXISTS', key, f) == 1 then
      table.insert(out, 'dup')
    elseif not slots then
      table.insert(out, 'unknown')
    elseif tonumber(redis.call('HGET', key, 'used') or 0) + 1 > slots then
      table.insert(out, 'no:slots')
    else
      redis.call('HSET', key, f, h)
      redis.call('HINCRBY', key, 'used', 1)
      table.insert(out, 'ok')
    end
  end
end
redis.call('PEXPIRE', key, ARGV[1])
return out
`)

// ledger batches lease operations as the fleet's ledger does: they are
// queued, and one goroutine sends everything queued in one script call,
// then what queued meanwhile, and so on.
type ledger struct {
	rdb   *redis.Client
	mu    sync.Mutex
	ops   []leaseOp
	wake  chan struct{}
	calls atomic.Int64
}

type leaseOp struct {
	release       bool
	field, handle string
	reply         chan error // reservations only
}

func (l *ledger) reserve(ctx context.Context, field, handle string) error {
	reply := make(chan error, 1)
	l.queue(leaseOp{field: field, handle: handle, reply: reply})
	select {
	case err := <-reply:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// release does not wait for Redis.
func (l *ledger) release(field string) { l.queue(leaseOp{release: true, field: field}) }

func (l *ledger) queue(o leaseOp) {
	l.mu.Lock()
	l.ops = append(l.ops, o)
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

func (l *ledger) loop(ctx context.Context) {
	for {
		select {
		case <-l.wake:
			l.flush(ctx)
		case <-ctx.Done():
			return
		}
	}
}

func (l *ledger) flush(ctx context.Context) {
	l.mu.Lock()
	ops := l.ops
	l.ops = nil
	l.mu.Unlock()
	if len(ops) == 0 {
		return
	}
	args := []any{leaseTTL.Milliseconds()}
	var reserves []leaseOp
	for _, o := range ops {
		if o.release {
			args = append(args, "-", o.field)
		} else {
			args = append(args, "+", o.field, o.handle)
			reserves = append(reserves, o)
		}
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	replies, err := leaseScript.Run(cctx, l.rdb, []string{slotsKey}, args...).StringSlice()
	cancel()
	l.calls.Add(1)
	for i, o := range reserves {
		switch {
		case err != nil:
			o.reply <- fmt.Errorf("leases: %w", err)
		case i >= len(replies):
			o.reply <- errors.New("leases: too few replies")
		case replies[i] == "no:slots":
			o.reply <- errNoSlot
		case replies[i] == "ok" || replies[i] == "dup":
			o.reply <- nil
		default:
			o.reply <- fmt.Errorf("leases: %s", replies[i])
		}
	}
}
