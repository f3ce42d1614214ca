-- Attempts holding a bulkhead slot whose lease has not expired.
-- Reply: count

if not HAS_B then return 0 end
redis.call('ZREMRANGEBYSCORE', KB, '-inf', now)
return redis.call('ZCARD', KB)
