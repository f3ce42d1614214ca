-- Admits one attempt through circuit, bulkhead, cooldown and rate limit, in
-- that order, all or nothing: every check runs first, then the permits are
-- taken together, so a later refusal never leaves a probe or a slot taken.
-- Reply: {reason, retry_after_us (-1: none), probe, generation, slot (-1: none), transition}
-- reason: 0 admitted, 1 circuit_open, 2 bulkhead_full, 3 cooldown_active, 4 rate_limited
-- transition: 0 none, 1 half-opened

local reason, retry = 0, -1
local probe, gen, slot, tr = 0, 0, -1, 0
local c, cdirty = nil, false

if HAS_C then
  c = cload()
  if c.st == ISOLATED then
    reason = 1
  elseif c.st == OPEN then
    if now >= c.ou then
      c.st = HALF_OPEN
      c.gen = c.gen + 1
      c.since = now
      c.pr, c.pok = 0, 0
      tr = 1
      cdirty = true
    else
      reason = 1
      retry = c.ou - now
    end
  end
  if reason == 0 and c.st == HALF_OPEN then
    -- Probes whose process died never report: after the probe lease a new
    -- round of probes starts (the old ones are of an older generation).
    if c.pr >= HOC and now - c.pt >= PROBE_LEASE then
      c.gen = c.gen + 1
      c.pr, c.pok = 0, 0
      cdirty = true
    end
    if c.pr < HOC then probe = 1 else reason = 1 end
  end
  if c.st == ISOLATED or c.st == DISABLED then
    redis.call('PEXPIRE', KC, ms(IDLE))
  end
  gen = c.gen
end

if reason == 0 and HAS_B then
  redis.call('ZREMRANGEBYSCORE', KB, '-inf', now)
  if redis.call('ZCARD', KB) >= B_MAX then reason = 2 end
end

if reason == 0 and HAS_CD then
  local u = tonumber(redis.call('GET', KCD)) or 0
  if u > now then
    reason = 3
    retry = u - now
  end
end

local rnew
if reason == 0 and HAS_R then
  if R_ALG == 1 then
    -- GCRA: theoretical arrival time, tolerance of burst - 1 intervals.
    local tat = tonumber(redis.call('GET', KRL)) or now
    if tat < now then tat = now end
    local tol = R_INT * (R_BURST - 1)
    if tat - now > tol then
      reason = 4
      retry = tat - tol - now
    else
      rnew = tat + R_INT
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

if reason == 0 then
  if probe == 1 then
    c.pr = c.pr + 1
    c.pt = now
    cdirty = true
  end
  if HAS_B then
    slot = redis.call('INCR', KSQ)
    redis.call('PEXPIRE', KSQ, A[27])
    redis.call('ZADD', KB, now + B_LEASE, int(slot))
    redis.call('PEXPIRE', KB, ms(B_LEASE, 1000))
  end
  if HAS_R then
    if R_ALG == 1 then
      redis.call('SET', KRL, rnew, 'PX', ms(rnew - now, 1000))
    elseif R_ALG == 2 then
      local w = math.floor(now / R_PERIOD)
      redis.call('HSET', KRL, 'w', int(w), 'n', rnew)
      redis.call('PEXPIRE', KRL, ms((w + 1) * R_PERIOD - now, 1000))
    else
      local id = redis.call('INCR', KSQ)
      redis.call('PEXPIRE', KSQ, A[27])
      redis.call('ZADD', KRL, now, int(id))
      redis.call('PEXPIRE', KRL, ms(R_PERIOD, 1000))
    end
  end
end

if cdirty then csave(c) end
if retry > 0 then retry = math.ceil(retry) end
return {reason, retry, probe, gen, slot, tr}
