-- Records the outcome of an admitted attempt and gives back its permit.
-- ARGV[D..]: probe (0/1), generation, slot (-1: none), outcome (0 success,
-- 1 failure, 2 ignored), duration_us, retry_after_us (-1: none)
-- Reply: {transition, trips, cooldown_us (-1: none)}
-- transition: 0 none, 2 opened, 3 closed

local probe, pgen, slot = A[D] == '1', tonumber(A[D + 1]), A[D + 2]
local outcome, dur, ra = tonumber(A[D + 3]), tonumber(A[D + 4]), tonumber(A[D + 5])

if slot ~= '-1' then redis.call('ZREM', KB, slot) end

local tr, trips, cdout = 0, 0, -1

if HAS_C then
  local c = cload()
  if outcome == 2 then
    -- Ignored: nothing is recorded; a probe slot is given back.
    if probe and c.gen == pgen and c.st == HALF_OPEN and c.pr > 0 then
      c.pr = c.pr - 1
      csave(c)
    end
  elseif c.gen == pgen and (c.st == CLOSED or c.st == HALF_OPEN) then
    local fail = outcome == 1
    local slow = SR > 0 and dur >= SLOW
    local dirty = true
    if c.st == HALF_OPEN then
      if fail or slow then
        copen(c)
        tr = 2
      else
        c.pok = c.pok + 1
        if c.pok >= HOC then
          cclose(c)
          tr = 3
        end
      end
    elseif MODE == 1 then
      -- Consecutive failures.
      if fail then
        c.cf = c.cf + 1
        if c.cf >= MODE_N then
          copen(c)
          tr = 2
        end
      elseif c.cf > 0 then
        c.cf = 0
      else
        dirty = false
      end
    else
      local calls, fails, slows
      if MODE == 2 then
        -- Count window: the codes of the last N outcomes, newest first.
        if redis.call('LLEN', KCW) == 0 then c.nc, c.nf, c.ns = 0, 0, 0 end
        local code = 0
        if fail then code = code + 1 end
        if slow then code = code + 2 end
        local len = redis.call('LPUSH', KCW, code)
        c.nc = c.nc + 1
        if fail then c.nf = c.nf + 1 end
        if slow then c.ns = c.ns + 1 end
        while len > MODE_N do
          local old = tonumber(redis.call('RPOP', KCW)) or 0
          len = len - 1
          c.nc = c.nc - 1
          if old % 2 == 1 then c.nf = c.nf - 1 end
          if old >= 2 then c.ns = c.ns - 1 end
        end
        redis.call('PEXPIRE', KCW, cttl(c))
        calls, fails, slows = c.nc, c.nf, c.ns
      else
        -- Time window: one bucket per whole second, the last MODE_N seconds.
        local sec = math.floor(now / 1000000)
        local edge = sec - MODE_N
        local secs = int(sec)
        local old = redis.call('ZRANGEBYSCORE', KTZ, '-inf', edge)
        for i = 1, #old do
          local s = old[i]
          local v = redis.call('HMGET', KTW, s .. 'c', s .. 'f', s .. 's')
          c.tc = c.tc - (tonumber(v[1]) or 0)
          c.tf = c.tf - (tonumber(v[2]) or 0)
          c.ts = c.ts - (tonumber(v[3]) or 0)
          redis.call('HDEL', KTW, s .. 'c', s .. 'f', s .. 's')
        end
        if #old > 0 then redis.call('ZREMRANGEBYSCORE', KTZ, '-inf', edge) end
        if redis.call('EXISTS', KTZ) == 0 then c.tc, c.tf, c.ts = 0, 0, 0 end
        redis.call('HINCRBY', KTW, secs .. 'c', 1)
        c.tc = c.tc + 1
        if fail then
          redis.call('HINCRBY', KTW, secs .. 'f', 1)
          c.tf = c.tf + 1
        end
        if slow then
          redis.call('HINCRBY', KTW, secs .. 's', 1)
          c.ts = c.ts + 1
        end
        redis.call('ZADD', KTZ, sec, secs)
        local ttl = cttl(c)
        redis.call('PEXPIRE', KTW, ttl)
        redis.call('PEXPIRE', KTZ, ttl)
        calls, fails, slows = c.tc, c.tf, c.ts
      end
      -- Rates are judged only when a failed or slow call is recorded.
      if (fail or slow) and calls >= MINC and calls > 0
        and (fails / calls >= FR or (SR > 0 and slows / calls >= SR)) then
        copen(c)
        tr = 2
      end
    end
    if dirty then csave(c) end
    trips = c.trips
  end
end

if HAS_CD and ra >= 0 then
  -- A retry-after hint opens or extends the cooldown, never shrinks it.
  if ra > CD_PAUSE then ra = CD_PAUSE end
  local u = tonumber(redis.call('GET', KCD)) or 0
  if now + ra > u then u = now + ra end
  if u > now then
    redis.call('SET', KCD, u, 'PX', ms(u - now + CD_GRACE))
    cdout = u - now
  end
end

return {tr, trips, cdout}
