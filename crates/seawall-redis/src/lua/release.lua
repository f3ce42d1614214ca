-- Gives back a permit without an outcome (cancelled or panicked attempt),
-- or a reserved rate-limit permit.
-- ARGV[D..]: probe (0/1), generation, slot (-1: none), reserved instant
-- (`microseconds:nanoseconds`; -1 or absent: none), its weight (absent: 1)
-- Reply: 1

local reserved = A[D + 3]
if reserved and reserved ~= '-1' then
  local ru, rn = upair(reserved)
  rgive(ru, rn, num(A[D + 4]) or 1)
end

local probe, pgen, slot = A[D] == '1', num(A[D + 1]), A[D + 2]
if slot ~= '-1' then call('ZREM', KB, slot) end
if HAS_C and probe then
  local h = hload({'st', 'gen', 'pr', 'ou', 'cu'})
  if h.gen == pgen and h.st == HALF_OPEN and h.pr > 0 then
    h.pr = h.pr - 1
    hsave(h, {'pr'})
  end
end
return 1
