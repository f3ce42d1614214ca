-- Admits one attempt through circuit, bulkhead, cooldown, retry budget and
-- rate limit, in that order, all or nothing: every check runs first, then the permits are
-- taken together, so a later refusal never leaves a probe or a slot taken.
-- A refusal by a policy in shadow mode (SHADOW) does not end the
-- admission: the first is kept as the shadow refusal, the later policies
-- in shadow mode are not asked, and the policies in shadow mode take
-- nothing for the call (seawall::shadow); the enforcing ones are asked and
-- take their permits as usual.
-- A call shadowed already (seawall::store::AdmitRequest::shadowed: a policy
-- in shadow mode it met before this admission would have refused it) starts
-- the walk shadowed: no policy in shadow mode takes part, the enforcing
-- ones do, and the reply reports no shadow refusal of its own.
-- A[OWN] (A[D], or past the successes carried, see carry.lua): the step
-- of the retry budget kept in the store, empty for none: `step:earn:cap`,
-- step 1 a call's deposit, 2 a retry's withdrawal; earn and cap in
-- thousandths of a token (seawall::retry::BudgetRule, restated below; a
-- model test holds the two to the same answers); preceded by `s` for a
-- call shadowed already.
-- A[E..] (E = OWN + 1; only for a rate limiter whose calls may wait): the
-- lead within which a refused rate limit reserves its next permit, the instant of a
-- due reservation the call presents (-1: none), which stands for the
-- rate-limit permit and is given back when an earlier policy refuses;
-- both as `microseconds:nanoseconds`; then the weight of the call (absent:
-- 1; passed with a lead of 0 and no reservation by a weighted call whose
-- limiter never waits): the rate-limit permits it takes, all or none. A
-- weight that never fits (`rfits`) is refused at once, before any other
-- check, with rate_limited and no retry_after.
-- Reply: {reason, retry_after_us, probe, generation, slot (-1: none), transition, trips,
--   under_ns, reserved_at_us (-1: none), reserved_at_ns, shadow_reason, shadow_retry_after_us,
--   shadow_under_ns}: a reserved permit comes with reason 4; the last eight
--   left out (a reply of five) when they are 0, 0, 0, -1, 0, 0, -1, 0 (no
--   transition, trips, wait, reservation nor shadow refusal: the admission
--   of a closed circuit, `ADMIT_TAIL` in src/scripts.rs), unless
--   SHORT_REPLY is off (a lease)
-- retry_after_us: -1 none, -2 the cooldown of the current trip (half-open,
-- every probe slot taken), -3 until the latest instant, -4 - d (d >= 0):
-- d microseconds, the duration of the explicit open the circuit is
-- half-open after (every probe slot taken)
-- under_ns: nanoseconds (0..999) the exact wait is shorter than
-- retry_after_us (GCRA and the sliding log keep their times to the
-- nanosecond, the fixed window its caller's `now`)
-- reserved_at: the instant of the reserved permit, on the script's clock
-- (microseconds, and the nanoseconds past them 0..999)
-- reason: 0 admitted, 1 circuit_open, 2 bulkhead_full, 3 cooldown_active, 4 rate_limited,
-- 5 retry_budget_exhausted
-- shadow_reason (and its retry_after, under): the refusal of a policy in
-- shadow mode that an admitted call went on over (0: none)
-- transition: 0 none, 1 half-opened, 4 a new round of probes

local reason, retry, under = 0, -1, 0
local sreason, sretry, sunder = 0, -1, 0
local probe, gen, slot, tr = 0, 0, -1, 0
local h, moved, begun

-- The call is shadowed already (`s` before the budget's argument).
local PRE = false
local BARG = A[OWN]
if BARG and string.byte(BARG, 1) == 115 then PRE, BARG = true, string.sub(BARG, 2) end

-- Whether the policy `p` takes part in the call (shadow::Walk): an
-- enforcing one always, one in shadow mode until the call is shadowed
-- (by a refusal here, or before this admission).
-- One that does not is not asked, and takes nothing (the permits are
-- taken once every check ran).
local function takes_part(p)
  return not shadow(p) or (sreason == 0 and not PRE)
end
-- A refusal by the policy `p`: the answer when it enforces; the first
-- refusal in shadow mode is kept, and the call goes on.
local function refused(p, why, wait, less)
  if shadow(p) then
    if sreason == 0 then sreason, sretry, sunder = why, wait, less or 0 end
  else
    reason, retry, under = why, wait, less or 0
  end
end

local E = OWN + 1

-- The retry budget (BudgetRule): a bucket of thousandths of a token,
-- full when missing, kept while used (it expires after the idle time, full
-- again). A call deposits `earn`, never above the cap (a bucket at or
-- above it is left as it is), whatever the answer; a retry withdraws 1000
-- from a bucket holding at least that, once every other check admits it,
-- and is refused otherwise.
local BSTEP, BEARN, BCAP, btok
if BARG and BARG ~= '' then BSTEP, BEARN, BCAP = string.match(BARG, '^(%d):(%d+):(%d+)$') end
if BSTEP then
  BSTEP, BEARN, BCAP = num(BSTEP), num(BEARN), num(BCAP)
  btok = num(call('GET', KRB)) or BCAP
  if BSTEP == 1 and btok < BCAP then
    btok = btok + BEARN
    if btok > BCAP then btok = BCAP end
    call('SET', KRB, int(btok), 'PX', ms(num(A[14])))
  end
end

local RW = num(A[E + 2]) or 1
if HAS_R and RW ~= 1 and takes_part(P.R) and not rfits(RW) then
  refused(P.R, 4, -1, 0)
  if reason ~= 0 then
    if FREED and #FREED > 0 then call('ZREM', KB, unpack(FREED)) end
    return {4, -1, 0, 0, -1, 0, 0, 0, -1, 0, 0, -1, 0}
  end
end

if HAS_C or HAS_CD then
  if HAS_C then
    h = CARRIED_H or hload_admit()
  else
    h = hload({'cu'})
  end
end

-- The first admission begins the circuit (one that takes part).
if HAS_C and takes_part(P.C) then begun = cbegin(h) end

if HAS_C and takes_part(P.C) then
  -- The circuit's refusal, if any: its retry_after code.
  local cref
  if h.st == ISOLATED then
    cref = -1
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
      cref = -3
    else
      cref = h.ou - now
    end
  end
  if not cref and h.st == HALF_OPEN then
    cspec()
    -- A round of probes older than HALF_MAX (from the round's start,
    -- `since`, its end in whole milliseconds as open_until has it) no
    -- longer blocks: with every slot taken, a new round starts (the old
    -- probes are of an older generation). Processes that died mid-probe
    -- never report: this frees their slots too.
    if h.pr >= HOC and HALF_MAX > 0 then
      local ends = open_until(h.since, HALF_MAX)
      if ends ~= FOREVER and tnow() >= ends then
        h.gen = h.gen + 1
        h.since = now
        h.pr, h.pok = 0, 0
        tr = 4
        moved = true
      end
    end
    if h.pr < HOC then
      probe = 1
    else
      -- The length of the open period that ended: after an explicit open
      -- its duration (`ol`, microseconds plus one), else the cooldown of
      -- the trips.
      local ol = num(call('HGET', KH, 'ol')) or 0
      if ol > 0 then cref = -3 - ol else cref = -2 end
    end
  end
  if h.st == ISOLATED or h.st == DISABLED then
    -- Forced states have no TTL (hexpire): they hold until reset or
    -- enable, however long no call comes.
    call('PERSIST', KH)
  end
  -- A call the circuit refuses (in shadow mode: admitted) has no
  -- generation of it.
  if cref then refused(P.C, 1, cref, 0) else gen = h.gen end
end

-- The slots of the carried successes (FREED) are free before the
-- bulkhead counts: the last one is taken over by this admission, its
-- lease renewed (one command, rather than freeing it and taking another),
-- and not counted as one of the others; when the admission does not take
-- its slot, it is freed at the end with the rest. One that is gone (its
-- lease ended and was dropped), or whose lease the renewal leaves as it
-- was (no change to tell it from one gone), is freed now, with the rest.
local took_b, renewed = false, nil
if reason == 0 and HAS_B and takes_part(P.B) then
  local taken = 0
  if FREED and #FREED > 0 then
    if call('ZADD', KB, 'XX', 'CH', int(tnow() + B_LEASE), FREED[#FREED]) == 1 then
      renewed, taken = table.remove(FREED), 1
    end
    if #FREED > 0 then
      call('ZREM', KB, unpack(FREED))
      FREED = {}
    end
  end
  if call('ZCOUNT', KB, '(' .. int(tnow()), '+inf') - taken >= B_MAX then
    refused(P.B, 2, -1, 0)
  else
    took_b = true
  end
end

if reason == 0 and HAS_CD and takes_part(P.CD) and h.cu > tnow() then
  refused(P.CD, 3, h.cu - now, 0)
end

-- The budget is asked after the cooldown, before the rate limiter: a retry
-- with less than one token is refused; its token is taken below, with the
-- other permits.
if reason == 0 and BSTEP == 2 and btok < 1000 then
  reason, retry, under = 5, -1, 0
end

local R_RES = A[E] ~= nil
local R_SHADOW = HAS_R and shadow(P.R)
local WU, WN = 0, 0
-- A limiter in shadow mode never makes a call wait: no lead.
if R_RES and not R_SHADOW then WU, WN = upair(A[E]) end
-- `u:n` (nanoseconds 0..999) is at most the lead.
local function within(u, n) return not later(u, n, WU, WN) end
-- A refusal's exact wait `wait_u:wait_n`: retry_after_us rounded up, and
-- how much shorter the exact wait is.
local function retry_of(wait_u, wait_n)
  if wait_n > 0 then return wait_u + 1, 1000 - wait_n end
  return wait_u, 0
end
local HELD = A[E + 1] ~= nil and A[E + 1] ~= '-1'

-- rnew: the rate limiter's next state; rat: the instant of a reserved
-- permit as a pair (the state then moves although the call is refused);
-- rlog: the instant a sliding-window admission is logged at; rref: the
-- limiter's refusal {retry_after, under}.
local rnew, rat, rlog, rref
local took_r = false
if reason == 0 and HAS_R and not HELD and takes_part(P.R) then
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
    local stored = call('GET', KRL)
    if stored then tu, tn = upair(stored) end
    if later(now, now_ns, tu, tn) then tu, tn = now, now_ns end
    -- The call's last permit is RW - 1 intervals after the TAT; the TAT
    -- moves by RW intervals.
    local xu, xn = pmul(int_u, int_n, RW - 1)
    local lu, ln = padd(tu, tn, xu, xn)
    local nu, nn = padd(lu, ln, int_u, int_n)
    -- The wait: TAT + (RW - 1) intervals - now - tolerance; refused when
    -- it is positive.
    local du, dn = psub(lu, ln, now, now_ns)
    du, dn = psub(du, dn, tol_u, tol_n)
    if later(du, dn, 0, 0) then
      rref = {retry_of(du, dn)}
      -- Reserved when the wait is within the lead: the TAT moves as for an
      -- admission, the permits are for now + wait.
      if within(du, dn) then
        rnew = {nu, nn}
        rat = {padd(now, now_ns, du, dn)}
      end
    else
      rnew = {nu, nn}
    end
  elseif R_ALG == 2 then
    -- Fixed window: the last window with a permit taken and its count;
    -- every window from the caller's up to it counts as full. The next free
    -- permit is in that window if it is not full, else in the one after: a
    -- call in it passes, any other retries when it starts.
    local w = fwindow(now, now_ns)
    local v = call('HMGET', KRL, 'w', 'n')
    local lw, n = num(v[1]), num(v[2]) or 0
    if not lw or lw < w then lw, n = w, 0 end
    if n + RW > R_LIMIT then lw, n = lw + 1, 0 end
    rnew = n + RW
    if lw ~= w then
      -- The wait, to the caller's nanosecond, until the window starts.
      local au, an = fstart(lw)
      local du, dn = psub(au, an, now, now_ns)
      rref = {retry_of(du, dn)}
      if within(du, dn) then rat = {au, an} else rnew = nil end
    end
  else
    -- Sliding window: the log of the admissions of the last period (and
    -- the reservations), RW entries per call; the entry R_LIMIT - RW + 1
    -- places back decides. Entries are kept to the nanosecond, as the
    -- in-memory log's: scored by their whole microseconds, named after
    -- their nanoseconds (see `lns`). An entry is expired once it is a
    -- period old: those of earlier microseconds than now - period go; the
    -- few of that microsecond may stay, judged as expired where they are.
    call('ZREMRANGEBYSCORE', KRL, '-inf', '(' .. int(psub(now, now_ns, upair(R_PER))))
    local card = call('ZCARD', KRL)
    local function entry(i)
      local e = call('ZRANGE', KRL, i, i, 'WITHSCORES')
      return num(e[2]), lns(e[1])
    end
    -- The later of `u:n` and the newest entry: entries are never logged
    -- earlier than the newest one.
    local function newer(u, n)
      if R_RES and card > 0 then
        local lu, ln = entry(-1)
        if later(lu, ln, u, n) then return lu, ln end
      end
      return u, n
    end
    local wu, wn, fu, fn = 0, 0
    if card > R_LIMIT - RW then
      fu, fn = entry(card - R_LIMIT + RW - 1)
      fu, fn = padd(fu, fn, upair(R_PER))
      wu, wn = psub(fu, fn, now, now_ns)
    end
    if later(wu, wn, 0, 0) then
      -- Refused until that entry is a period old; reserved then (or at
      -- the newest entry, if later) when that is within the lead: the
      -- call waits for its reserved instant.
      local au, an = newer(fu, fn)
      local du, dn = psub(au, an, now, now_ns)
      if within(du, dn) then wu, wn, rat = du, dn, {au, an} rlog = rat end
      rref = {retry_of(wu, wn)}
    else
      local lu, ln = newer(now, now_ns)
      rlog = {lu, ln}
      -- Behind a newer entry (a reservation): the permit is for its
      -- instant, a reservation the call waits for (as the in-memory log).
      if later(lu, ln, now, now_ns) then
        rref = {retry_of(psub(lu, ln, now, now_ns))}
        rat = rlog
      end
    end
  end
  if rref then
    -- A limiter in shadow mode reserves nothing.
    if R_SHADOW then rnew, rat, rlog = nil, nil, nil end
    refused(P.R, 4, rref[1], rref[2])
  else
    took_r = true
  end
end

-- A due reservation presented to a policy checked before the rate limit
-- that refuses is given back.
if HELD and reason ~= 0 then
  local hu, hn = upair(A[E + 1])
  rgive(hu, hn, RW)
end

-- A unique member of a sorted set, named after the current microsecond
-- (the next free one when taken). Past 2^53 us `id + 1` is `id` in a
-- double: the step is then the gap to the next double (2 or 4 us), so
-- that every try names another member and the loop ends, whatever the
-- clock. Only the member's name moves: the score is the caller's. `name`:
-- a prefix of the member's name (the sliding log's nanoseconds).
local function add_unique(key, score, name)
  local id = now
  local step = 1
  while id + step == id do step = step * 2 end
  while call('ZADD', key, 'NX', score, (name or '') .. int(id)) == 0 do id = id + step end
  return id
end

if reason == 0 then
  if probe == 1 and takes_part(P.C) then
    h.pr = h.pr + 1
    moved = true
  else
    probe = 0
  end
  if took_b and takes_part(P.B) then
    -- Leases expired by dead processes are dropped now and then.
    if now % 16 == 0 then call('ZREMRANGEBYSCORE', KB, '-inf', now) end
    if renewed then
      slot, renewed = num(renewed), nil
    else
      slot = add_unique(KB, int(now + B_LEASE))
    end
    call('PEXPIRE', KB, ms(B_LEASE, 1000))
  end
end

-- The rate limiter's permit: taken by an admission (unless a due
-- reservation stands for it), or reserved for `rat`.
if HAS_R and ((reason == 0 and took_r and takes_part(P.R)) or rat) then
  if R_ALG == 1 then
    call('SET', KRL, string.format('%d:%d', rnew[1], rnew[2]), 'PX', ms(rnew[1] + 1 - now, 1000))
  elseif R_ALG == 2 then
    local w = rat and fwindow(rat[1], rat[2]) or fwindow(now, now_ns)
    call('HSET', KRL, 'w', int(w), 'n', rnew)
    call('PEXPIRE', KRL, ms(fstart(w + 1) + 1 - now, 1000))
  else
    local l = rlog or {now, now_ns}
    for _ = 1, RW do add_unique(KRL, l[1], string.format('%03d:', l[2])) end
    call('PEXPIRE', KRL, ms(l[1] - now + upair(R_PER) + 1, 1000))
  end
end

if reason == 0 and BSTEP == 2 then
  call('SET', KRB, int(btok - 1000), 'PX', ms(num(A[14])))
end

-- The carried successes' slots this admission did not take over.
if renewed then FREED[#FREED + 1] = renewed end
if FREED and #FREED > 0 then call('ZREM', KB, unpack(FREED)) end

if moved then
  if tr == 1 then
    hsave(h, {'st', 'gen', 'since', 'pr', 'pok', 'cf', 'nc', 'nf', 'ns', 'nh', 'tc', 'tf', 'ts'})
  else
    hsave(h, {'gen', 'since', 'pr', 'pok'})
  end
elseif begun then
  hsave(h, {'since'})
end
if retry > 0 then retry = math.ceil(retry) end
if sretry > 0 then sretry = math.ceil(sretry) end
local trips = 0
if HAS_C then trips = h.trips end
local rat_u, rat_n = -1, 0
if rat then rat_u, rat_n = rat[1], rat[2] end
if reason ~= 0 then sreason, sretry, sunder = 0, -1, 0 end
if SHORT_REPLY and tr == 0 and trips == 0 and under == 0 and rat_u == -1 and sreason == 0 then
  return {reason, retry, probe, gen, slot}
end
return {reason, retry, probe, gen, slot, tr, trips, under, rat_u, rat_n, sreason, sretry, sunder}
