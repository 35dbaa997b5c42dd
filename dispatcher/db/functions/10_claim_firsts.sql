-- Many small tenants, in one read (claim_pick's first step at each priority; issue 22): the
-- earliest ready job of each of the next `need` tenants of priority `lvl` in turn order (after
-- the cursor (from_priority, from_tenant), then from the first name round to `after_tenant`
-- when the cursor is at this priority), locked. Returns their ids, tenants and turns, or NULLs
-- when it takes nothing.
--
-- claim_pick's walk reaches a tenant by an index probe and takes its jobs by another: about
-- 14 us per tenant, which a claim of 1,000 among 10,000 tenants of two jobs each pays a
-- thousand times (14 of its 28 ms). When tenants hold few jobs each, reading the claim index
-- in order and keeping each tenant's first row costs less (under 1 us a row): 4 ms for that
-- claim. The read is bounded (8 rows per tenant wanted), so it is only tried when the first 64
-- ready jobs in turn order hold at least 8 tenants; with fewer, bigger tenants (one tenant per
-- priority, or a few with long backlogs) the walk is the cheaper way and this returns at once.
-- A read that ends early (a big tenant in its range, or fewer tenants than wanted) leaves the
-- rest of the claim to the walk, which passes over the jobs locked here.
--
-- Every tenant taken gets one job, the walk's share when it finds `need` tenants, so the turns
-- are the walk's: a tenant waits at most ceil(tenants / wanted) claims of a claimer.
CREATE OR REPLACE FUNCTION dispatcher.claim_firsts(
    q text, lvl smallint, need integer, caps text[], blocked text[], from_priority integer,
    from_tenant text, after_priority integer, after_tenant text)
RETURNS TABLE (ids bigint[], tenants text[], turns integer[])
LANGUAGE plpgsql VOLATILE
-- planned once per connection and kept, on the claim index whatever the statistics
-- (10_claim_pick.sql says why)
SET plan_cache_mode = auto SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_nestloop = off
AS $$
DECLARE
    -- The start, after (from_priority, from_tenant), as a bound on the claim index's last three
    -- columns: past every job of the cursor's tenant at its own priority, else before every
    -- job ('' is the first text in any collation). Written (priority, tenant) > (from_priority,
    -- from_tenant) beside `priority = lvl`, PostgreSQL 15 descends to the priority only and
    -- reads every entry before the cursor: 73 pages and 0.55 ms at the 6,400th of 10,000
    -- tenants, 6 pages and 0.06 ms this way.
    onward       boolean := from_priority <= lvl;
    start_tenant text := CASE WHEN from_priority = lvl THEN from_tenant ELSE '' END;
    start_due    timestamptz := CASE WHEN from_priority = lvl THEN 'infinity'::timestamptz
                                     ELSE '-infinity'::timestamptz END;
    start_id     bigint := CASE WHEN from_priority = lvl THEN 9223372036854775807
                                ELSE -9223372036854775808 END;
BEGIN
    -- dense: at least 8 tenants among the first 64 ready jobs in turn order
    IF (SELECT count(DISTINCT r.tenant) FROM (
            (SELECT s.tenant FROM dispatcher.job_state s
              WHERE s.queue = q AND s.state = 'ready' AND s.priority = lvl
                AND onward
                AND (s.tenant, s.due_at, s.id) > (start_tenant, start_due, start_id)
              ORDER BY s.queue, s.priority, s.tenant, s.due_at, s.id LIMIT 64)
            UNION ALL
            (SELECT s.tenant FROM dispatcher.job_state s
              WHERE lvl = after_priority AND s.queue = q AND s.state = 'ready'
                AND s.priority = lvl AND s.tenant <= after_tenant
              ORDER BY s.queue, s.priority, s.tenant, s.due_at, s.id LIMIT 64)
            LIMIT 64) r) < 8 THEN
        RETURN;
    END IF;
    -- The rows in turn order (index order, read lazily: the union reads the wrap only when the
    -- onward rows run out), each tenant's first kept, then locked by their row addresses (one
    -- statement, one snapshot; a row another claim took since is followed to its new version,
    -- which is passed over unless still ready, and a locked one is skipped). The locked rows
    -- are joined with the read's by hash (enable_nestloop = off: a plan made on an empty
    -- table's statistics joined them by reading the read's rows again for each).
    RETURN QUERY
    WITH firsts AS MATERIALIZED (
        SELECT r.id, r.row_at, r.tenant, row_number() OVER ()::integer AS turn
          FROM (SELECT r.id, r.row_at, r.tenant, lag(r.tenant) OVER () AS before
                  FROM ((SELECT s.id, s.ctid AS row_at, s.tenant FROM dispatcher.job_state s
                          WHERE s.queue = q AND s.state = 'ready' AND s.priority = lvl
                            AND onward
                            AND (s.tenant, s.due_at, s.id) > (start_tenant, start_due, start_id)
                            AND s.capability = ANY (caps) AND s.tenant <> ALL (blocked)
                            AND s.due_at <= now()  -- none before its due time
                            AND (s.concurrency_key IS NULL OR s.concurrency_key <> ALL (blocked))
                          ORDER BY s.queue, s.priority, s.tenant, s.due_at, s.id
                          LIMIT 8 * need)
                        UNION ALL
                        (SELECT s.id, s.ctid, s.tenant FROM dispatcher.job_state s
                          WHERE lvl = after_priority AND s.queue = q AND s.state = 'ready'
                            AND s.priority = lvl AND s.tenant <= after_tenant
                            AND s.capability = ANY (caps) AND s.tenant <> ALL (blocked)
                            AND s.due_at <= now()  -- none before its due time
                            AND (s.concurrency_key IS NULL OR s.concurrency_key <> ALL (blocked))
                          ORDER BY s.queue, s.priority, s.tenant, s.due_at, s.id
                          LIMIT 8 * need)
                        LIMIT 8 * need) r) r
         WHERE r.before IS DISTINCT FROM r.tenant
         LIMIT need
    )
    SELECT array_agg(l.id ORDER BY l.turn), array_agg(l.tenant ORDER BY l.turn),
           array_agg(l.turn ORDER BY l.turn)
      FROM (SELECT s.id, s.state FROM dispatcher.job_state s
             WHERE s.ctid = ANY (ARRAY(SELECT f.row_at FROM firsts f))
               FOR UPDATE SKIP LOCKED) k
      JOIN firsts l ON l.id = k.id
     -- checked on the row as locked (its latest version), outside the scan: a condition the
     -- claim index could serve let a plan made on stale statistics read the whole index for
     -- the 1,000 addresses (tests/db/test_claim_plan.py)
     WHERE k.state = 'ready';
END
$$;
