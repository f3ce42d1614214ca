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

local r = admit_rule()
local ok, gu, gn = 0, 0, 0
if r[1] == 0 and HAS_R then
  if R_ALG == 1 then
    local stored = redis.call('GET', KRL)
    if stored then
      local tu, tn = upair(stored)
      tu, tn = psub(tu, tn, upair(R_TOL))
      gu, gn = psub(tu, tn, upair(R_INT))
      ok = 1
    end
  elseif R_ALG == 2 then
    local w = tonumber(redis.call('HGET', KRL, 'w'))
    if w then gu, ok = w * R_PERIOD, 1 end
  end
end
r[14], r[15], r[16] = ok, gu, gn
return r
