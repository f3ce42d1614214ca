-- seawall-redis: the shared head of every script (see src/scripts.rs for
-- the layout of KEYS and ARGV). Times are microseconds, TTLs milliseconds.
-- Written for speed: every redis.call and every number converted costs
-- (`tonumber` of a string is a `strtod`), so state is read in one HMGET,
-- only changed fields are written, the server's clock is read only when a
-- decision needs it, and the spec's numbers are converted only where they
-- are used: an admission of a closed circuit converts four.

-- What one call of a script works with, set by `begin` (below) at its
-- start. A script run by `EVALSHA` calls it first; a function of a library
-- (src/scripts.rs) calls it with its own keys and arguments: the
-- definitions of this file then run once, when the library is loaded, and
-- every variable a call sets or reads here is set anew by `begin`.
-- The keys (KEYS, in the order of src/scripts.rs); KRB: the retry
-- budget's bucket (seawall::RetryBudget::shared).
local KH, KCW, KTW, KTZ, KB, KRL, KRB
-- The arguments, as ARGV has them in the generic scripts; an admission
-- script compiled for one spec (src/scripts.rs, `SpecScripts`) builds A
-- instead, the spec as constants in A[2..27].
local A
-- The server's clock decides, unless the caller's time was passed (tests).
-- A circuit begins with its first admission, record or control, which
-- writes its `since` (see `cbegin`); one not begun yet has been closed
-- since now, as in the in-memory store (`since0`).
-- `now` is in whole microseconds; `now_ns`, the nanoseconds past it
-- (0..999), is known on the caller's clock only and used by the rate
-- limiters, whose times are kept to the nanosecond.
local now, since0, now_ns
-- The resource's spec, fixed at bind time; each part parsed only when
-- configured, and only what every call of it uses. Read where used: the
-- idle time `A[14]`, the cooldown's longest pause `A[19]` and grace
-- `A[20]`.
local HAS_C, HAS_B, HAS_CD, HAS_R
-- The circuit's spec: its mode always, the rest by `cspec()` in the
-- scripts that judge or move the circuit and where a round of probes
-- starts or ends. HALF_MAX: the longest a round of probes blocks the next
-- one (the breaker's max_half_open, else the store's probe lease).
local MODE, MODE_N, FR, SR, SLOW, MINC, CD_BASE, CD_GROWTH, CD_MAX, HOC, HALF_MAX
local B_MAX, B_LEASE, R_ALG, R_LIMIT, R_TOL, R_INT, R_PER
-- The policies in shadow mode, a bit each (see `shadow`).
local SHADOW
-- The state hash as an admission carrying successes read it (carry.lua),
-- with the successes' writes: the admission takes it instead of reading
-- the hash again.
local CARRIED_H
-- The slots of the successes an admission carries (carry.lua), which the
-- admission frees, or takes over for itself (admit.lua).
local FREED
-- An admission may leave out the last values of its reply that are the
-- defaults (admit.lua); a lease reads them all (lease.lua).
local SHORT_REPLY
-- `redis.call` and `tonumber`, as every script with this prelude calls
-- them (a local is read faster than a global, and written shorter): set
-- by `begin`, since a library's load has neither yet.
local call, num
-- Where the operation's own arguments start in A.
local D = 28
-- Where an admission's own arguments start in A: at D, or past the
-- successes it carries (carry.lua).
local OWN

-- The specs given to this library in full (see `call_args`), by their id,
-- typed as a script compiled for its spec has them: kept as long as the
-- library (the server's Lua state), emptied once SPECS_MAX are held, so
-- that specs that come and go never grow it without bound.
local SPECS, specs_n, SPECS_MAX = {}, 0, 1024

-- A GCRA time or duration, kept as `microseconds:nanoseconds` (the
-- nanoseconds 0..999), as two integers. A plain number (a state written by
-- an earlier version, in fractional microseconds) is read rounded up to
-- the nanosecond. A pair already split, `{microseconds, nanoseconds}` (the
-- GCRA spec of a script compiled for its spec), is taken as it is.
local function upair(s)
  if type(s) == 'table' then return s[1], s[2] end
  local u, n = string.match(s, '^(%d+):(%d+)$')
  if u then return num(u), num(n) end
  local x = num(s) or 0
  u = math.floor(x)
  n = math.ceil((x - u) * 1000)
  if n >= 1000 then u, n = u + 1, n - 1000 end
  return u, n
end

-- A spec sent in full (`ARGV[3..28]`), typed as `script_text::compiled`
-- writes a script's spec: the flags and the shadow bits (`A[2]`, `A[15]`,
-- `A[18]`, `A[21]`, `A[27]`) as the strings they are, compared as such;
-- the pairs (`A[25]`, `A[26]`) split (`upair`, which reads a pair split
-- or not the same); every other value as
-- `tonumber` gives it, or the string when it gives nothing. Every use of a
-- value of the spec is one of these (a flag compared, a pair split, a
-- number converted), so a typed spec gives the same answers as the
-- strings.
local function typed(ARGV)
  local S = {}
  for i = 2, 27 do
    local v = ARGV[i + 1]
    if i == 2 or i == 15 or i == 18 or i == 21 or i == 27 then
      S[i] = v
    elseif i == 25 or i == 26 then
      S[i] = {upair(v)}
    else
      S[i] = num(v) or v
    end
  end
  return S
end

-- The arguments of a call as the scripts read them (A): the time, the
-- spec in `A[2..27]`, the operation's own from `A[28]` (D). A call sends
-- its spec in one of three forms:
-- - as 26 arguments (`ARGV[2..27]`): A is ARGV;
-- - by its id (`ARGV[2]`, `#` and the SHA-1 of the spec), the operation's
--   arguments from `ARGV[3]`: the spec as this library holds it (nil when
--   it holds none of that id: the caller sends the call again in full);
-- - in full with its id (`ARGV[2]`, `=` and the same SHA-1), then the 26
--   values, then the operation's arguments: held from now on.
-- An admission as a function sends its spec in full once, then by id;
-- every other call sends the 26 arguments (src/store.rs). A script
-- compiled for its spec (`SpecScripts`) builds its own A instead, where
-- this function is called.
local function call_args(ARGV)
  local form = string.byte(ARGV[2] or '', 1)
  local S, rest
  if form == 35 then
    S, rest = SPECS[ARGV[2]], 3
    if not S then return nil end
  elseif form == 61 then
    S, rest = typed(ARGV), 29
    if specs_n >= SPECS_MAX then SPECS, specs_n = {}, 0 end
    SPECS['#' .. string.sub(ARGV[2], 2)], specs_n = S, specs_n + 1
  else
    return ARGV
  end
  -- The held spec is the call's A: its own values set in place (the time
  -- in `A[1]`, the operation's arguments from `A[D]`, those of an earlier
  -- call past them cleared), rather than copied into a new table. Calls
  -- of a library run one at a time, and no script writes `A[2..27]`.
  S[1] = ARGV[1]
  local j = D
  for i = rest, #ARGV do
    S[j] = ARGV[i]
    j = j + 1
  end
  while S[j] ~= nil do
    S[j] = nil
    j = j + 1
  end
  return S
end

-- Sets every variable above for a call with keys `KEYS` and arguments
-- `ARGV`: nothing of an earlier call is left. `true` when the call names
-- a spec this library does not hold (see `call_args`): the call is to end at
-- once, with the error `SEAWALLSPEC`, having done nothing.
local function begin(KEYS, ARGV)
  call, num = redis.call, tonumber
  KH, KCW, KTW, KTZ, KB, KRL, KRB = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
  A = call_args(ARGV)
  if not A then return true end
  now, since0, now_ns = nil, nil, 0
  HAS_C, HAS_B, HAS_CD, HAS_R = A[2] == '1', A[15] == '1', A[18] == '1', A[21] == '1'
  MODE, MODE_N, FR, SR, SLOW, MINC, CD_BASE, CD_GROWTH, CD_MAX, HOC, HALF_MAX = 0
  if HAS_C then MODE = num(A[3]) end
  B_MAX, B_LEASE, R_ALG, R_LIMIT, R_TOL, R_INT, R_PER = nil
  if HAS_B then B_MAX, B_LEASE = num(A[16]), num(A[17]) end
  if HAS_R then
    R_ALG = num(A[22])
    if R_ALG == 1 then
      -- GCRA's tolerance and emission interval, as `microseconds:nanoseconds`
      -- (parsed with `upair` by the scripts that use them), or split already.
      R_TOL, R_INT = A[25], A[26]
    elseif R_ALG == 2 then
      -- The fixed window's windows are aligned on multiples of its period
      -- to the nanosecond, as in memory: the period as a pair too (in A[25],
      -- parsed with `upair` by `fwindow` and `fstart`).
      R_LIMIT, R_PER = num(A[23]), A[25]
    else
      -- The sliding log keeps its times to the nanosecond: its period as a
      -- pair (in A[25], parsed with `upair` where used).
      R_LIMIT, R_PER = num(A[23]), A[25]
    end
  end
  SHADOW = 0
  if A[27] ~= '0' then SHADOW = num(A[27]) or 0 end
  CARRIED_H, FREED, OWN = nil, nil, D
  SHORT_REPLY = true
end

local function tnow()
  if not now then
    if A[1] == '' then
      local t = call('TIME')
      now = t[1] * 1000000 + t[2]
    else
      -- The caller's time: `microseconds[:nanoseconds]`.
      local u, n = string.match(A[1], '^(%d+):?(%d*)$')
      now = num(u)
      now_ns = num(n) or 0
    end
    since0 = now
  end
  return now
end

local function cspec()
  MODE_N = num(A[4])
  FR, SR, SLOW, MINC = num(A[5]), num(A[6]), num(A[7]), num(A[8])
  CD_BASE, CD_GROWTH, CD_MAX = num(A[9]), num(A[10]), num(A[11])
  HOC, HALF_MAX = num(A[12]), num(A[13])
end

-- Policies, as the bits of SHADOW: the circuit, the bulkhead, the cooldown
-- and the rate limiter (a table: a library's function holds at most 60
-- upvalues).
local P = {C = 1, B = 2, CD = 4, R = 8}
-- `true` when the policy `p` runs in shadow mode (seawall::shadow): it
-- never refuses; a call it would refuse goes on, shadowed, and the
-- policies in shadow mode hold and record nothing of it.
local function shadow(p)
  return SHADOW ~= 0 and math.floor(SHADOW / p) % 2 == 1
end

-- Circuit states.
local CLOSED, OPEN, HALF_OPEN, ISOLATED, DISABLED = 0, 1, 2, 3, 4

-- The end of an open period that is kept as "until the latest instant":
-- an end at or after 2^42 - 1 ms (the in-memory store's limit) never
-- shortens the cooldown. Above every caller's clock (at most 2^64 ns).
local FOREVER = 2 ^ 62
local FOREVER_FROM_MS = 4398046511103

-- Integers sent back to Redis (TTLs, slot ids, bucket names) are
-- formatted explicitly: a Lua number may otherwise reach Redis as
-- `1.7e+15`, which is not an integer to PEXPIRE nor the same member to
-- ZREM. Cheaper too: Redis writes a number argument with `%.17g`, which
-- costs several times a `%d`.
local function int(n)
  return string.format('%d', n)
end

-- A TTL in milliseconds (at least 1) for `us` microseconds plus `extra_ms`.
local function ms(us, extra_ms)
  local v = math.ceil(us / 1000) + (extra_ms or 0)
  if v < 1 then v = 1 end
  return int(v)
end

-- The nanoseconds (0..999) of a sliding-log entry: its member is named
-- `nanoseconds:id`, its score the whole microseconds, so that entries of
-- one microsecond sort by their nanoseconds (zero-padded to 3 digits).
local function lns(m) return num(m:match('^(%d+):')) or 0 end

-- The sum and the difference of two pairs, the nanoseconds brought back to
-- 0..999 (a difference may have negative microseconds), so that the
-- arithmetic is exact integer arithmetic on nanoseconds.
local function padd(au, an, bu, bn)
  local u, n = au + bu, an + bn
  if n >= 1000 then u, n = u + 1, n - 1000 end
  return u, n
end
local function psub(au, an, bu, bn)
  local u, n = au - bu, an - bn
  if n < 0 then u, n = u - 1, n + 1000 end
  return u, n
end
-- `true` when the pair `a:b` is later than `c:d`.
local function later(a, b, c, d) return a > c or (a == c and b > d) end
-- A pair times a whole number `k >= 0`.
local function pmul(u, n, k)
  local total = n * k
  return u * k + math.floor(total / 1000), total % 1000
end

-- The whole periods `pu:pn` in the pair `xu:xn`, from about `c`: `c`
-- periods end at or before it, `c + 1` after it.
local function pfit(c, xu, xn, pu, pn)
  if c < 0 then c = 0 end
  while true do
    local cu, cn = pmul(pu, pn, c)
    if c > 0 and later(cu, cn, xu, xn) then
      c = c - 1
    else
      local eu, en = padd(cu, cn, pu, pn)
      if later(eu, en, xu, xn) then return c end
      c = c + 1
    end
  end
end

-- The fixed window of the instant `u:n` (a pair): its index, the instant
-- over the period rounded down, to the nanosecond as in memory, whatever
-- the period (1/3 s is no whole number of microseconds, 500 ns less than
-- one). Exact integer arithmetic on doubles while the index stays below
-- 2^53 (always, for a period of 1 us or more).
local function fwindow(u, n)
  local pu, pn = upair(R_PER)
  if pn == 0 then
    -- Whole microseconds: the nanoseconds never reach the next window.
    local t = math.fmod(u, pu)
    return (u - t) / pu
  end
  local p = pu * 1000 + pn
  if p > 2 ^ 53 then
    -- A period over 2^53 ns (104 days) fits fewer than 1024 times in the
    -- clock: the index is the fitted quotient.
    return pfit(math.floor((u * 1000 + n) / p), u, n, pu, pn)
  end
  -- u = s p + t (microseconds counted as plain numbers): the instant holds
  -- 1000 s periods, and those of t microseconds and n nanoseconds (fewer
  -- than 1000).
  local t = math.fmod(u, p)
  local s = (u - t) / p
  return s * 1000 + pfit(math.floor((t * 1000 + n) / p), t, n, pu, pn)
end

-- The start of the fixed window of index `w`, as a pair (`w` periods).
local function fstart(w)
  local pu, pn = upair(R_PER)
  local p = pu * 1000 + pn
  if w < 1000 or p > 2 ^ 53 then return pmul(pu, pn, w) end
  -- 1000 periods are `p` microseconds.
  local wr = math.fmod(w, 1000)
  local u, n = pmul(pu, pn, wr)
  return u + (w - wr) / 1000 * p, n
end

-- The fields of the state hash (the circuit's and the cooldown's end,
-- 'cu'), and those an admission reads.
local ALL_FIELDS = {'st', 'gen', 'trips', 'ou', 'since', 'pr', 'pok', 'cf',
  'nc', 'nf', 'ns', 'nh', 'tc', 'tf', 'ts', 'cu', 'ol'}
local ADMIT_FIELDS = {'st', 'gen', 'since', 'cu'}

-- Loads `names` (all fields when nil) from the state hash into a table;
-- missing ones are 0. A missing `since` (asked for) marks a circuit not
-- begun: `h.unbegun`. The table is built with the fields an admission
-- and the successes it carries use (a table grown one field at a time is
-- rehashed as it grows), and a value read is converted by arithmetic
-- (`tonumber` converts a string twice).
local function hload(names)
  names = names or ALL_FIELDS
  local v = call('HMGET', KH, unpack(names))
  local h = {st = 0, gen = 0, since = 0, cu = 0, trips = 0, ou = 0, pr = 0, pok = 0,
    nh = 0, nc = 0, nf = 0, ns = 0}
  for i = 1, #names do
    local x = v[i]
    if x then
      h[names[i]] = x + 0
    elseif names[i] == 'since' then
      h.unbegun = true
    else
      h[names[i]] = 0
    end
  end
  return h
end

-- `hload(names)` for an admission (`names`: ADMIT_FIELDS when nil), whose
-- names leave out the fields that a closed circuit holds at 0 (its trips,
-- open end and probes: every way to closed, `cclose`, and a circuit not
-- begun leave them so), which are read only when the circuit is not
-- closed.
local function hload_admit(names)
  local h = hload(names or ADMIT_FIELDS)
  -- Closed: those fields are 0 as `hload` built them.
  if h.st ~= CLOSED then
    local v = call('HMGET', KH, 'trips', 'ou', 'pr', 'pok')
    h.trips, h.ou = (v[1] or 0) + 0, (v[2] or 0) + 0
    h.pr, h.pok = (v[3] or 0) + 0, (v[4] or 0) + 0
  end
  return h
end

-- Begins a circuit not begun (its first admission, record or control):
-- closed since now. `true` when it did: `since` is then to be saved.
local function cbegin(h)
  if not h.unbegun then return false end
  h.unbegun = nil
  h.since = tnow()
  return true
end

-- Whether a call of weight `w` can ever pass the rate limiter (the
-- in-memory `weight_fits`): 1 <= w <= burst for GCRA (the last of its `w`
-- permits must fit in the tolerance), 1 <= w <= limit for the windows.
local function rfits(w)
  if w < 1 then return false end
  if R_ALG == 1 then
    local iu, inn = upair(R_INT)
    local eu, en = pmul(iu, inn, w - 1)
    local tu, tn = upair(R_TOL)
    return eu < tu or (eu == tu and en <= tn)
  end
  return w <= R_LIMIT
end

-- How long the state hash is kept: the idle time plus what is left of an
-- open period, at least a time window, at least the cooldown plus grace.
local function httl(h)
  local ttl = num(A[14])
  if h.st == OPEN and h.ou > tnow() then
    -- Open until the latest instant: kept for a year past the idle time.
    if h.ou == FOREVER then ttl = ttl + 31536000000000 else ttl = ttl + (h.ou - now) end
  end
  if MODE == 3 and num(A[4]) * 1000000 > ttl then ttl = num(A[4]) * 1000000 end
  if HAS_CD and (h.cu or 0) > 0 then
    local c = h.cu - tnow() + num(A[20])
    if c > ttl then ttl = c end
  end
  return ms(ttl)
end

-- Sets the state hash's TTL (httl), or none while the circuit is isolated
-- or disabled: a forced state holds until reset or enable, however long no
-- call comes, as in memory.
local function hexpire(h)
  if h.st == ISOLATED or h.st == DISABLED then
    call('PERSIST', KH)
  else
    call('PEXPIRE', KH, httl(h))
  end
end

-- Writes the fields named in `names`, and the TTL.
local function hsave(h, names)
  local args = {'HSET', KH}
  for i = 1, #names do
    args[#args + 1] = names[i]
    args[#args + 1] = h[names[i]]
  end
  call(unpack(args))
  hexpire(h)
end

-- Fields a transition writes, and the window's. `ol`: the duration of the
-- explicit open (control.lua) the circuit is open or half-open after, in
-- microseconds plus one (0: none, the circuit opened for a cooldown);
-- every other transition clears it.
local function moved_fields() return {'st', 'gen', 'trips', 'ou', 'since', 'pr', 'pok', 'cf', 'ol'} end
local function window_fields() return {'nc', 'nf', 'ns', 'nh', 'tc', 'tf', 'ts'} end

local function cooldown_for(trips)
  local cd = CD_BASE
  if CD_GROWTH > 1 and trips > 1 then
    cd = CD_BASE * CD_GROWTH ^ (trips - 1)
    if cd ~= cd or cd >= CD_MAX then cd = CD_MAX end
  end
  return math.floor(cd)
end

-- The end of a cooldown of `cd` from `t`, in whole milliseconds rounded up
-- (as the in-memory store keeps it), or FOREVER.
local function open_until(t, cd)
  local e = t + cd
  local r = math.fmod(e, 1000)
  if r > 0 then e = e - r + 1000 end
  if e / 1000 >= FOREVER_FROM_MS then return FOREVER end
  return e
end

-- Closed or half-open to open. Trips saturate at 63 like the in-memory
-- store's. The window that opened it is kept (for metrics) until the
-- circuit half-opens.
local function copen(h)
  if h.st == HALF_OPEN then h.trips = h.trips + 1 else h.trips = 1 end
  if h.trips > 63 then h.trips = 63 end
  h.st = OPEN
  h.gen = h.gen + 1
  h.since = tnow()
  h.pr, h.pok, h.cf, h.ol = 0, 0, 0, 0
  h.ou = open_until(now, cooldown_for(h.trips))
end

-- An empty window (and no failure in a row): on half-opening and closing.
local function cclear(h)
  h.cf = 0
  h.nc, h.nf, h.ns, h.nh, h.tc, h.tf, h.ts = 0, 0, 0, 0, 0, 0, 0
  call('DEL', KCW, KTW, KTZ)
end

-- Back to closed with an empty window and no trip history.
local function cclose(h)
  h.st = CLOSED
  h.gen = h.gen + 1
  h.since = tnow()
  h.pr, h.pok, h.trips, h.ou, h.ol = 0, 0, 0, 0, 0
  cclear(h)
end

-- Gives back the `w` rate-limit permits reserved for instant `at_u:at_n`
-- (microseconds and nanoseconds) where the state can tell them apart (as
-- the in-memory rules do): GCRA while the TAT is still the one it set (to
-- the nanosecond; it moves back by `w` intervals), the fixed window while
-- its window is the last one counted (an emptied one kept as the window
-- before it, full), the sliding log by taking out `w`
-- entries at `at_u:at_n`.
local function rgive(at_u, at_n, w)
  if not HAS_R then return end
  if R_ALG == 1 then
    local stored = call('GET', KRL)
    if not stored then return end
    local tu, tn = upair(stored)
    local su, sn = padd(at_u, at_n, upair(R_TOL))
    local iu, inn = upair(R_INT)
    local eu, en = padd(su, sn, iu, inn)
    if tu == eu and tn == en then
      local bu, bn = psub(eu, en, pmul(iu, inn, w))
      call('SET', KRL, int(bu) .. ':' .. int(bn), 'KEEPTTL')
    end
  elseif R_ALG == 2 then
    local v = call('HMGET', KRL, 'w', 'n')
    local n = num(v[2]) or 0
    local win = num(v[1])
    if win == fwindow(at_u, at_n) and n >= w and w > 0 then
      if n == w and win > 0 then
        -- An emptied window is kept as the one before it, full (the same
        -- state for every call), as the in-memory rule does.
        call('HSET', KRL, 'w', win - 1, 'n', R_LIMIT)
      else
        call('HSET', KRL, 'n', n - w)
      end
    end
  else
    for _, m in ipairs(call('ZRANGEBYSCORE', KRL, at_u, at_u)) do
      if w > 0 and lns(m) == at_n then call('ZREM', KRL, m) w = w - 1 end
    end
  end
end
