-- Leases a batch of rate-limit permits (seawall_redis::Leasing). The script
-- is `prelude.lua`, then `admit.lua` unchanged as the body of the function
-- `admit_rule` (see `scripts.rs`): a lease of n permits is the weighted
-- admission of n, by the same rule as every admission. Then, when the
-- batch was granted, the instant the batch can be given back with, as a
-- reservation at that instant is given back (`rgive`, run by the release
-- script): for GCRA, the TAT the batch left less the tolerance and one
-- interval (`rgive` gives back while the TAT is still that one); for the
-- fixed window, the start of its window (`rgive` gives back while the
-- window is still that one).
-- Reply: the admission's 13 fields (`admit.lua`), then 1 when the batch
-- can be given back (0: not), and its instant (microseconds, nanoseconds
-- 0..999).
-- ARGV[D + 4] (with the lead, the held reservation and the weight before
-- it, unused by a bulkhead alone): a batch of bulkhead slots. Each slot is
-- an admission by the same rule, taken one after the other until the
-- batch is full or the bulkhead refuses. Reply: the refusal when no slot
-- was free; else an admission's 13 fields, 0, 0, 0, then the slot ids.

-- Every reply of `admit_rule` in full: the batch's fields follow them.
SHORT_REPLY = false
local K = num(A[D + 4])
if K and HAS_B then
  local ids, x = {}, nil
  for _ = 1, K do
    x = admit_rule()
    if x[1] ~= 0 then break end
    ids[#ids + 1] = x[5]
  end
  if #ids == 0 then return x end
  local out = {0, -1, 0, 0, -1, 0, 0, 0, -1, 0, 0, -1, 0, 0, 0, 0}
  for _, id in ipairs(ids) do out[#out + 1] = id end
  return out
end

local r = admit_rule()
local ok, gu, gn = 0, 0, 0
if r[1] == 0 and HAS_R then
  if R_ALG == 1 then
    local stored = call('GET', KRL)
    if stored then
      local tu, tn = upair(stored)
      tu, tn = psub(tu, tn, upair(R_TOL))
      gu, gn = psub(tu, tn, upair(R_INT))
      ok = 1
    end
  elseif R_ALG == 2 then
    local w = num(call('HGET', KRL, 'w'))
    if w then gu, gn = fstart(w) ok = 1 end
  end
end
r[14], r[15], r[16] = ok, gu, gn
return r
