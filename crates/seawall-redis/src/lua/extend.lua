-- Extends the bulkhead slot leases a process holds in leased mode
-- (seawall_redis::Leasing): each slot whose lease has not ended gets the
-- bulkhead's lease again from now; one whose lease ended (the others
-- count it as free) is not taken again.
-- ARGV[D..]: the slot ids. Reply: 1 for each slot extended, 0 for one lost.

tnow()
local out = {}
for i = D, #A do
  local score = num(call('ZSCORE', KB, A[i]))
  if score and score > now then
    call('ZADD', KB, 'XX', int(now + B_LEASE), A[i])
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
if #out > 0 then call('PEXPIRE', KB, ms(B_LEASE, 1000)) end
return out
