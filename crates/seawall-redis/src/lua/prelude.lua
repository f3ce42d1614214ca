-- seawall-redis: shared head of every script (see src/scripts.rs for the
-- layout of KEYS and ARGV). Times are microseconds; TTLs are milliseconds.

local KC, KCW, KTW, KTZ, KB, KCD, KRL, KSQ =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local A = ARGV

-- The server's clock decides, unless the caller's time was passed (tests).
-- A circuit that never moved has been closed since: now on the server's
-- clock, time zero on the caller's (like the in-memory store).
local now, since0
if A[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  since0 = now
else
  now = tonumber(A[1])
  since0 = 0
end

-- The resource's spec, fixed at bind time.
local HAS_C = A[2] == '1'
local MODE, MODE_N = tonumber(A[3]), tonumber(A[4])
local FR, SR, SLOW, MINC = tonumber(A[5]), tonumber(A[6]), tonumber(A[7]), tonumber(A[8])
local CD_BASE, CD_GROWTH, CD_MAX = tonumber(A[9]), tonumber(A[10]), tonumber(A[11])
local HOC, PROBE_LEASE, IDLE = tonumber(A[12]), tonumber(A[13]), tonumber(A[14])
local HAS_B, B_MAX, B_LEASE = A[15] == '1', tonumber(A[16]), tonumber(A[17])
local HAS_CD, CD_PAUSE, CD_GRACE = A[18] == '1', tonumber(A[19]), tonumber(A[20])
local HAS_R, R_ALG, R_LIMIT = A[21] == '1', tonumber(A[22]), tonumber(A[23])
local R_PERIOD, R_BURST, R_INT = tonumber(A[24]), tonumber(A[25]), tonumber(A[26])
-- A[27]: the TTL of the id sequence, in milliseconds, passed on as is.
local D = 28

-- Circuit states.
local CLOSED, OPEN, HALF_OPEN, ISOLATED, DISABLED = 0, 1, 2, 3, 4

-- Integers sent back to Redis (TTLs, slot ids, bucket names) are
-- formatted explicitly: a Lua number may otherwise reach Redis as
-- `1e+08`, which is not an integer to PEXPIRE nor the same member to ZREM.
local function int(n)
  return string.format('%d', n)
end

-- A TTL in milliseconds (at least 1) for `us` microseconds plus `extra_ms`.
local function ms(us, extra_ms)
  local v = math.ceil(us / 1000) + (extra_ms or 0)
  if v < 1 then v = 1 end
  return int(v)
end

local function cload()
  local v = redis.call('HMGET', KC, 'st', 'gen', 'trips', 'ou', 'since', 'pr', 'pok', 'pt',
    'cf', 'nc', 'nf', 'ns', 'tc', 'tf', 'ts')
  return {
    st = tonumber(v[1]) or CLOSED, gen = tonumber(v[2]) or 0, trips = tonumber(v[3]) or 0,
    ou = tonumber(v[4]) or 0, since = tonumber(v[5]) or since0, pr = tonumber(v[6]) or 0,
    pok = tonumber(v[7]) or 0, pt = tonumber(v[8]) or now, cf = tonumber(v[9]) or 0,
    nc = tonumber(v[10]) or 0, nf = tonumber(v[11]) or 0, ns = tonumber(v[12]) or 0,
    tc = tonumber(v[13]) or 0, tf = tonumber(v[14]) or 0, ts = tonumber(v[15]) or 0,
  }
end

-- How long circuit state is kept: the idle time, plus what is left of an
-- open period, and at least a time window.
local function cttl(c)
  local ttl = IDLE
  if c.st == OPEN and c.ou > now then ttl = ttl + (c.ou - now) end
  if MODE == 3 and MODE_N * 1000000 > ttl then ttl = MODE_N * 1000000 end
  return ms(ttl)
end

local function csave(c)
  redis.call('HSET', KC, 'st', c.st, 'gen', c.gen, 'trips', c.trips, 'ou', c.ou,
    'since', c.since, 'pr', c.pr, 'pok', c.pok, 'pt', c.pt, 'cf', c.cf,
    'nc', c.nc, 'nf', c.nf, 'ns', c.ns, 'tc', c.tc, 'tf', c.tf, 'ts', c.ts)
  redis.call('PEXPIRE', KC, cttl(c))
end

local function cooldown_for(trips)
  local cd = CD_BASE
  if CD_GROWTH > 1 and trips > 1 then
    cd = CD_BASE * CD_GROWTH ^ (trips - 1)
    if cd ~= cd or cd >= CD_MAX then cd = CD_MAX end
  end
  return math.floor(cd)
end

-- Closed or half-open to open. Trips saturate at 63, like the in-memory
-- store's.
local function copen(c)
  if c.st == HALF_OPEN then c.trips = c.trips + 1 else c.trips = 1 end
  if c.trips > 63 then c.trips = 63 end
  c.st = OPEN
  c.gen = c.gen + 1
  c.since = now
  c.pr, c.pok, c.cf = 0, 0, 0
  c.ou = now + cooldown_for(c.trips)
end

local function wclear(c)
  c.cf, c.nc, c.nf, c.ns, c.tc, c.tf, c.ts = 0, 0, 0, 0, 0, 0, 0
  redis.call('DEL', KCW, KTW, KTZ)
end

-- Back to closed with an empty window and no trip history.
local function cclose(c)
  c.st = CLOSED
  c.gen = c.gen + 1
  c.since = now
  c.pr, c.pok, c.trips, c.ou = 0, 0, 0, 0
  wclear(c)
end
