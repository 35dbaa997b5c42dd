-- Record successful attempts in one statement; only the current lease holder may complete.
-- `results`: each result as JSON text (a jsonb[] parameter would read a result that is a JSON
-- array as a dimension of the array). `statuses`, `latencies_s`, `excerpts`: HTTP status,
-- latency (s) and response excerpt per attempt (NULL: none). Returns the (id, attempt) of each
-- attempt recorded.
--
-- The attempt's history is the state row itself (migration 062): its owner, status, latency
-- and excerpt are written with the ending, and dispatcher.attempt_history shows them after the
-- job's earlier attempts. No history row of its own: that was 18 % of the completion's cost.
--
-- A function for its plan, as claim_ready: the daemon's sessions plan every statement with its
-- parameters (force_custom_plan, db/pool.py), and this one, sent once per finished job when
-- jobs finish one at a time, was planned on every call: 0.13 ms of planning for 0.13 ms of
-- work (the peer benchmark's W3, pg_stat_statements). Its plan does not depend on the values:
-- the rows are read by id and joined with the arrays by hash. Kept per connection
-- (force_generic_plan), and whatever the statistics it was made with: without
-- enable_nestloop = off, a plan kept from an empty table joined the rows found with the arrays
-- by reading the arrays again for each row (a million rows, 200 ms for a batch of 1,000; the
-- W2 drain fell from 44,000 to 5,000 jobs/s; tests/db/test_claim_plan.py).
CREATE OR REPLACE FUNCTION dispatcher.complete_succeeded(
    ids bigint[], attempts integer[], results text[], owner text, statuses integer[],
    latencies_s float8[], excerpts text[])
RETURNS TABLE (id bigint, attempt integer)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_nestloop = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    UPDATE dispatcher.job_state s
       SET state = 'succeeded', finished_at = now(), result = r.result::jsonb,
           lease_owner = NULL, lease_expires_at = NULL, last_error = NULL,
           succeeded_by = owner, success_http_status = r.http_status,
           success_latency_s = r.latency_s, success_excerpt = left(r.excerpt, 500)
      FROM unnest(ids, attempts, results, statuses, latencies_s, excerpts)
           AS r(id, attempt, result, http_status, latency_s, excerpt)
     WHERE s.id = ANY (ids) AND s.id = r.id
       AND s.attempt = r.attempt AND s.lease_owner = owner
       AND CASE WHEN s.state = 'running' THEN true ELSE false END
    RETURNING s.id, s.attempt;
END
$$;
