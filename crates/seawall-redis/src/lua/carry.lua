-- seawall-redis: the successes an admission carries (see src/store.rs,
-- `Carrier`), applied before it is judged, each by `success` (success.lua,
-- which comes first). They are the last argument, taken off ARGV here so
-- that prelude.lua and admit.lua see the layout of a plain admission:
-- records separated by `;`, each the seven arguments of `success` (its A)
-- separated by `,`. Every record concerns the admission's keys.
local carried = table.remove(ARGV)
for rec in string.gmatch(carried, '[^;]+') do
  local a = {}
  for f in string.gmatch(rec .. ',', '([^,]*),') do a[#a + 1] = f end
  success(a)
end
