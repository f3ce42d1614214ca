-- Manual control of the circuit.
-- ARGV[D]: 1 isolate (force open), 2 force close, 3 reset
-- Reply: {state before, state after}

local op = tonumber(A[D])
local c = cload()
local before = c.st
if op == 1 then
  c.st = ISOLATED
  c.gen = c.gen + 1
  c.since = now
  c.pr, c.pok, c.ou = 0, 0, 0
elseif op == 2 then
  c.st = DISABLED
  c.gen = c.gen + 1
  c.since = now
  c.pr, c.pok, c.ou = 0, 0, 0
else
  cclose(c)
end
csave(c)
return {before, c.st}
