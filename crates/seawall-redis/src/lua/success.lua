-- seawall-redis: the record of a success that can report nothing (not a
-- probe, not slow, no retry-after hint), or of an ignored outcome of a
-- permit that is not a probe, as the function `success(K, A, o)`. Lean: the
-- most frequent record, so it reads only what it needs. Its effect is
-- exactly that of record.lua for such an outcome. Run on its own (followed
-- by `return success(KEYS, ARGV, 0)`), or for each success an admission
-- carries (carry.lua, after prelude.lua and before admit.lua): the one
-- statement of the rule for both.
-- K: the keys, KEYS of every script (src/scripts.rs).
-- A, o: the record's seven arguments are `A[o + 1..o + 7]` (ARGV and 0 when
-- run on its own): [1] the caller's time in microseconds, or empty for
-- TIME, [2] slot (-1: none), [3] generation, [4] circuit mode (0: nothing
-- to record, 1 consecutive, 2 count window, 3 time window), [5] window
-- size, [6] idle time (us), [7] cooldown grace (us; -1: no cooldown)
-- H (optional): the state hash already read (carry.lua reads it once for
-- every success carried and for the admission: `hload()` of prelude.lua,
-- missing fields 0), updated in place; without it, the fields the mode
-- needs are read here.
-- F (optional): a list the slot is added to rather than freed here (the
-- admission that carries the success frees it or takes it over).
-- Reply: {0, 0, -1} (no transition, no cooldown)
-- Written for speed (the most frequent record): every number converted
-- costs, so each argument is converted only when needed.

-- The fields of the state hash `success` reads in circuit mode `mode`
-- (1, 2 or 3), after `first` (a list to extend, or nil).
local function success_fields(mode, first)
  local names = first or {}
  names[#names + 1], names[#names + 2], names[#names + 3] = 'st', 'gen', 'cu'
  if mode == 1 then
    names[#names + 1] = 'cf'
  elseif mode == 2 then
    local k = #names
    names[k + 1], names[k + 2], names[k + 3], names[k + 4] = 'nh', 'nc', 'nf', 'ns'
  else
    local k = #names
    names[k + 1], names[k + 2], names[k + 3] = 'tc', 'tf', 'ts'
  end
  return names
end

-- `success_fields(mode)` and, for an admission that carries successes
-- (carry.lua), `success_fields(mode, {'since'})`, by mode, built at their
-- first use (in a library, once).
local SUCCESS_FIELDS, CARRY_FIELDS = {}, {}

-- The fields an admission that carries successes reads (carry.lua): those
-- of `success` in mode `mode`, and `since`.
local function carry_fields(mode)
  local names = CARRY_FIELDS[mode]
  if not names then
    names = success_fields(mode, {'since'})
    CARRY_FIELDS[mode] = names
  end
  return names
end

-- The reply of a success: no transition, no cooldown.
local NOTHING = {0, 0, -1}

-- The time of the record at `o` in `A`: its caller's, else the server's.
local function success_now(A, o)
  if A[o + 1] == '' then
    local t = redis.call('TIME')
    return t[1] * 1000000 + t[2]
  end
  return tonumber(A[o + 1])
end

-- As httl() in prelude.lua, for a closed circuit: the TTL of the state
-- (milliseconds, formatted) of the record at `o` in `A` in circuit mode `mode`, of
-- window size `n`, state `h`; `now`: the record's time if read already.
local function success_ttl(A, o, h, mode, n, now)
  local t = A[o + 6] + 0
  if mode == 3 and n * 1000000 > t then t = n * 1000000 end
  if h.cu > 0 and A[o + 7] ~= '-1' then
    local c = h.cu - (now or success_now(A, o)) + A[o + 7]
    if c > t then t = c end
  end
  local m = math.ceil(t / 1000)
  if m < 1 then m = 1 end
  return string.format('%d', m)
end

local function success(K, A, o, H, F)
  local KH, KCW, KTW, KTZ, KB = K[1], K[2], K[3], K[4], K[5]
  local slot = A[o + 2]
  if slot ~= '-1' then
    if F then F[#F + 1] = slot else redis.call('ZREM', KB, slot) end
  end
  local mode = A[o + 4]
  if mode == '0' then return NOTHING end
  mode = tonumber(mode)

  local h = H
  if not h then
    local names = SUCCESS_FIELDS[mode]
    if not names then
      names = success_fields(mode)
      SUCCESS_FIELDS[mode] = names
    end
    local v = redis.call('HMGET', KH, unpack(names))
    h = {}
    for i = 1, #names do h[names[i]] = (v[i] or 0) + 0 end
  end
  if h.st ~= 0 or h.gen ~= A[o + 3] + 0 then
    -- Not closed, or a newer generation: not recorded.
    return NOTHING
  end
  local n = A[o + 5] + 0

  if mode == 1 then
    -- A success ends a run of failures.
    if h.cf > 0 then
      h.cf = 0
      redis.call('HSET', KH, 'cf', 0)
      redis.call('PEXPIRE', KH, success_ttl(A, o, h, mode, n))
    end
  elseif mode == 2 then
    local nh = h.nh
    -- A window with no failure and no slow call holds only zeros (the
    -- ring's positions past the head too: it starts empty), so a success
    -- written over one changes nothing: the ring is written, and kept,
    -- only while the window holds a failure or a slow call. A ring gone
    -- (expired) reads as zeros, the same.
    local coded = h.nf > 0 or h.ns > 0
    local old = 0
    if coded then
      old = redis.call('BITFIELD', KCW, 'SET', 'u2', '#' .. string.format('%d', nh % n), 0)[1]
    end
    -- Only the counts that change are written: once the window is full,
    -- the calls stay at its size, and a success replacing a success
    -- changes neither failures nor slow calls.
    local f = string.format
    local w = {'HSET', KH, 'nh', f('%d', nh + 1)}
    h.nh = nh + 1
    if nh < n then
      h.nc = h.nc + 1
      w[5], w[6] = 'nc', f('%d', h.nc)
    end
    if nh >= n and old % 2 == 1 then
      h.nf = h.nf - 1
      w[#w + 1], w[#w + 2] = 'nf', f('%d', h.nf)
    end
    if nh >= n and old >= 2 then
      h.ns = h.ns - 1
      w[#w + 1], w[#w + 2] = 'ns', f('%d', h.ns)
    end
    local t = success_ttl(A, o, h, mode, n)
    redis.call(unpack(w))
    redis.call('PEXPIRE', KH, t)
    if coded then redis.call('PEXPIRE', KCW, t) end
  else
    local tc, tf, ts = h.tc, h.tf, h.ts
    local now = success_now(A, o)
    local sec = math.floor(now / 1000000)
    local edge = sec - n
    local secs = string.format('%d', sec)
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
    h.tc, h.tf, h.ts = tc, tf, ts
    local t = success_ttl(A, o, h, mode, n, now)
    redis.call('HSET', KH, 'tc', tc, 'tf', tf, 'ts', ts)
    redis.call('PEXPIRE', KH, t)
    redis.call('PEXPIRE', KTW, t)
    redis.call('PEXPIRE', KTZ, t)
  end
  return NOTHING
end
