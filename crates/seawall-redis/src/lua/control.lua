-- Manual control of the circuit.
-- ARGV[D]: 1 isolate (force open), 2 disable (force close), 3 reset, 4 open
-- for ARGV[D + 1] microseconds, 5 enable
-- Isolating an isolated circuit, disabling a disabled one or enabling one
-- that is not disabled changes nothing (but begins a circuit not begun);
-- a reset (and enabling a disabled circuit) always starts a new generation
-- with an empty window. Isolating and disabling keep the counts on show
-- (consecutive mode: the failures in a row of a closed circuit). Opening
-- for a while opens from any state until the end (whole milliseconds,
-- rounded up), keeping the trips, and keeps its duration (`ol`).
-- Reply: {state before, state after}

local op = num(A[D])
cspec()
local h = hload()
local begun = cbegin(h)
local before = h.st
if op == 4 then
  local d = num(A[D + 1])
  h.st = OPEN
  h.gen = h.gen + 1
  h.since = tnow()
  h.pr, h.pok, h.cf = 0, 0, 0
  h.ou = open_until(now, d)
  h.ol = d + 1
  hsave(h, {'st', 'gen', 'since', 'pr', 'pok', 'ou', 'cf', 'ol'})
  return {before, h.st}
end
if op == 5 and before ~= DISABLED then
  if begun then hsave(h, {'since'}) end
  return {before, before}
end
local target = ISOLATED
if op == 2 then target = DISABLED elseif op == 3 or op == 5 then target = CLOSED end
if target == CLOSED then
  cclose(h)
  hsave(h, {'st', 'gen', 'trips', 'ou', 'since', 'pr', 'pok', 'cf', 'nc', 'nf', 'ns', 'nh', 'tc', 'tf', 'ts'})
elseif before ~= target then
  -- The failures in a row of a closed (isolated, disabled) circuit stay
  -- on show; other states have none.
  if before ~= CLOSED and before ~= ISOLATED and before ~= DISABLED then h.cf = 0 end
  h.st = target
  h.gen = h.gen + 1
  h.since = tnow()
  h.pr, h.pok, h.ou, h.ol = 0, 0, 0, 0
  hsave(h, {'st', 'gen', 'since', 'pr', 'pok', 'ou', 'cf', 'ol'})
end
return {before, h.st}
