-- seawall-redis: the successes an admission carries (see src/store.rs,
-- `Carrier`), applied before it is judged, each by `success` (success.lua,
-- which comes after prelude.lua and before this). They are the first of
-- the operation's arguments (`A[D..]`, see prelude.lua): how many, then the
-- seven arguments of `success` of each, read where they are; the
-- admission's own follow, from `A[OWN]` (admit.lua).
-- Every record concerns the admission's keys. Their slots are freed by
-- the admission (FREED, see admit.lua), which may take one over.
-- With a circuit, the state hash is read once for the successes and the
-- admission (`CARRIED_H`, which admit.lua takes instead of reading it
-- again: the fields the admission reads and those `success` reads in the
-- circuit's mode); the successes update it as they write.
OWN = D + 1 + 7 * A[D]
if HAS_C then
  CARRIED_H = hload_admit(carry_fields(MODE))
end
FREED = {}
for o = D, OWN - 8, 7 do
  success(KEYS, A, o, CARRIED_H, FREED)
end
