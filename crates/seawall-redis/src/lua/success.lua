-- seawall-redis: the record of a success that can report nothing (not a
-- probe, not slow, no retry-after hint), or of an ignored outcome of a
-- permit that is not a probe, as the function `success(A)`. Lean: the most
-- frequent record, so it reads only what it needs. Its effect is exactly
-- that of record.lua for such an outcome. Run on its own (followed by
-- `return success(ARGV)`), or for each success an admission carries
-- (carry.lua, before prelude.lua and admit.lua): the one statement of the
-- rule for both.
-- KEYS: as every script (src/scripts.rs).
-- A (ARGV when run on its own): [1] the caller's time in microseconds, or empty for TIME,
-- [2] slot (-1: none), [3] generation, [4] circuit mode (0: nothing to
-- record, 1 consecutive, 2 count window, 3 time window), [5] window size,
-- [6] idle time (us), [7] cooldown grace (us; -1: no cooldown)
-- Reply: {0, 0, -1} (no transition, no cooldown)

local tonumber, format = tonumber, string.format

local function success(A)
  local KH, KCW, KTW, KTZ, KB = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
  local nothing = {0, 0, -1}

  if A[2] ~= '-1' then redis.call('ZREM', KB, A[2]) end
  local mode = tonumber(A[4])
  if mode == 0 then return nothing end

  local v = redis.call('HMGET', KH, 'st', 'gen', 'cf', 'nh', 'nc', 'nf', 'ns', 'tc', 'tf', 'ts', 'cu')
  if (tonumber(v[1]) or 0) ~= 0 or (tonumber(v[2]) or 0) ~= tonumber(A[3]) then
    -- Not closed, or a newer generation: not recorded.
    return nothing
  end
  local n, idle, grace = tonumber(A[5]), tonumber(A[6]), tonumber(A[7])

  local now
  local function tnow()
    if not now then
      if A[1] == '' then
        local t = redis.call('TIME')
        now = tonumber(t[1]) * 1000000 + tonumber(t[2])
      else
        now = tonumber(A[1])
      end
    end
    return now
  end

  -- As httl() in prelude.lua, for a closed circuit.
  local function ttl()
    local t = idle
    if mode == 3 and n * 1000000 > t then t = n * 1000000 end
    local cu = tonumber(v[11]) or 0
    if grace >= 0 and cu > 0 then
      local c = cu - tnow() + grace
      if c > t then t = c end
    end
    local m = math.ceil(t / 1000)
    if m < 1 then m = 1 end
    return format('%d', m)
  end

  if mode == 1 then
    -- A success ends a run of failures.
    if (tonumber(v[3]) or 0) > 0 then
      redis.call('HSET', KH, 'cf', 0)
      redis.call('PEXPIRE', KH, ttl())
    end
  elseif mode == 2 then
    local nh, nc, nf, ns = tonumber(v[4]) or 0, tonumber(v[5]) or 0, tonumber(v[6]) or 0, tonumber(v[7]) or 0
    local old = redis.call('BITFIELD', KCW, 'SET', 'u2', '#' .. format('%d', nh % n), 0)[1]
    if nh >= n then
      nc = nc - 1
      if old % 2 == 1 then nf = nf - 1 end
      if old >= 2 then ns = ns - 1 end
    end
    nh, nc = nh + 1, nc + 1
    local t = ttl()
    redis.call('HSET', KH, 'nh', nh, 'nc', nc, 'nf', nf, 'ns', ns)
    redis.call('PEXPIRE', KH, t)
    redis.call('PEXPIRE', KCW, t)
  else
    local tc, tf, ts = tonumber(v[8]) or 0, tonumber(v[9]) or 0, tonumber(v[10]) or 0
    local sec = math.floor(tnow() / 1000000)
    local edge = sec - n
    local secs = format('%d', sec)
    local old = redis.call('ZRANGEBYSCORE', KTZ, '-inf', edge)
    for i = 1, #old do
      local s = old[i]
      local b = redis.call('HMGET', KTW, s .. 'c', s .. 'f', s .. 's')
      tc = tc - (tonumber(b[1]) or 0)
      tf = tf - (tonumber(b[2]) or 0)
      ts = ts - (tonumber(b[3]) or 0)
      redis.call('HDEL', KTW, s .. 'c', s .. 'f', s .. 's')
    end
    if #old > 0 then redis.call('ZREMRANGEBYSCORE', KTZ, '-inf', edge) end
    if redis.call('ZADD', KTZ, sec, secs) == 1 and #old == 0 and redis.call('ZCARD', KTZ) == 1 then
      tc, tf, ts = 0, 0, 0
    end
    redis.call('HINCRBY', KTW, secs .. 'c', 1)
    tc = tc + 1
    local t = ttl()
    redis.call('HSET', KH, 'tc', tc, 'tf', tf, 'ts', ts)
    redis.call('PEXPIRE', KH, t)
    redis.call('PEXPIRE', KTW, t)
    redis.call('PEXPIRE', KTZ, t)
  end
  return nothing
end
