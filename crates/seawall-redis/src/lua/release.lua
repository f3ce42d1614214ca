-- Gives back a permit without an outcome (cancelled or panicked attempt).
-- ARGV[D..]: probe (0/1), generation, slot (-1: none)
-- Reply: 1

local probe, pgen, slot = A[D] == '1', tonumber(A[D + 1]), A[D + 2]
if slot ~= '-1' then redis.call('ZREM', KB, slot) end
if HAS_C and probe then
  local c = cload()
  if c.gen == pgen and c.st == HALF_OPEN and c.pr > 0 then
    c.pr = c.pr - 1
    csave(c)
  end
end
return 1
