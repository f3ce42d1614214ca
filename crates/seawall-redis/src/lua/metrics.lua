-- The circuit's state and window, read only (a circuit not begun has been
-- closed since now).
-- Reply: {state, calls, failures, slow_calls, time_in_state_us, trips}

cspec()
local h = hload()
tnow()
local since = num(call('HGET', KH, 'since')) or since0
local calls, fails, slows = 0, 0, 0
if h.st == HALF_OPEN then
  -- The probes' own counts: a failed or slow probe trips at once.
  calls = h.pok
elseif MODE == 1 then
  -- Consecutive mode: the failures in a row of a closed circuit, kept on
  -- show by isolating or disabling it.
  if h.st == CLOSED or h.st == ISOLATED or h.st == DISABLED then calls, fails = h.cf, h.cf end
elseif MODE == 2 then
  calls, fails, slows = h.nc, h.nf, h.ns
else
  local sec = math.floor(now / 1000000)
  local live = call('ZRANGEBYSCORE', KTZ, '(' .. int(sec - MODE_N), '+inf')
  for i = 1, #live do
    local s = live[i]
    local v = call('HMGET', KTW, s .. 'c', s .. 'f', s .. 's')
    calls = calls + (num(v[1]) or 0)
    fails = fails + (num(v[2]) or 0)
    slows = slows + (num(v[3]) or 0)
  end
end
local in_state = now - since
if in_state < 0 then in_state = 0 end
return {h.st, calls, fails, slows, in_state, h.trips}
