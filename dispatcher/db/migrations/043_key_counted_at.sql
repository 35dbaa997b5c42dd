-- When each limited key's running count (key_state.running_seen, migration 040) was last
-- counted from the jobs themselves. The count is kept by adding starts and ends, and an end
-- that no statement counted (a completion that committed while the key's first count read its
-- job as running, before it could see the key's row) leaves it one too high for good: the key
-- then starts one job fewer than its cap, or none. A count older than
-- dispatcher.key_recount_after() is treated as not known: keys_at_limit does not skip the key
-- for it, and the key's next claim counts its running jobs again under its row lock
-- (key_take), so any such drift lasts at most that long. NULL (rows made before this
-- migration): counted at the next claim.
ALTER TABLE dispatcher.key_state ADD COLUMN counted_at timestamptz;

-- keys_at_limit and key_take read the queue's overrides themselves now (one scan each, and no
-- probe per key when there is none): these two helpers have no caller left.
DROP FUNCTION IF EXISTS dispatcher.keys_limited(dispatcher.queues);
DROP FUNCTION IF EXISTS dispatcher.key_bounds(dispatcher.queues);
