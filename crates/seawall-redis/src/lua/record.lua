-- Records the outcome of an admitted attempt and gives back its permit.
-- ARGV[D..]: probe (0/1), generation, slot (-1: none), outcome (0 success,
-- 1 failure, 2 ignored), duration_us, retry_after_us (-1: none), shadowed
-- (1: the call was admitted over a refusal in shadow mode; the policies in
-- shadow mode record nothing of it; absent: 0)
-- Reply: {transition, trips, cooldown_us (-1: none)}
-- transition: 0 none, 2 opened, 3 closed

local probe, pgen, slot = A[D] == '1', num(A[D + 1]), A[D + 2]
local outcome, dur, ra = num(A[D + 3]), num(A[D + 4]), num(A[D + 5])
if A[D + 6] == '1' then
  -- A shadowed call: the circuit and the cooldown in shadow mode take
  -- nothing from it.
  if shadow(P.C) then HAS_C = false end
  if shadow(P.CD) then ra = -1 end
end

if slot ~= '-1' then call('ZREM', KB, slot) end

local tr, trips, cdout = 0, 0, -1
local h
local changed = {}
local function touch(names)
  for i = 1, #names do changed[#changed + 1] = names[i] end
end

if HAS_C or (HAS_CD and ra >= 0) then h = hload() end
if HAS_C then
  cspec()
  if cbegin(h) then touch({'since'}) end
end

if HAS_C then
  if outcome == 2 then
    -- Ignored: nothing is recorded; a probe slot is given back.
    if probe and h.gen == pgen and h.st == HALF_OPEN and h.pr > 0 then
      h.pr = h.pr - 1
      touch({'pr'})
    end
  elseif h.gen == pgen and (h.st == CLOSED or h.st == HALF_OPEN) then
    local fail = outcome == 1
    local slow = SR > 0 and dur >= SLOW
    if h.st == HALF_OPEN then
      if fail or slow then
        copen(h)
        tr = 2
      else
        h.pok = h.pok + 1
        touch({'pok'})
        if h.pok >= HOC then
          cclose(h)
          tr = 3
        end
      end
    elseif MODE == 1 then
      -- Consecutive failures.
      if fail then
        h.cf = h.cf + 1
        touch({'cf'})
        if h.cf >= MODE_N then
          copen(h)
          tr = 2
        end
      elseif h.cf > 0 then
        h.cf = 0
        touch({'cf'})
      end
    else
      local calls, fails, slows
      if MODE == 2 then
        -- Count window: a ring of N two-bit codes (failure, slow) written at
        -- head mod N; BITFIELD SET returns the code it overwrites.
        local code = 0
        if fail then code = code + 1 end
        if slow then code = code + 2 end
        local at = h.nh % MODE_N
        local old = call('BITFIELD', KCW, 'SET', 'u2', '#' .. int(at), code)[1]
        if h.nh >= MODE_N then
          h.nc = h.nc - 1
          if old % 2 == 1 then h.nf = h.nf - 1 end
          if old >= 2 then h.ns = h.ns - 1 end
        end
        h.nh = h.nh + 1
        h.nc = h.nc + 1
        if fail then h.nf = h.nf + 1 end
        if slow then h.ns = h.ns + 1 end
        touch({'nh', 'nc', 'nf', 'ns'})
        call('PEXPIRE', KCW, httl(h))
        calls, fails, slows = h.nc, h.nf, h.ns
      else
        -- Time window: one bucket per whole second, the last MODE_N seconds.
        local sec = math.floor(tnow() / 1000000)
        local edge = sec - MODE_N
        local secs = int(sec)
        local old = call('ZRANGEBYSCORE', KTZ, '-inf', edge)
        for i = 1, #old do
          local s = old[i]
          local v = call('HMGET', KTW, s .. 'c', s .. 'f', s .. 's')
          h.tc = h.tc - (num(v[1]) or 0)
          h.tf = h.tf - (num(v[2]) or 0)
          h.ts = h.ts - (num(v[3]) or 0)
          call('HDEL', KTW, s .. 'c', s .. 'f', s .. 's')
        end
        if #old > 0 then call('ZREMRANGEBYSCORE', KTZ, '-inf', edge) end
        if call('ZADD', KTZ, sec, secs) == 1 and #old == 0 and call('ZCARD', KTZ) == 1 then
          -- The only bucket: whatever the totals said has expired.
          h.tc, h.tf, h.ts = 0, 0, 0
        end
        call('HINCRBY', KTW, secs .. 'c', 1)
        h.tc = h.tc + 1
        if fail then
          call('HINCRBY', KTW, secs .. 'f', 1)
          h.tf = h.tf + 1
        end
        if slow then
          call('HINCRBY', KTW, secs .. 's', 1)
          h.ts = h.ts + 1
        end
        touch({'tc', 'tf', 'ts'})
        local ttl = httl(h)
        call('PEXPIRE', KTW, ttl)
        call('PEXPIRE', KTZ, ttl)
        calls, fails, slows = h.tc, h.tf, h.ts
      end
      -- Rates are judged only when a failed or slow call is recorded.
      if (fail or slow) and calls >= MINC and calls > 0
        and (fails / calls >= FR or (SR > 0 and slows / calls >= SR)) then
        copen(h)
        tr = 2
      end
    end
    if tr ~= 0 then touch(moved_fields()) end
    if tr == 3 then touch(window_fields()) end
    trips = h.trips
  end
end

if HAS_CD and ra >= 0 then
  -- A retry-after hint opens or extends the cooldown, never shrinks it.
  local pause = num(A[19])
  if ra > pause then ra = pause end
  if tnow() + ra > h.cu then
    h.cu = now + ra
    touch({'cu'})
  end
  if h.cu > now then cdout = h.cu - now end
end

if #changed > 0 then hsave(h, changed) end
return {tr, trips, cdout}
