-- Admits one attempt through circuit, bulkhead, cooldown and rate limit, in
-- that order, all or nothing: every check runs first, then the permits are
-- taken together, so a later refusal never leaves a probe or a slot taken.
-- ARGV[D..] (only for a rate limiter whose calls may wait): the lead within
-- which a refused rate limit reserves its next permit (us, 0: never), the
-- instant of a due reservation the call presents (us, -1: none), which
-- stands for the rate-limit permit and is given back when an earlier
-- policy refuses.
-- Reply: {reason, retry_after_us, probe, generation, slot (-1: none), transition, trips,
--   reserved_at_us (-1: none)}: a reserved permit comes with reason 4
-- retry_after_us: -1 none, -2 the cooldown of the current trip (half-open,
-- every probe slot taken), -3 until the latest instant
-- reason: 0 admitted, 1 circuit_open, 2 bulkhead_full, 3 cooldown_active, 4 rate_limited
-- transition: 0 none, 1 half-opened

local reason, retry = 0, -1
local probe, gen, slot, tr = 0, 0, -1, 0
local h, moved

if HAS_C or HAS_CD then
  if HAS_C then
    h = hload({'st', 'gen', 'trips', 'ou', 'pr', 'pok', 'pt', 'cu'})
  else
    h = hload({'cu'})
  end
end

if HAS_C then
  if h.st == ISOLATED then
    reason = 1
  elseif h.st == OPEN then
    if h.ou ~= FOREVER and tnow() >= h.ou then
      -- Half-open starts its own counts.
      h.st = HALF_OPEN
      h.gen = h.gen + 1
      h.since = now
      h.pr, h.pok = 0, 0
      cclear(h)
      tr = 1
      moved = true
    elseif h.ou == FOREVER then
      reason = 1
      retry = -3
    else
      reason = 1
      retry = h.ou - now
    end
  end
  if reason == 0 and h.st == HALF_OPEN then
    -- Probes whose process died never report: after the probe lease a new
    -- round of probes starts (the old ones are of an older generation).
    if h.pr >= HOC and tnow() - h.pt >= PROBE_LEASE then
      h.gen = h.gen + 1
      h.pr, h.pok = 0, 0
      moved = true
    end
    if h.pr < HOC then
      probe = 1
    else
      reason = 1
      retry = -2
    end
  end
  if h.st == ISOLATED or h.st == DISABLED then
    -- Forced states live while calls come.
    redis.call('PEXPIRE', KH, ms(IDLE))
  end
  gen = h.gen
end

if reason == 0 and HAS_B then
  if redis.call('ZCOUNT', KB, '(' .. int(tnow()), '+inf') >= B_MAX then reason = 2 end
end

if reason == 0 and HAS_CD and h.cu > tnow() then
  reason = 3
  retry = h.cu - now
end

local R_RES = A[D] ~= nil
local R_WITHIN, R_HELD = tonumber(A[D]) or 0, tonumber(A[D + 1]) or -1

-- rnew: the rate limiter's next state; rat: the instant of a reserved
-- permit (the state then moves although the call is refused); rlog: the
-- instant a sliding-window admission is logged at.
local rnew, rat, rlog
if reason == 0 and HAS_R and R_HELD < 0 then
  tnow()
  if R_ALG == 1 then
    -- GCRA: theoretical arrival time, tolerance of burst - 1 intervals.
    local tat = tonumber(redis.call('GET', KRL)) or now
    if tat < now then tat = now end
    if tat - now > R_TOL then
      reason = 4
      retry = tat - R_TOL - now
      if retry <= R_WITHIN then
        rnew = tat + R_INT
        rat = tat - R_TOL
      end
    else
      rnew = tat + R_INT
    end
  elseif R_ALG == 2 then
    -- Fixed window: the last window with a permit taken and its count;
    -- every window from the caller's up to it counts as full. The next free
    -- permit is in that window if it is not full, else in the one after: a
    -- call in it passes, any other retries when it starts.
    local w = math.floor(now / R_PERIOD)
    local v = redis.call('HMGET', KRL, 'w', 'n')
    local lw, n = tonumber(v[1]), tonumber(v[2]) or 0
    if not lw or lw < w then lw, n = w, 0 end
    if n >= R_LIMIT then lw, n = lw + 1, 0 end
    rnew = n + 1
    if lw ~= w then
      reason = 4
      retry = lw * R_PERIOD - now
      if retry <= R_WITHIN then rat = lw * R_PERIOD else rnew = nil end
    end
  else
    -- Sliding window: the log of the admissions of the last period (and
    -- the reservations); the entry R_LIMIT places back decides.
    redis.call('ZREMRANGEBYSCORE', KRL, '-inf', now - R_PERIOD)
    local card = redis.call('ZCARD', KRL)
    -- Entries are never logged earlier than the newest one.
    local function newest_or(t)
      if not R_RES or card == 0 then return t end
      local n = tonumber(redis.call('ZRANGE', KRL, -1, -1, 'WITHSCORES')[2])
      if n > t then return n end
      return t
    end
    if card >= R_LIMIT then
      local oldest = redis.call('ZRANGE', KRL, card - R_LIMIT, card - R_LIMIT, 'WITHSCORES')
      reason = 4
      retry = tonumber(oldest[2]) + R_PERIOD - now
      if retry <= R_WITHIN then
        rat = newest_or(tonumber(oldest[2]) + R_PERIOD)
        if rat - now > R_WITHIN then rat = nil end
        rlog = rat
      end
    else
      rlog = newest_or(now)
    end
  end
end

-- A due reservation presented to a policy checked before the rate limit
-- that refuses is given back.
if R_HELD >= 0 and reason ~= 0 then rgive(R_HELD) end

-- A unique member of a sorted set, named after the current microsecond
-- (the next free one when taken).
local function add_unique(key, score)
  local id = now
  while redis.call('ZADD', key, 'NX', score, int(id)) == 0 do id = id + 1 end
  return id
end

if reason == 0 then
  if probe == 1 then
    h.pr = h.pr + 1
    h.pt = tnow()
    moved = true
  end
  if HAS_B then
    -- Leases expired by dead processes are dropped now and then.
    if now % 16 == 0 then redis.call('ZREMRANGEBYSCORE', KB, '-inf', now) end
    slot = add_unique(KB, now + B_LEASE)
    redis.call('PEXPIRE', KB, ms(B_LEASE, 1000))
  end
end

-- The rate limiter's permit: taken by an admission (unless a due
-- reservation stands for it), or reserved for `rat`.
if HAS_R and ((reason == 0 and R_HELD < 0) or rat) then
  if R_ALG == 1 then
    redis.call('SET', KRL, rnew, 'PX', ms(rnew - now, 1000))
  elseif R_ALG == 2 then
    local w = math.floor((rat or now) / R_PERIOD)
    redis.call('HSET', KRL, 'w', int(w), 'n', rnew)
    redis.call('PEXPIRE', KRL, ms((w + 1) * R_PERIOD - now, 1000))
  else
    add_unique(KRL, rlog or now)
    redis.call('PEXPIRE', KRL, ms((rlog or now) - now + R_PERIOD, 1000))
  end
end

if moved then
  if tr == 1 then
    hsave(h, {'st', 'gen', 'since', 'pr', 'pok', 'pt', 'cf', 'nc', 'nf', 'ns', 'nh', 'tc', 'tf', 'ts'})
  else
    hsave(h, {'gen', 'pr', 'pok', 'pt'})
  end
end
if retry > 0 then retry = math.ceil(retry) end
local trips = 0
if HAS_C then trips = h.trips end
local reserved = -1
if rat then reserved = math.floor(rat) end
return {reason, retry, probe, gen, slot, tr, trips, reserved}
