package capacity

import "github.com/redis/go-redis/v9"

// Each script touches one key, its KEYS[1]: a worker's slots hash, which
// on a Redis Cluster lives in the slot of the worker's hash tag. The hash
// holds:
//
//	slots, cpu, mem, gpu                 the worker's totals; -1 when unknown
//	used, cpu_used, mem_used, gpu_used   what its leases hold together
//	l:<job_id>/<attempt>                 one lease: "<cpu_milli> <memory_bytes> <gpus> <handle>"
//
// A lease's handle is the ack subject of the job message its attempt
// runs, "-" when there is none: when the worker dies, the reaper naks the
// message through it, and JetStream delivers the job again at once.
//
// It expires with the worker's heartbeat, so a dead worker's leases vanish
// by themselves.

// leaseScript applies a batch of releases and reservations, in order, so
// that a slot released by one attempt can be taken by the next in the same
// round trip.
//
//	KEYS[1] -> fleet:{w:<worker>}:slots
//	ARGV[1] -> TTL of the hash, in milliseconds
//	ARGV[2..] -> operations, one after another:
//	             "-", field                      release the lease named field
//	             "+", field, cpu, mem, gpu, handle   reserve a lease
//	Output: one string per reservation, in order:
//	             "ok"       reserved
//	             "dup"      the lease was already held
//	             "unknown"  the hash has no totals yet (no heartbeat written)
//	             "no:slots", "no:cpu", "no:memory", "no:gpu"
//	                        refused: the worker has not that much left
var leaseScript = redis.NewScript(`
local key = KEYS[1]
local out = {}
local t = redis.call('HMGET', key, 'slots', 'cpu', 'mem', 'gpu')
local i = 2
while i <= #ARGV do
  local op, f = ARGV[i], ARGV[i+1]
  if op == '-' then
    local v = redis.call('HGET', key, f)
    if v then
      local c, m, g = string.match(v, '(%d+) (%d+) (%d+)')
      redis.call('HINCRBY', key, 'used', -1) -- (0 - x, not -x: Lua writes -0 as "-0", which Redis refuses)
      redis.call('HINCRBY', key, 'cpu_used', 0 - tonumber(c))
      redis.call('HINCRBY', key, 'mem_used', 0 - tonumber(m))
      redis.call('HINCRBY', key, 'gpu_used', 0 - tonumber(g))
      redis.call('HDEL', key, f)
    end
    i = i + 2
  else
    local c, m, g, h = tonumber(ARGV[i+2]), tonumber(ARGV[i+3]), tonumber(ARGV[i+4]), ARGV[i+5]
    i = i + 6
    if redis.call('HEXISTS', key, f) == 1 then
      table.insert(out, 'dup')
    elseif not t[1] then
      table.insert(out, 'unknown')
    else
      local u = redis.call('HMGET', key, 'used', 'cpu_used', 'mem_used', 'gpu_used')
      local used, cu, mu, gu = tonumber(u[1] or 0), tonumber(u[2] or 0), tonumber(u[3] or 0), tonumber(u[4] or 0)
      local slots, cpu, mem, gpu = tonumber(t[1]), tonumber(t[2]), tonumber(t[3]), tonumber(t[4])
      if used + 1 > slots then
        table.insert(out, 'no:slots')
      elseif cpu >= 0 and cu + c > cpu then
        table.insert(out, 'no:cpu')
      elseif mem >= 0 and mu + m > mem then
        table.insert(out, 'no:memory')
      elseif g > 0 and gu + g > gpu then
        table.insert(out, 'no:gpu')
      else
        redis.call('HSET', key, f, c .. ' ' .. m .. ' ' .. g .. ' ' .. h)
        redis.call('HINCRBY', key, 'used', 1)
        redis.call('HINCRBY', key, 'cpu_used', c)
        redis.call('HINCRBY', key, 'mem_used', m)
        redis.call('HINCRBY', key, 'gpu_used', g)
        table.insert(out, 'ok')
      end
    end
  end
end
redis.call('PEXPIRE', key, ARGV[1])
return out
`)

// syncScript replaces a worker's totals and leases with what the worker
// knows it runs. Every heartbeat sends it, so Redis never drifts from the
// truth for longer than one interval, and a worker reconciles its leases
// by itself when Redis comes back after an outage.
//
//	KEYS[1] -> fleet:{w:<worker>}:slots
//	ARGV[1] -> TTL of the hash, in milliseconds
//	ARGV[2..5] -> totals: slots, cpu, mem, gpu (-1 when unknown)
//	ARGV[6..] -> leases, five values each: field, cpu, mem, gpu, handle
//	Output: the number of leases written
var syncScript = redis.NewScript(`
local key = KEYS[1]
redis.call('DEL', key)
local used, cu, mu, gu = 0, 0, 0, 0
local i = 6
while i <= #ARGV do
  local c, m, g = tonumber(ARGV[i+1]), tonumber(ARGV[i+2]), tonumber(ARGV[i+3])
  redis.call('HSET', key, ARGV[i], c .. ' ' .. m .. ' ' .. g .. ' ' .. ARGV[i+4])
  used, cu, mu, gu = used + 1, cu + c, mu + m, gu + g
  i = i + 5
end
redis.call('HSET', key, 'slots', ARGV[2], 'cpu', ARGV[3], 'mem', ARGV[4], 'gpu', ARGV[5],
  'used', used, 'cpu_used', cu, 'mem_used', mu, 'gpu_used', gu)
redis.call('PEXPIRE', key, ARGV[1])
return used
`)
