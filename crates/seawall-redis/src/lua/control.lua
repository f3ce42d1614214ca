-- Manual control of the circuit.
-- ARGV[D]: 1 isolate (force open), 2 force close, 3 reset
-- Isolating an isolated circuit or force-closing a disabled one changes
-- nothing; a reset always starts a new generation with an empty window.
-- Reply: {state before, state after}

local op = tonumber(A[D])
cspec()
local h = hload()
local before = h.st
local target = ISOLATED
if op == 2 then target = DISABLED elseif op == 3 then target = CLOSED end
if target == CLOSED then
  cclose(h)
  hsave(h, {'st', 'gen', 'trips', 'ou', 'since', 'pr', 'pok', 'cf', 'nc', 'nf', 'ns', 'nh', 'tc', 'tf', 'ts'})
elseif before ~= target then
  h.st = target
  h.gen = h.gen + 1
  h.since = tnow()
  h.pr, h.pok, h.ou, h.cf = 0, 0, 0, 0
  hsave(h, {'st', 'gen', 'since', 'pr', 'pok', 'ou', 'cf'})
end
return {before, h.st}
