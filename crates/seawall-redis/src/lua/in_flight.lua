-- Attempts holding a bulkhead slot whose lease has not expired.
-- Reply: count

if not HAS_B then return 0 end
return redis.call('ZCOUNT', KB, '(' .. int(tnow()), '+inf')
