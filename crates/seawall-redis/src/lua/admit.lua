-- Admits one attempt through circuit, bulkhead, cooldown and rate limit, in
-- that order, all or nothing: every check runs first, then the permits are
-- taken together, so a later refusal never leaves a probe or a slot taken.
-- Reply: {reason, retry_after_us, probe, generation, slot (-1: none), transition, trips, under_ns}
-- retry_after_us: -1 none, -2 the cooldown of the current trip (half-open,
-- every probe slot taken), -3 until the latest instant
-- under_ns: nanoseconds (0..999) the exact wait is shorter than
-- retry_after_us (a GCRA refusal: its times are kept to the nanosecond)
-- reason: 0 admitted, 1 circuit_open, 2 bulkhead_full, 3 cooldown_active, 4 rate_limited
-- transition: 0 none, 1 half-opened

-- A GCRA time or duration, kept as `microseconds:nanoseconds` (the
-- nanoseconds 0..999), as two integers. A plain number (a state written by
-- an earlier version, in fractional microseconds) is read rounded up to
-- the nanosecond.
local function upair(s)
  local u, n = string.match(s, '^(%d+):(%d+)$')
  if u then return tonumber(u), tonumber(n) end
  local x = tonumber(s) or 0
  u = math.floor(x)
  n = math.ceil((x - u) * 1000)
  if n >= 1000 then u, n = u + 1, n - 1000 end
  return u, n
end

local reason, retry, under = 0, -1, 0
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

local rnew
if reason == 0 and HAS_R then
  tnow()
  if R_ALG == 1 then
    -- GCRA: theoretical arrival time, tolerance of burst - 1 intervals.
    -- Every time is a pair (whole microseconds, nanoseconds 0..999), so
    -- that the arithmetic is exact integer arithmetic on nanoseconds, as
    -- the in-memory rule's, whatever the interval (1/3 s is no whole
    -- number of microseconds) and however far the clock is from 0 (a
    -- fraction of a microsecond added to 10^12 us is rounded in a double).
    local tol_u, tol_n = upair(R_TOL)
    local int_u, int_n = upair(R_INT)
    local tu, tn = now, now_ns
    local stored = redis.call('GET', KRL)
    if stored then tu, tn = upair(stored) end
    if tu < now or (tu == now and tn < now_ns) then tu, tn = now, now_ns end
    -- ahead = TAT - now; refused when ahead > tolerance.
    local du, dn = tu - now - tol_u, tn - now_ns - tol_n
    if dn <= -1000 then du, dn = du - 1, dn + 1000 end
    if du > 0 or (du == 0 and dn > 0) then
      reason = 4
      -- ahead - tolerance = du us + dn ns (dn in -999..999): rounded up to
      -- whole microseconds, and how much shorter the exact wait is.
      if dn > 0 then
        retry, under = du + 1, 1000 - dn
      else
        retry, under = du, -dn
      end
    else
      tu, tn = tu + int_u, tn + int_n
      if tn >= 1000 then tu, tn = tu + 1, tn - 1000 end
      rnew = {tu, tn}
    end
  elseif R_ALG == 2 then
    -- Fixed window: a counter per window aligned on multiples of the period.
    local w = math.floor(now / R_PERIOD)
    local v = redis.call('HMGET', KRL, 'w', 'n')
    local n = 0
    if tonumber(v[1]) == w then n = tonumber(v[2]) or 0 end
    if n >= R_LIMIT then
      reason = 4
      retry = (w + 1) * R_PERIOD - now
    else
      rnew = n + 1
    end
  else
    -- Sliding window: the log of the admissions of the last period.
    redis.call('ZREMRANGEBYSCORE', KRL, '-inf', now - R_PERIOD)
    if redis.call('ZCARD', KRL) >= R_LIMIT then
      local oldest = redis.call('ZRANGE', KRL, 0, 0, 'WITHSCORES')
      reason = 4
      retry = tonumber(oldest[2]) + R_PERIOD - now
    end
  end
end

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
  if HAS_R then
    if R_ALG == 1 then
      redis.call('SET', KRL, int(rnew[1]) .. ':' .. int(rnew[2]), 'PX', ms(rnew[1] + 1 - now, 1000))
    elseif R_ALG == 2 then
      local w = math.floor(now / R_PERIOD)
      redis.call('HSET', KRL, 'w', int(w), 'n', rnew)
      redis.call('PEXPIRE', KRL, ms((w + 1) * R_PERIOD - now, 1000))
    else
      add_unique(KRL, now)
      redis.call('PEXPIRE', KRL, ms(R_PERIOD, 1000))
    end
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
return {reason, retry, probe, gen, slot, tr, trips, under}
