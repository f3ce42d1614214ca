-- Attempts holding a bulkhead slot whose lease has not expired, but for
-- the slots of ARGV[D..]: those of successes this process recorded that
-- wait to be carried by its next admission (finished, not yet freed on
-- the server).
-- Reply: count

if not HAS_B then return 0 end
local t = tnow()
local n = call('ZCOUNT', KB, '(' .. int(t), '+inf')
for i = D, #A do
  local s = num(call('ZSCORE', KB, A[i]))
  if s and s > t then n = n - 1 end
end
return n
