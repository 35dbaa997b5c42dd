-- Of the jobs an enqueue door just created (`ids`, with their `keys`), those whose key the key
-- ledger holds (migration 029: the key named a job since pruned) are taken back: deleted in
-- the same transaction, so no other session ever sees them, and answered from the ledger: the
-- original job's id and final state, and whether the request is the same (by fingerprint; a ledger row
-- of a job accepted before migration 005 has an md5 one, which cannot be compared: same).
-- Checked after the insert, not before, so a job pruned while the insert waited on its row
-- is found: the insert proceeds only once the pruner committed, ledger row included.
CREATE OR REPLACE FUNCTION dispatcher.take_back_pruned(ids bigint[], keys text[])
RETURNS TABLE (ord integer, id bigint, job_id bigint, state text, same boolean)
LANGUAGE sql AS $$
    WITH hit AS (
        SELECT u.o::integer AS ord, u.id, l.job_id, l.state,
               l.request_hash = i.request_hash OR l.request_hash NOT LIKE 'v2:%' AS same
          FROM unnest(ids, keys) WITH ORDINALITY AS u(id, k, o)
          -- one index probe of the ledger per job, and of the intent only for a key found
          -- there (OFFSET 0: joined, the planner may hash a scan of either table instead;
          -- measured: one probe per key costs less than one = ANY (keys) scan)
          CROSS JOIN LATERAL (
                SELECT x.job_id, x.state, x.request_hash FROM dispatcher.key_ledger x
                 WHERE x.key = u.k OFFSET 0) l
          CROSS JOIN LATERAL (
                SELECT y.request_hash FROM dispatcher.intents y WHERE y.id = u.id OFFSET 0) i
    -- = ANY (ARRAY(...)): index probes for the (usually no) ids; IN (SELECT ...) may be
    -- planned as a hash join over a scan of the whole table, on every call
    ), outbox AS (
        DELETE FROM dispatcher.outbox o WHERE o.job_id = ANY (ARRAY(SELECT h.id FROM hit h))
    ), states AS (
        DELETE FROM dispatcher.job_state s WHERE s.id = ANY (ARRAY(SELECT h.id FROM hit h))
    ), intents AS (
        DELETE FROM dispatcher.intents i WHERE i.id = ANY (ARRAY(SELECT h.id FROM hit h))
    )
    SELECT h.ord, h.id, h.job_id, h.state, h.same FROM hit h
$$;
