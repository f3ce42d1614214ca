-- Manual control of the circuit.
-- ARGV[D]: 1 isolate (force open), 2 force close, 3 reset
-- Isolating an isolated circuit or force-closing a disabled one changes
-- nothing; a reset always starts a new generation with an empty window.
-- Reply: {state before, state after}

local op = tonumber(A[D])
local c = cload()
local before = c.st
local target = ISOLATED
if op == 2 then target = DISABLED elseif op == 3 then target = CLOSED end
if target == CLOSED then
  cclose(c)
elseif before ~= target then
  c.st = target
  c.gen = c.gen + 1
  c.since = now
  c.pr, c.pok, c.ou, c.cf = 0, 0, 0, 0
else
  return {before, before}
end
csave(c)
return {before, c.st}
