-- seawall-redis: the successes an admission carries (see src/store.rs,
-- `Carrier`), applied before it is judged, each by `success` (success.lua,
-- which comes after prelude.lua and before this). They are the last
-- argument, taken off the arguments (A, see prelude.lua) here, before
-- admit.lua reads the arguments of a plain admission: records separated
-- by `;`, each the seven arguments of `success` (its A) separated by `,`.
-- Every record concerns the admission's keys. Their slots are freed by
-- the admission (FREED, see admit.lua), which may take one over.
-- With a circuit, the state hash is read once for the successes and the
-- admission (`CARRIED_H`, which admit.lua takes instead of reading it
-- again: the fields the admission reads and those `success` reads in the
-- circuit's mode); the successes update it as they write.
local carried = table.remove(A)
if HAS_C then
  CARRIED_H = hload_admit(carry_fields(MODE))
end
FREED = {}
for rec in string.gmatch(carried, '[^;]+') do
  success(KEYS, {string.match(rec, '^([^,]*),([^,]*),([^,]*),([^,]*),([^,]*),([^,]*),([^,]*)$')}, CARRIED_H, FREED)
end
