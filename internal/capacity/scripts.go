package capacity

import "github.com/redis/go-redis/v9"

// Every script works on the keys of one pool, which share a slot on a
// Redis Cluster (see Store). A worker's slots hash holds:
//
//	slots, cpu, mem, gpu                 the worker's totals; -1 when unknown
//	used, cpu_used, mem_used, gpu_used   what its leases hold together
//	l:<job_id>/<attempt>                 one lease: "<cpu_milli> <memory_bytes> <gpus> <handle>"
//	l:<tenant>/<job_id>/<attempt>        another tenant's than the default's
//
// and its tenants hash what those leases hold by tenant: n:<tenant> (slots),
// c:<tenant>, m:<tenant>, g:<tenant>. The pool's usage hash holds, by tenant,
// "<slot-milliseconds> <at, unix ms>": the tenant's running slots
// integrated over time, decayed with the pool's half-life (a slot held for
// one half-life, then released, counts half as much one half-life later).
//
// A lease's handle is the ack subject of the job message its attempt
// runs, "-" when there is none: when the worker dies, the reaper naks the
// message through it, and JetStream delivers the job again at once.
//
// The worker's hashes expire with its heartbeat, so a dead worker's leases
// vanish by themselves, and with them what its tenants' quotas count.
//
// Both scripts take, after the worker's own keys, the slots and tenants
// hashes of the pool's other workers ("peers", as the caller knows them:
// each answer tells it the pool's workers): a tenant's quota is what its
// leases hold on every worker of the pool together. A batch that checks a
// quota is applied only if the caller named exactly the pool's workers;
// otherwise the answer is the list, and the caller sends it again.

// leaseScript applies a batch of releases and reservations, in order, so
// that a slot released by one attempt can be taken by the next in the same
// round trip, and reports what the tenants of the batch hold on the other
// workers of the pool and their usage.
//
//	KEYS[1] -> fleet:{p:<pool>}:w:<worker>:slots
//	KEYS[2] -> fleet:{p:<pool>}:w:<worker>:tenants
//	KEYS[3] -> fleet:{p:<pool>}:workers
//	KEYS[4] -> fleet:{p:<pool>}:usage
//	KEYS[5..] -> each peer's slots hash, then its tenants hash
//	ARGV[1] -> TTL of the worker's hashes, in milliseconds
//	ARGV[2] -> now, unix milliseconds
//	ARGV[3] -> the half-life of usage, in milliseconds
//	ARGV[4] -> "1": the peers must be exactly the pool's other workers
//	ARGV[5] -> the worker's id
//	ARGV[6] -> the number of peers, n; ARGV[7..6+n] their ids
//	ARGV[7+n..] -> operations, one after another:
//	             "-", field, tenant, accrued        release the lease named field; add
//	                                                 accrued slot-ms to the tenant's usage
//	             "+", field, tenant, cpu, mem, gpu, handle, qslots, qcpu, qmem, qgpu, maxrun
//	                                                 reserve a lease, within the tenant's quota
//	                                                 (-1: none) and the pool's bound (0: none)
//	Output: "peers", then the pool's other workers, when ARGV[4] is "1" and
//	the peers were not them (nothing was applied); else "ok", then one
//	string per reservation, in order:
//	             "ok"       reserved
//	             "dup"      the lease was already held
//	             "unknown"  the hash has no totals yet (no heartbeat written)
//	             "no:slots", "no:cpu", "no:memory", "no:gpu"
//	                        refused: the worker has not that much left
//	             "no:quota:slots", "no:quota:cpu", "no:quota:memory", "no:quota:gpu"
//	                        refused: the tenant's quota in the pool is full
//	             "no:max_running"
//	                        refused: the pool runs its bound of attempts
//	then "|", then for each tenant of the batch six strings: the tenant,
//	what the peers hold of it (slots, cpu, memory, gpus), and its usage now.
var leaseScript = redis.NewScript(`
local slots, tenants, workers, usage = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now, hl, self = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[5]
local np = tonumber(ARGV[6])
if ARGV[4] == '1' then
  local known, n, same = {}, 0, true
  for j = 1, np do known[ARGV[6+j]] = true end
  local members = redis.call('ZRANGE', workers, 0, -1)
  local out = {'peers'}
  for _, m in ipairs(members) do
    if m ~= self then
      n = n + 1
      table.insert(out, m)
      if not known[m] then same = false end
    end
  end
  if not same or n ~= np then return out end
end
local function num(v) return tonumber(v or 0) or 0 end
local function others(t)
  local n, c, m, g = 0, 0, 0, 0
  for j = 1, np do
    local v = redis.call('HMGET', KEYS[4+2*j], 'n:'..t, 'c:'..t, 'm:'..t, 'g:'..t)
    n, c, m, g = n + num(v[1]), c + num(v[2]), m + num(v[3]), g + num(v[4])
  end
  return n, c, m, g
end
local function peersUsed()
  local u = 0
  for j = 1, np do u = u + num(redis.call('HGET', KEYS[3+2*j], 'used')) end
  return u
end
-- What the batch changes is kept here and written once at its end: the
-- worker's totals used, each tenant's holding (read when a quota needs
-- it, else only added to), the lease fields set and deleted, and the
-- usage each tenant accrued. Each operation sees the ones before it.
local u = redis.call('HMGET', slots, 'used', 'cpu_used', 'mem_used', 'gpu_used')
local used, cu, mu, gu = num(u[1]), num(u[2]), num(u[3]), num(u[4])
local moved = false
local held, order, touched = {}, {}, {}
local function touch(t)
  if not touched[t] then touched[t] = true; table.insert(order, t); held[t] = {0, 0, 0, 0} end
end
local function hold(t, sign, c, m, g)
  local h = held[t]
  h[1], h[2], h[3], h[4] = h[1] + sign, h[2] + sign * c, h[3] + sign * m, h[4] + sign * g
end
local mine = {}
local function mineOf(t)
  if not mine[t] then
    local v = redis.call('HMGET', tenants, 'n:'..t, 'c:'..t, 'm:'..t, 'g:'..t)
    mine[t] = {num(v[1]), num(v[2]), num(v[3]), num(v[4])}
  end
  local h, b = held[t], mine[t]
  return b[1] + h[1], b[2] + h[2], b[3] + h[3], b[4] + h[4]
end
local set, gone = {}, {}
local function leaseOf(f)
  if set[f] then return set[f] end
  if gone[f] then return nil end
  return redis.call('HGET', slots, f)
end
local accrued = {}
local out = {'ok'}
local tot = redis.call('HMGET', slots, 'slots', 'cpu', 'mem', 'gpu')
local i = 7 + np
while i <= #ARGV do
  local op, f, t = ARGV[i], ARGV[i+1], ARGV[i+2]
  touch(t)
  if op == '-' then
    local acc = tonumber(ARGV[i+3])
    i = i + 4
    local v = leaseOf(f)
    if v then
      local c, m, g = string.match(v, '(%d+) (%d+) (%d+)')
      c, m, g = tonumber(c), tonumber(m), tonumber(g)
      used, cu, mu, gu, moved = used - 1, cu - c, mu - m, gu - g, true
      set[f], gone[f] = nil, true
      hold(t, -1, c, m, g)
    end
    if acc > 0 then accrued[t] = (accrued[t] or 0) + acc end
  else
    local c, m, g, h = tonumber(ARGV[i+3]), tonumber(ARGV[i+4]), tonumber(ARGV[i+5]), ARGV[i+6]
    local qs, qc, qm, qg = tonumber(ARGV[i+7]), tonumber(ARGV[i+8]), tonumber(ARGV[i+9]), tonumber(ARGV[i+10])
    local maxrun = tonumber(ARGV[i+11])
    i = i + 12
    if leaseOf(f) then
      table.insert(out, 'dup')
    elseif not tot[1] then
      table.insert(out, 'unknown')
    else
      local sl, cpu, mem, gpu = tonumber(tot[1]), tonumber(tot[2]), tonumber(tot[3]), tonumber(tot[4])
      local why = nil
      if used + 1 > sl then why = 'no:slots'
      elseif cpu >= 0 and cu + c > cpu then why = 'no:cpu'
      elseif mem >= 0 and mu + m > mem then why = 'no:memory'
      elseif g > 0 and gu + g > gpu then why = 'no:gpu'
      end
      if not why and (qs >= 0 or qc >= 0 or qm >= 0 or qg >= 0) then
        local on, oc, om, og = others(t)
        local n1, c1, m1, g1 = mineOf(t)
        on, oc, om, og = on + n1, oc + c1, om + m1, og + g1
        if qs >= 0 and on + 1 > qs then why = 'no:quota:slots'
        elseif qc >= 0 and oc + c > qc then why = 'no:quota:cpu'
        elseif qm >= 0 and om + m > qm then why = 'no:quota:memory'
        elseif qg >= 0 and og + g > qg then why = 'no:quota:gpu'
        end
      end
      if not why and maxrun > 0 and peersUsed() + used + 1 > maxrun then why = 'no:max_running' end
      if why then
        table.insert(out, why)
      else
        set[f], gone[f] = c .. ' ' .. m .. ' ' .. g .. ' ' .. h, nil
        used, cu, mu, gu, moved = used + 1, cu + c, mu + m, gu + g, true
        hold(t, 1, c, m, g)
        table.insert(out, 'ok')
      end
    end
  end
end
-- The batch's changes, written once. (Integers are written with
-- string.format('%d'): Lua writes -0 as "-0", which HINCRBY refuses.)
local del = {}
for f in pairs(gone) do table.insert(del, f) end
-- (In chunks: unpack of more than about 8,000 values fails in Redis's Lua;
-- a chunk of put is whole field-value pairs.)
local function chunked(cmd, args)
  for c = 1, #args, 1000 do redis.call(cmd, slots, unpack(args, c, math.min(c + 999, #args))) end
end
chunked('HDEL', del)
local put = {}
for f, v in pairs(set) do table.insert(put, f); table.insert(put, v) end
chunked('HSET', put)
if moved then
  redis.call('HSET', slots, 'used', string.format('%d', used), 'cpu_used', string.format('%d', cu),
    'mem_used', string.format('%d', mu), 'gpu_used', string.format('%d', gu))
end
local function decayed(t)
  local v = redis.call('HGET', usage, t)
  if not v then return 0 end
  local val, at = string.match(v, '(%S+) (%S+)')
  return tonumber(val) * math.pow(2, -math.max(0, now - tonumber(at)) / hl)
end
local function fmt(x) return string.format('%d', x) end
table.insert(out, '|')
for _, t in ipairs(order) do
  local h = held[t]
  if h[1] ~= 0 then redis.call('HINCRBY', tenants, 'n:'..t, fmt(h[1])) end
  if h[2] ~= 0 then redis.call('HINCRBY', tenants, 'c:'..t, fmt(h[2])) end
  if h[3] ~= 0 then redis.call('HINCRBY', tenants, 'm:'..t, fmt(h[3])) end
  if h[4] ~= 0 then redis.call('HINCRBY', tenants, 'g:'..t, fmt(h[4])) end
  local use = decayed(t)
  if accrued[t] then
    use = use + accrued[t]
    redis.call('HSET', usage, t, string.format('%.17g', use) .. ' ' .. ARGV[2])
  end
  local n, c, m, g = others(t)
  table.insert(out, t)
  table.insert(out, tostring(n))
  table.insert(out, tostring(c))
  table.insert(out, tostring(m))
  table.insert(out, tostring(g))
  table.insert(out, string.format('%.17g', use))
end
redis.call('PEXPIRE', slots, ARGV[1])
redis.call('PEXPIRE', tenants, ARGV[1])
return out
`)

// syncScript replaces a worker's totals and leases with what the worker
// knows it runs, adds what its running leases were used for since the last
// heartbeat to its tenants' usage, and reports the pool: its workers, their
// totals together, and what every tenant holds on the other workers and
// its usage. Every heartbeat sends it, so Redis never drifts from the
// truth for longer than one interval, and a worker reconciles its leases
// by itself when Redis comes back after an outage.
//
//	KEYS[1] -> fleet:{p:<pool>}:w:<worker>:slots
//	KEYS[2] -> fleet:{p:<pool>}:w:<worker>:tenants
//	KEYS[3] -> fleet:{p:<pool>}:workers
//	KEYS[4] -> fleet:{p:<pool>}:usage
//	KEYS[5..] -> each peer's slots hash, then its tenants hash
//	ARGV[1] -> TTL of the worker's hashes, in milliseconds
//	ARGV[2..5] -> totals: slots, cpu, mem, gpu (-1 when unknown)
//	ARGV[6] -> now, unix milliseconds
//	ARGV[7] -> the half-life of usage, in milliseconds
//	ARGV[8] -> the worker's id
//	ARGV[9] -> the number of peers, n; ARGV[10..9+n] their ids
//	ARGV[10+n] -> the number of leases, k; then six values each: field,
//	             tenant, cpu, mem, gpu, handle
//	then -> pairs of tenant and accrued slot-ms, to add to usage
//	Output: the pool's other workers, "|", the totals of the peers (slots,
//	used, cpu, mem, gpu; -1 when one does not know it), "|", then for each
//	tenant six strings as leaseScript's.
var syncScript = redis.NewScript(`
local slots, tenants, workers, usage = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now, hl, self = tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8]
local np = tonumber(ARGV[9])
local function num(v) return tonumber(v or 0) or 0 end
redis.call('DEL', slots, tenants)
local used, cu, mu, gu = 0, 0, 0, 0
local k = tonumber(ARGV[10+np])
local i = 11 + np
for _ = 1, k do
  local f, t = ARGV[i], ARGV[i+1]
  local c, m, g = tonumber(ARGV[i+2]), tonumber(ARGV[i+3]), tonumber(ARGV[i+4])
  redis.call('HSET', slots, f, c .. ' ' .. m .. ' ' .. g .. ' ' .. ARGV[i+5])
  redis.call('HINCRBY', tenants, 'n:'..t, 1)
  redis.call('HINCRBY', tenants, 'c:'..t, c)
  redis.call('HINCRBY', tenants, 'm:'..t, m)
  redis.call('HINCRBY', tenants, 'g:'..t, g)
  used, cu, mu, gu = used + 1, cu + c, mu + m, gu + g
  i = i + 6
end
redis.call('HSET', slots, 'slots', ARGV[2], 'cpu', ARGV[3], 'mem', ARGV[4], 'gpu', ARGV[5],
  'used', used, 'cpu_used', cu, 'mem_used', mu, 'gpu_used', gu)
redis.call('PEXPIRE', slots, ARGV[1])
redis.call('PEXPIRE', tenants, ARGV[1])
redis.call('ZADD', workers, now, self)
local function decay(v)
  local val, at = string.match(v, '(%S+) (%S+)')
  return tonumber(val) * math.pow(2, -math.max(0, now - tonumber(at)) / hl)
end
while i + 1 <= #ARGV do
  local t, acc = ARGV[i], tonumber(ARGV[i+1])
  local v = redis.call('HGET', usage, t)
  local val = acc
  if v then val = val + decay(v) end
  redis.call('HSET', usage, t, string.format('%.17g', val) .. ' ' .. ARGV[6])
  i = i + 2
end
local out = {}
for _, m in ipairs(redis.call('ZRANGE', workers, 0, -1)) do
  if m ~= self then table.insert(out, m) end
end
table.insert(out, '|')
local ts, tu, tc, tm, tg = 0, 0, 0, 0, 0
local held, order = {}, {}
for j = 1, np do
  local t = redis.call('HMGET', KEYS[3+2*j], 'slots', 'used', 'cpu', 'mem', 'gpu')
  if t[1] then
    ts, tu = ts + num(t[1]), tu + num(t[2])
    if tc >= 0 then if num(t[3]) < 0 then tc = -1 else tc = tc + num(t[3]) end end
    if tm >= 0 then if num(t[4]) < 0 then tm = -1 else tm = tm + num(t[4]) end end
    tg = tg + num(t[5])
  end
  local h = redis.call('HGETALL', KEYS[4+2*j])
  for x = 1, #h, 2 do
    local kind, t = string.match(h[x], '(%a):(.*)')
    if t then
      if not held[t] then held[t] = {n = 0, c = 0, m = 0, g = 0}; table.insert(order, t) end
      held[t][kind] = held[t][kind] + num(h[x+1])
    end
  end
end
for _, v in ipairs({ts, tu, tc, tm, tg}) do table.insert(out, tostring(v)) end
table.insert(out, '|')
local u = redis.call('HGETALL', usage)
local use = {}
for x = 1, #u, 2 do
  local d = decay(u[x+1])
  if d < 1 then
    redis.call('HDEL', usage, u[x]) -- forgotten: less than a slot-millisecond
  else
    use[u[x]] = d
    if not held[u[x]] then held[u[x]] = {n = 0, c = 0, m = 0, g = 0}; table.insert(order, u[x]) end
  end
end
for _, t in ipairs(order) do
  local h = held[t]
  table.insert(out, t)
  table.insert(out, tostring(h.n))
  table.insert(out, tostring(h.c))
  table.insert(out, tostring(h.m))
  table.insert(out, tostring(h.g))
  table.insert(out, string.format('%.17g', use[t] or 0))
end
return out
`)
