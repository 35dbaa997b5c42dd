-- Every statement the dispatcher runs, by name. The first comment line under a name says what
-- it is for. Time always comes from the database clock (now()), never from the application.
--
-- Batch statements reach the jobs they picked with `id = ANY (ARRAY(SELECT ...))`: one index
-- probe per id, whatever the table holds. Written as a join, the planner may hash a sequential
-- scan of the whole table instead, which made a claim of 1,000 from 100,000 ready jobs 4x slower.
-- For the same reason a re-check of the state of rows reached by id is written
-- `CASE WHEN state = 'x' THEN true ELSE false END`: a plain `state = 'x'` lets a partial index
-- of that state match, and with statistics older than a burst (analyzed while the table was
-- empty) the planner walked all of it testing each entry against the ids (2.1 s for a claim of
-- 1,000 among 20,000 ready jobs, where the primary key takes 1,000 probes).

-- name: enqueue_many
-- Accept a batch of intents: the SQL door's checks, except the past-due tolerance, which HTTP
-- intake checks per item (a bad item must not reject its batch). See migration 011. Each
-- item's priority ($11) and concurrency key ($12: NULL = the tenant, '' = none), migration 023.
SELECT ord, id, key, state, due_at, created_at, outcome
  FROM dispatcher.enqueue_many_internal($1::text[], $2::text[], $3::jsonb[], $4::timestamptz[],
                                        $5::text[], $6::text[], $7::jsonb[], $8::integer[],
                                        $9::integer[], $10::text[], $11::integer[], $12::text[]);

-- name: replace_scheduled
-- Key modes: replace the jobs these items name by key while they are still scheduled
-- ($10 keep the due time, $11 debounce_max_s; the whole request: $12 priorities, $13
-- concurrency keys, $14-$17 the contract, callbacks as JSON text); answers "replaced",
-- "not_replaced" or "conflict" per item it found (dispatcher.replace_scheduled).
SELECT ord, id, key, state, due_at, created_at, outcome
  FROM dispatcher.replace_scheduled($1::text[], $2::text[], $3::jsonb[], $4::timestamptz[],
                                    $5::text[], $6::text[], $7::jsonb[], $8::integer[],
                                    $9::integer[], $10::boolean[], $11::integer[],
                                    $12::integer[], $13::text[], $14::float8[],
                                    $15::timestamptz[], $16::text[]::jsonb[],
                                    $17::text[]::jsonb[]);

-- name: set_traceparents
-- Store the W3C trace context jobs were accepted in ($1 ids, $2 traceparents, in parallel), in
-- the transaction that created them (tracing only; one index probe per id).
UPDATE dispatcher.intents i SET traceparent = t.traceparent
  FROM unnest($1::bigint[], $2::text[]) AS t(id, traceparent)
 WHERE i.id = ANY ($1::bigint[]) AND i.id = t.id;

-- name: set_contracts
-- Store the per-job contracts of jobs just created ($1 ids; in parallel: $2 timeout_s, $3
-- expires_at, $4 on_success and $5 on_failure as JSON text), in the transaction that created
-- them, so no claim or ending ever sees a job without its contract (migration 030). One index
-- probe per id in each table.
WITH c AS (
    SELECT * FROM unnest($1::bigint[], $2::float8[], $3::timestamptz[], $4::text[], $5::text[])
        AS c(id, timeout_s, expires_at, on_success, on_failure)
), intent AS (
    UPDATE dispatcher.intents i
       SET timeout_s = c.timeout_s, on_success = c.on_success::jsonb,
           on_failure = c.on_failure::jsonb
      FROM c WHERE i.id = ANY ($1::bigint[]) AND i.id = c.id
)
UPDATE dispatcher.job_state s
   SET expires_at = c.expires_at,
       has_callback = c.on_success IS NOT NULL OR c.on_failure IS NOT NULL
  FROM c WHERE s.id = ANY ($1::bigint[]) AND s.id = c.id;

-- name: job_contracts
-- The stored contracts of jobs a replayed request found ($1 ids): the same key with another
-- contract is another request (409), as with another body.
SELECT i.id, i.timeout_s, s.expires_at, i.on_success, i.on_failure
  FROM dispatcher.intents i JOIN dispatcher.job_state s ON s.id = i.id
 WHERE i.id = ANY ($1::bigint[]);

-- name: scan_due
-- Move scheduled jobs due within $2 seconds to ready (with their outbox rows when a relay needs
-- them: see migration 015), up to $1, in one statement. A job moved before its due time is in
-- the claim index but never claimed before it (the claims take `due_at <= now()`): a burst is
-- moved while nothing runs, not while its own claims run (the due-scan's write was 38 % of a
-- burst's PostgreSQL time). With a relay, nothing is moved early: its message would be
-- delivered at once. Returns how many moved, how many of them are due now, and, per distinct
-- due time of the others, in how many seconds it comes (rounded up to the millisecond and
-- counted from the end of the statement, before its answer leaves: a wake-up timed from the
-- answer is never early) and how many jobs fall due then.
-- A job past its time to live is not moved: expire_unstarted ends it (migration 030).
WITH due AS (
    SELECT id FROM dispatcher.job_state
     WHERE state = 'scheduled'
       AND due_at <= now() + make_interval(secs => CASE WHEN dispatcher.ready_outbox() THEN 0
                                                        ELSE $2::float8 END)
       AND (expires_at IS NULL OR expires_at > now())
     ORDER BY due_at
     LIMIT $1
       FOR UPDATE SKIP LOCKED
), moved AS (
    UPDATE dispatcher.job_state s SET state = 'ready'
     WHERE s.id = ANY (ARRAY(SELECT id FROM due))
    RETURNING s.id, s.queue, s.tenant, s.capability, s.priority, s.due_at, s.attempt
), outboxed AS (
    INSERT INTO dispatcher.outbox (job_id, queue, tenant, capability, priority, attempt)
    SELECT id, queue, tenant, capability, priority, attempt FROM moved
     WHERE dispatcher.ready_outbox()
)
SELECT m.moved, m.due_now, coalesce(w.due_in_s, '{}') AS due_in_s,
       coalesce(w.due_counts, '{}') AS due_counts
  FROM (SELECT count(*)::int AS moved, (count(*) FILTER (WHERE due_at <= now()))::int AS due_now,
               array_agg(due_at) FILTER (WHERE due_at > now()) AS ahead
          FROM moved) m
 CROSS JOIN LATERAL (
       -- the clock read after every row moved (the statement's end, not its start: a move of
       -- 2,000 takes 30 ms, which a wake-up timed from its start would lose at the instant)
       SELECT array_agg(ceil((extract(epoch FROM t.due) - extract(epoch FROM clock_timestamp()))
                             * 1000) / 1000 ORDER BY t.due)::float8[] AS due_in_s,
              array_agg(t.n ORDER BY t.due)::int[] AS due_counts
         FROM (SELECT d AS due, count(*) AS n FROM unnest(m.ahead) d GROUP BY d) t) w;

-- name: wake_ready
-- Tell every listening daemon that jobs are ready to claim (a burst moved ahead has fallen due).
SELECT dispatcher.wake('ready');

-- name: expire_unstarted
-- End up to $1 scheduled or ready jobs whose time to live passed before an attempt started:
-- `dead` with reason `expired` (migration 030; only the few rows with a TTL are in the index).
-- Their outbox rows, if a relay wrote any, are dropped by the consumer's claim (no longer
-- ready). Returns how many per queue, for the dead-letter counter.
WITH expired AS (
    SELECT id FROM dispatcher.job_state
     WHERE expires_at <= now() AND state IN ('scheduled', 'ready')
     ORDER BY expires_at
     LIMIT $1
       FOR UPDATE SKIP LOCKED
), ended AS (
    UPDATE dispatcher.job_state s
       SET state = 'dead', dead_reason = 'expired', finished_at = now(),
           last_error = 'expired at ' || s.expires_at || ' before an attempt started'
     WHERE s.id = ANY (ARRAY(SELECT id FROM expired))
    RETURNING s.queue
)
SELECT queue, count(*)::int AS n FROM ended GROUP BY queue;

-- name: seconds_to_next_due
-- How long until the earliest scheduled job is due (NULL when none is waiting).
-- (greatest() ignores NULL, so the empty case must be spelled out or the scan would spin)
-- Epochs are subtracted, not times: `min(due_at) - now()` raises on a stored 'infinity', which
-- made every scan fail; this gives Infinity (wait the scan interval) or 0 for '-infinity'.
SELECT CASE WHEN min(due_at) IS NULL THEN NULL
            ELSE greatest(0, extract(epoch FROM min(due_at)) - extract(epoch FROM now()))
       END::float8
  FROM dispatcher.job_state WHERE state = 'scheduled';

-- name: rescue_expired_leases
-- Put running jobs whose lease expired, or whose owner is gone ($2: daemons whose liveness lock
-- was seen released, migration 022), back to ready (the attempt counts), or dead when it was the
-- last attempt, or cancelled when an operator asked; each leaves a `lease_expired` history row
-- naming the owner that lost it (reason `owner_gone` for the second kind). An owner in $2 that
-- holds its lock again keeps its jobs; one with no running job left leaves the registry (in
-- this statement's snapshot, so one scan after its last rescue: release_gone_relays runs
-- first).
WITH expired AS (
    SELECT id, lease_owner, 'lease_expired' AS why FROM dispatcher.job_state
     WHERE state = 'running' AND lease_expires_at < now()
     ORDER BY lease_expires_at
     LIMIT $1
       FOR UPDATE SKIP LOCKED
), gone_owners AS MATERIALIZED (
    SELECT o FROM unnest($2::text[]) o WHERE NOT dispatcher.liveness_held(o)
), gone AS (
    -- no owner given (every scan but those after a crash): a one-time filter, no index read
    SELECT id, lease_owner, 'owner_gone' AS why FROM dispatcher.job_state
     WHERE cardinality($2::text[]) > 0 AND state = 'running' AND lease_expires_at >= now()
       AND lease_owner = ANY (ARRAY(SELECT o FROM gone_owners))
     ORDER BY lease_expires_at
     LIMIT $1
       FOR UPDATE SKIP LOCKED
), limits AS (
    SELECT e.id, e.lease_owner, e.why, i.max_attempts
      FROM (SELECT * FROM expired UNION ALL SELECT * FROM gone) e
     CROSS JOIN LATERAL (SELECT i.max_attempts FROM dispatcher.intents i
                         WHERE i.id = e.id OFFSET 0) i
), rescued AS (
    UPDATE dispatcher.job_state s
       SET state = CASE WHEN s.cancel_requested THEN 'cancelled'
                        WHEN s.attempt >= l.max_attempts THEN 'dead'
                        ELSE 'ready' END,
           dead_reason = CASE WHEN NOT s.cancel_requested AND s.attempt >= l.max_attempts
                              THEN 'lease_expired' END,
           last_error = CASE WHEN l.why = 'owner_gone'
                             THEN 'lease of ' || s.lease_owner || ' ended early: its daemon is '
                                  || 'gone (liveness lock released) during attempt ' || s.attempt
                             ELSE 'lease of ' || s.lease_owner || ' expired during attempt '
                                  || s.attempt END,
           finished_at = CASE WHEN s.cancel_requested OR s.attempt >= l.max_attempts
                              THEN now() END,
           lease_owner = NULL, lease_expires_at = NULL
      FROM limits l
     WHERE s.id = l.id AND s.id = ANY (ARRAY(SELECT id FROM limits))
    RETURNING s.id, s.state, s.queue, s.tenant, s.capability, s.attempt, s.started_at,
              s.dead_reason, s.last_error, l.lease_owner, l.why, s.priority
), outboxed AS (
    INSERT INTO dispatcher.outbox (job_id, queue, tenant, capability, priority, attempt)
    SELECT id, queue, tenant, capability, priority, attempt FROM rescued
     WHERE state = 'ready' AND dispatcher.ready_outbox()
), history AS (
    INSERT INTO dispatcher.attempts (job_id, attempt, owner, started_at, finished_at, outcome,
                                     reason, excerpt)
    SELECT r.id, r.attempt, r.lease_owner, r.started_at, now(), 'lease_expired',
           CASE WHEN r.why = 'owner_gone' THEN 'owner_gone' ELSE r.dead_reason END,
           left(r.last_error, 500)
      FROM rescued r
), forgotten AS (
    DELETE FROM dispatcher.instances i
     WHERE i.owner = ANY (ARRAY(SELECT o FROM gone_owners))
       AND NOT EXISTS (SELECT 1 FROM dispatcher.job_state s
                        WHERE s.state = 'running' AND s.lease_owner = i.owner)
)
SELECT state, why, count(*)::int AS n FROM rescued GROUP BY state, why;

-- name: release_gone_relays
-- The messages the relays of gone owners ($1, as rescue_expired_leases takes them) published
-- are given back (migration 054): whether the broker had them is not known, so their jobs still
-- ready are published again (a message it had is then a counted duplicate). So are the outbox
-- rows an earlier release's relays leased (leased_by, migration 052), per queue through
-- outbox_relayed (OFFSET 0, as the relay's statements). Run before the rescue, which forgets
-- an owner once it has no running job. How many jobs go out again.
WITH gone AS MATERIALIZED (
    SELECT o FROM unnest($1::text[]) o WHERE NOT dispatcher.liveness_held(o)
), messages AS MATERIALIZED (
    SELECT a.republished FROM dispatcher.messages_again(ARRAY(
           SELECT m.id FROM dispatcher.outbox_messages m
            WHERE m.relay = ANY (ARRAY(SELECT o FROM gone))
              FOR UPDATE SKIP LOCKED)) a
), released AS (
    UPDATE dispatcher.outbox o SET leased_until = NULL, leased_by = NULL
     WHERE o.id = ANY (ARRAY(
           SELECT x.id
             FROM dispatcher.queues q
            CROSS JOIN LATERAL (
                  SELECT x.id FROM dispatcher.outbox x
                   WHERE x.queue = q.name AND x.leased_until IS NOT NULL
                     AND x.leased_by = ANY (ARRAY(SELECT o FROM gone))
                  OFFSET 0) x))
    RETURNING 1
)
SELECT (coalesce((SELECT sum(republished) FROM messages), 0)
        + (SELECT count(*) FROM released))::int;

-- name: claim_ready
-- Claim up to $2 ready jobs of queue $1 for owner $4: dispatcher.claim_ready
-- (db/functions/10_claim_ready.sql) says what a claim takes, in which order, and its marker row.
SELECT * FROM dispatcher.claim_ready($1, $2, $3, $4, $5, $6, $7, $8, $9);

-- name: complete_succeeded
-- Record successful attempts, each one's history on its state row (a function for its kept
-- plan, db/functions/10_complete_succeeded.sql): ids $1, attempts $2, results $3 (JSON text),
-- owner $4, HTTP statuses $5, latencies $6, excerpts $7; returns (id, attempt) of each attempt
-- recorded.
SELECT * FROM dispatcher.complete_succeeded($1, $2, $3, $4, $5, $6, $7);

-- name: record_failure
-- Record a failed attempt and its history row: retry later ('scheduled' at now + $5 s) while
-- attempts and retry age allow, else 'dead'; a permanent failure ($4, reason $7) or a cancel
-- request ends it at once. Past the retry age, the reason is 'retry_after_beyond_age' when the
-- delay the target itself asked for ($8 s, its Retry-After; NULL: none) reaches past it, else
-- 'max_retry_age'. A retry that would be due at or after the job's time to live could never
-- start: 'expired' at once. $9, $10: HTTP status and latency (s) for the history row.
WITH failed AS (
    SELECT j.id,
           CASE WHEN j.cancel_requested THEN NULL
                WHEN $4::boolean THEN $7::text
                WHEN j.attempt >= i.max_attempts THEN 'max_attempts'
                -- a retry due after the job's time to live could never start (migration 030)
                WHEN now() + make_interval(secs => $5) >= j.expires_at THEN 'expired'
                WHEN now() + make_interval(secs => $5) > j.budget_started_at
                                                         + make_interval(secs => i.max_retry_age_s)
                THEN CASE WHEN now() + make_interval(secs => $8::float8)
                               > j.budget_started_at + make_interval(secs => i.max_retry_age_s)
                          THEN 'retry_after_beyond_age' ELSE 'max_retry_age' END
           END AS dead_reason,
           j.cancel_requested
      FROM dispatcher.job_state j
      JOIN dispatcher.intents i ON i.id = j.id
     WHERE j.id = $1 AND j.attempt = $2 AND j.state = 'running' AND j.lease_owner = $3
       FOR UPDATE OF j
), ended AS (
    UPDATE dispatcher.job_state j
       SET state = CASE WHEN f.cancel_requested THEN 'cancelled'
                        WHEN f.dead_reason IS NOT NULL THEN 'dead'
                        ELSE 'scheduled' END,
           dead_reason = f.dead_reason,
           due_at = CASE WHEN f.cancel_requested OR f.dead_reason IS NOT NULL THEN j.due_at
                         ELSE now() + make_interval(secs => $5) END,
           finished_at = CASE WHEN f.cancel_requested OR f.dead_reason IS NOT NULL THEN now() END,
           last_error = $6, lease_owner = NULL, lease_expires_at = NULL
      FROM failed f WHERE j.id = f.id
    RETURNING j.id, j.attempt, j.started_at, j.state, j.dead_reason
), history AS (
    INSERT INTO dispatcher.attempts (job_id, attempt, owner, started_at, finished_at, outcome,
                                     reason, http_status, latency_s, excerpt)
    SELECT id, attempt, $3, started_at, now(),
           CASE state WHEN 'scheduled' THEN 'retried' ELSE state END,
           coalesce(dead_reason, $7), $9::integer, $10::float8, left($6, 500)
      FROM ended
)
SELECT state, dead_reason FROM ended;

-- name: extend_leases
-- Heartbeat: extend the leases of these attempts ($1 ids, $2 attempt numbers) that owner $3
-- still holds. Rows locked by another transaction are skipped, never waited for: a
-- transactional handler holds its own job's row for its whole run, and the rescuer skips it too.
UPDATE dispatcher.job_state j SET lease_expires_at = now() + make_interval(secs => $4)
 WHERE j.id = ANY (ARRAY(
       SELECT l.id FROM dispatcher.job_state l
        WHERE l.id = ANY (ARRAY(SELECT unnest($1::bigint[]))) AND l.lease_owner = $3
          AND CASE WHEN l.state = 'running' THEN true ELSE false END
          AND (l.id, l.attempt) IN (SELECT * FROM unnest($1::bigint[], $2::integer[]))
          FOR UPDATE SKIP LOCKED));

-- name: release_leases
-- Drain: hand unfinished attempts ($1 ids, $2 attempt numbers) of owner $3 back (ready, the
-- attempt not counted) so another instance takes them at once. Each leaves a `released`
-- history row under the number it ran as, which the next attempt then carries again.
WITH released AS (
    UPDATE dispatcher.job_state s
       SET state = 'ready', attempt = greatest(0, s.attempt - 1),
           lease_owner = NULL, lease_expires_at = NULL
     WHERE s.id = ANY (ARRAY(SELECT unnest($1::bigint[]))) AND s.lease_owner = $3
       AND CASE WHEN s.state = 'running' THEN true ELSE false END
       AND (s.id, s.attempt) IN (SELECT * FROM unnest($1::bigint[], $2::integer[]))
    -- RETURNING sees the decremented number; a running job's attempt is always >= 1
    RETURNING s.id, s.queue, s.tenant, s.capability, s.attempt + 1 AS ran_as, s.started_at,
              s.priority
), outboxed AS (
    INSERT INTO dispatcher.outbox (job_id, queue, tenant, capability, priority)
    SELECT id, queue, tenant, capability, priority FROM released WHERE dispatcher.ready_outbox()
), history AS (
    INSERT INTO dispatcher.attempts (job_id, attempt, owner, started_at, finished_at, outcome)
    SELECT id, ran_as, $3, started_at, now(), 'released' FROM released
)
SELECT count(*)::int FROM released;

-- name: save_progress
-- Commit a page of work together with the job's progress (inside the effect's transaction).
UPDATE dispatcher.job_state SET progress = $4::jsonb
 WHERE id = $1 AND attempt = $2 AND lease_owner = $3 AND state = 'running';

-- name: get_job
-- The status resource of one job: every column but the payload and the target (its URL
-- instead), which may be as large as a door accepts; a status read loaded them for nothing
-- (8 reads at once of a job of 30 MB took the daemon to 956 MB for answers of 491 bytes). The
-- same columns answer retry_job, cancel_job and discard_job.
SELECT id, key, request_hash, queue, tenant, handler, handler_version,
       target ->> 'url' AS target_url, state, due_at, attempt, max_attempts, max_retry_age_s,
       budget_started_at, lease_owner, lease_expires_at, cancel_requested, progress, result,
       last_error, dead_reason, run_key, created_at, started_at, finished_at, dead_letter_of,
       traceparent, priority, concurrency_key, timeout_s, expires_at, on_success, on_failure,
       replaced_by, replacements, replaced_at, debounce_until
  FROM dispatcher.jobs WHERE id = $1;

-- name: get_job_by_key
-- The status resource of one job, by its key (the columns of get_job).
SELECT id, key, request_hash, queue, tenant, handler, handler_version,
       target ->> 'url' AS target_url, state, due_at, attempt, max_attempts, max_retry_age_s,
       budget_started_at, lease_owner, lease_expires_at, cancel_requested, progress, result,
       last_error, dead_reason, run_key, created_at, started_at, finished_at, dead_letter_of,
       traceparent, priority, concurrency_key, timeout_s, expires_at, on_success, on_failure,
       replaced_by, replacements, replaced_at, debounce_until
  FROM dispatcher.jobs WHERE key = $1;

-- name: get_job_page
-- The console's job page: get_job's columns, the target when it is at most $2 bytes (else
-- NULL: the page shows its URL), and the payload when it is at most $2 bytes, else its first
-- $2 characters as text (`payload_excerpt`); `payload_bytes` is its whole size as text.
SELECT id, key, request_hash, queue, tenant, handler, handler_version,
       target ->> 'url' AS target_url,
       CASE WHEN octet_length(target::text) <= $2 THEN target END AS target, state, due_at, attempt, max_attempts, max_retry_age_s,
       budget_started_at, lease_owner, lease_expires_at, cancel_requested, progress, result,
       last_error, dead_reason, run_key, created_at, started_at, finished_at, dead_letter_of,
       traceparent, priority, concurrency_key, timeout_s, expires_at, on_success, on_failure,
       replaced_by, replacements, replaced_at, debounce_until,
       p.bytes AS payload_bytes,
       CASE WHEN p.bytes <= $2 THEN payload END AS payload,
       CASE WHEN p.bytes > $2 THEN left(p.text, $2) END AS payload_excerpt
  FROM dispatcher.jobs
 CROSS JOIN LATERAL (SELECT t.text, octet_length(t.text) AS bytes
                       FROM (SELECT payload::text AS text) t) p
 WHERE id = $1;

-- name: list_attempts
-- The attempt history of job $1, newest first, up to $3 rows older than history row $2 (NULL:
-- from the newest); one backward walk of the attempts primary key, after the success its state
-- row keeps (dispatcher.attempt_history, migration 062).
SELECT id, attempt, owner, started_at, finished_at, outcome, reason, http_status, latency_s,
       excerpt
  FROM dispatcher.attempt_history
 WHERE job_id = $1 AND ($2::bigint IS NULL OR id < $2)
 ORDER BY id DESC
 LIMIT $3;

-- name: list_jobs
-- Operator listing, newest first, keyset-paginated by id; NULL filters match everything.
-- A summary only: payload, target, result and progress may be near the body limit each, and
-- 8 lists of 1,000 whole rows took the daemon to 1.5 GB. The full job is one GET away.
-- Filters: $1 state, $2 queue, $3 before id, $5 key, $6 tenant, $7 run key, $8 handler (both
-- compared in bytes, as their indexes are: migration 055),
-- $9 due before (exclusive), $10 due after (inclusive), $11 dead reason (jobs_dead_reason_id,
-- migration 031), $12 priority (exact; intents_priority_id, migration 048, holds the jobs off
-- the default 0); migration 039's searches: $13 a LIKE pattern of a key prefix, $14 an ILIKE
-- pattern of last-error text (jobs_last_error_trgm), $15 where that index is missing, the id
-- above which the error search looks (the newest jobs; NULL: all), $16 a concurrency key
-- (intents_concurrency_key_id, migration 048). Both patterns come escaped from
-- dispatcher.db.job_reads.list_args.
-- $17 the most ids a key prefix reads from its index (job_reads.PREFIX_SCAN_IDS), $18 for a
-- key prefix with at least that many matches below the cursor, the lowest id this page looks
-- at (job_reads.prefix_slice; NULL: no bound, as bulk actions read).
-- A key prefix (migration 042's jobs_key_prefix_id, which carries the id) is served in one of
-- three ways. Without $18, chosen while the statement runs: `prefixed` reads up to $17
-- matching ids below the cursor from the index alone; when that is all of them, they are
-- sorted and the page's jobs read by id, newest first (`matched`: its cost is the matches,
-- wherever their ids are); when there are more, the primary key is walked backwards
-- (`walked`), as for any other filter, however far the matches are (seconds at 10 million
-- jobs when they are all old). With $18 (the job list: job_reads counted $17 matches first),
-- `sliced` walks the intents' primary key backwards from the cursor ($3, which the caller
-- then always gives: the newest id + 1 for a first page) down to $18 at most,
-- checks each key, and reads the matching jobs by id until the page is full: a bounded read
-- (job_reads.PREFIX_SLICE_IDS ids) however old the matches; the caller continues below $18.
-- Each branch runs only when its one-time filter holds; without a prefix `matched` and
-- `sliced` are planned away and `prefixed` never read.
-- A due window is better served by list_jobs_by_due, which the repository uses for it. Every
-- `$n IS NULL OR ...` folds away when the statement is planned with its values, as the pools
-- always do (plan_cache_mode = force_custom_plan), so each filter given reaches its index
-- (migration 009; tests/db/test_plans.py). A generic plan would keep the ORs and could use no
-- index at all.
WITH prefixed AS MATERIALIZED (
    SELECT i.id FROM dispatcher.intents i
     WHERE $18::bigint IS NULL AND i.key LIKE $13 AND ($3::bigint IS NULL OR i.id < $3)
     LIMIT $17::integer
), all_prefixed AS (
    SELECT count(*) < $17::integer AS whole FROM prefixed
), matched AS (
    -- each id's job read through its primary keys, in the ids' order: a lateral subquery kept
    -- apart by its LIMIT 1 (an id is one job), else the planner may merge-join the sorted ids
    -- with a backward walk of job_state's primary key (1.4 s for old matches at 10 million)
    SELECT j.*
      FROM (SELECT id FROM prefixed ORDER BY id DESC) p
     CROSS JOIN LATERAL (
           SELECT id, key, queue, tenant, handler, state, attempt, due_at, created_at,
                  started_at, finished_at, dead_reason, last_error, run_key, priority,
                  concurrency_key
             FROM dispatcher.jobs
            WHERE id = p.id
              AND ($1::text IS NULL OR state = $1) AND ($2::text IS NULL OR queue = $2)
              AND ($5::text IS NULL OR key = $5)
              AND ($6::text IS NULL OR tenant COLLATE "C" = $6)
              AND ($7::text IS NULL OR run_key = $7)
              AND ($8::text IS NULL OR handler COLLATE "C" = $8)
              AND ($9::timestamptz IS NULL OR due_at < $9)
              AND ($10::timestamptz IS NULL OR due_at >= $10)
              AND ($11::text IS NULL OR dead_reason = $11)
              AND ($12::integer IS NULL OR priority = $12)
              AND ($14::text IS NULL OR last_error ILIKE $14)
              AND ($15::bigint IS NULL OR id > $15)
              AND ($16::text IS NULL OR concurrency_key = $16)
            LIMIT 1) j
     WHERE $13::text IS NOT NULL AND $18::bigint IS NULL AND (SELECT whole FROM all_prefixed)
     ORDER BY p.id DESC
     LIMIT $4
), sliced AS (
    -- each id's key checked in the intents alone, and only the matches' jobs read (kept apart
    -- as in `matched`). The inner LIMIT (the slice's size) keeps the key check out of the
    -- walk: without it the planner may read every match from jobs_key_prefix_id and sort
    -- them, which is the unbounded read this branch exists to avoid.
    SELECT j.*
      FROM (SELECT s.id
              FROM (SELECT i.id, i.key FROM dispatcher.intents i
                     WHERE $18::bigint IS NOT NULL AND i.id >= $18 AND i.id < $3::bigint
                     ORDER BY i.id DESC
                     LIMIT $3::bigint - $18::bigint) s
             WHERE s.key LIKE $13) p
     CROSS JOIN LATERAL (
           SELECT id, key, queue, tenant, handler, state, attempt, due_at, created_at,
                  started_at, finished_at, dead_reason, last_error, run_key, priority,
                  concurrency_key
             FROM dispatcher.jobs
            WHERE id = p.id
              AND ($1::text IS NULL OR state = $1) AND ($2::text IS NULL OR queue = $2)
              AND ($5::text IS NULL OR key = $5)
              AND ($6::text IS NULL OR tenant COLLATE "C" = $6)
              AND ($7::text IS NULL OR run_key = $7)
              AND ($8::text IS NULL OR handler COLLATE "C" = $8)
              AND ($9::timestamptz IS NULL OR due_at < $9)
              AND ($10::timestamptz IS NULL OR due_at >= $10)
              AND ($11::text IS NULL OR dead_reason = $11)
              AND ($12::integer IS NULL OR priority = $12)
              AND ($14::text IS NULL OR last_error ILIKE $14)
              AND ($15::bigint IS NULL OR id > $15)
              AND ($16::text IS NULL OR concurrency_key = $16)
            LIMIT 1) j
     WHERE $13::text IS NOT NULL AND $18::bigint IS NOT NULL
     ORDER BY p.id DESC
     LIMIT $4
), walked AS (
    SELECT id, key, queue, tenant, handler, state, attempt, due_at, created_at, started_at,
           finished_at, dead_reason, last_error, run_key, priority, concurrency_key
      FROM dispatcher.jobs
     WHERE ($13::text IS NULL OR ($18::bigint IS NULL AND NOT (SELECT whole FROM all_prefixed)))
       AND ($1::text IS NULL OR state = $1) AND ($2::text IS NULL OR queue = $2)
       AND ($3::bigint IS NULL OR id < $3)
       AND ($5::text IS NULL OR key = $5) AND ($6::text IS NULL OR tenant COLLATE "C" = $6)
       AND ($7::text IS NULL OR run_key = $7)
       AND ($8::text IS NULL OR handler COLLATE "C" = $8)
       AND ($9::timestamptz IS NULL OR due_at < $9)
       AND ($10::timestamptz IS NULL OR due_at >= $10)
       AND ($11::text IS NULL OR dead_reason = $11)
       AND ($12::integer IS NULL OR priority = $12)
       AND ($13::text IS NULL OR key LIKE $13)
       AND ($14::text IS NULL OR last_error ILIKE $14)
       AND ($15::bigint IS NULL OR id > $15)
       AND ($16::text IS NULL OR concurrency_key = $16)
     ORDER BY id DESC
     LIMIT $4
)
SELECT id, key, queue, tenant, handler, state, attempt, due_at, created_at, started_at,
       finished_at, dead_reason, left(last_error, 500) AS last_error, run_key, priority,
       concurrency_key
  FROM (SELECT * FROM matched UNION ALL SELECT * FROM sliced UNION ALL SELECT * FROM walked) page
 ORDER BY id DESC
 LIMIT $4;

-- name: list_jobs_by_due
-- Operator listing of a due window, earliest due first, keyset-paginated by (due_at, id) after
-- ($3, $12): an id order would sort the whole window or walk the table by id (3 s at 10 million
-- rows for a month's window). Two parts merged in that order, each read only when the state
-- filter ($1) allows it: the jobs at rest (scheduled or finished) walk job_state_due_at_rest
-- forward from the window's start; the ready ones come from the claim's index and the running
-- ones from theirs, sorted (a backlog, and at most the in-flight limits). The due index leaves
-- the ready and running jobs out so that intake, the claim and the due-scan write no entry
-- there (migration 050).
-- Same filters as list_jobs ($4 is the limit, $11 the dead reason, $13 the priority, then
-- $14 to $17 as list_jobs's $13 to $16).
WITH listed AS NOT MATERIALIZED (
    SELECT id, key, queue, tenant, handler, state, attempt, due_at, created_at, started_at,
           finished_at, dead_reason, left(last_error, 500) AS last_error, run_key, priority,
           concurrency_key
      FROM dispatcher.jobs
     WHERE ($1::text IS NULL OR state = $1) AND ($2::text IS NULL OR queue = $2)
       AND ($3::timestamptz IS NULL OR (due_at, id) > ($3, $12::bigint))
       AND ($5::text IS NULL OR key = $5) AND ($6::text IS NULL OR tenant COLLATE "C" = $6)
       AND ($7::text IS NULL OR run_key = $7)
       AND ($8::text IS NULL OR handler COLLATE "C" = $8)
       AND ($9::timestamptz IS NULL OR due_at < $9)
       AND ($10::timestamptz IS NULL OR due_at >= $10)
       AND ($11::text IS NULL OR dead_reason = $11)
       AND ($13::integer IS NULL OR priority = $13)
       AND ($14::text IS NULL OR key LIKE $14)
       AND ($15::text IS NULL OR last_error ILIKE $15)
       AND ($16::bigint IS NULL OR id > $16)
       AND ($17::text IS NULL OR concurrency_key = $17)
)
-- each part ordered and limited in itself: a UNION ALL's parts are planned without the order
-- asked of the whole, and would be read whole and sorted
(SELECT * FROM listed
  WHERE state <> ALL (ARRAY['ready', 'running'])
    AND ($1::text IS NULL OR $1::text <> ALL (ARRAY['ready', 'running']))
  ORDER BY due_at, id LIMIT $4)
UNION ALL
-- the ready and running ones: their ids in the window sorted first, then each job read by id
-- with every filter until the page is full: a lateral read kept apart by its LIMIT 1 (an id
-- is one job); joined whole, the planner may hash the intents or walk the state rows. One
-- select per state: each reaches its partial index (`state = ANY` matched neither and read
-- the state rows whole).
(SELECT l.*
   FROM (SELECT id, due_at, queue, tenant, run_key, priority, concurrency_key
           FROM dispatcher.job_state
          WHERE state = 'ready' AND ($1::text IS NULL OR $1::text = 'ready')
         UNION ALL
         SELECT id, due_at, queue, tenant, run_key, priority, concurrency_key
           FROM dispatcher.job_state
          WHERE state = 'running' AND ($1::text IS NULL OR $1::text = 'running')) r
  CROSS JOIN LATERAL (SELECT * FROM listed WHERE listed.id = r.id LIMIT 1) l
  -- the filters the state row can answer (its copies of the intent's tenant, priority and
  -- key), before each job is read
  WHERE ($2::text IS NULL OR r.queue = $2) AND ($6::text IS NULL OR r.tenant = $6)
    AND ($7::text IS NULL OR r.run_key = $7) AND ($13::integer IS NULL OR r.priority = $13)
    AND ($17::text IS NULL OR r.concurrency_key = $17)
    AND ($3::timestamptz IS NULL OR (r.due_at, r.id) > ($3, $12::bigint))
    AND ($9::timestamptz IS NULL OR r.due_at < $9)
    AND ($10::timestamptz IS NULL OR r.due_at >= $10)
  ORDER BY r.due_at, r.id LIMIT $4)
ORDER BY due_at, id
LIMIT $4;

-- name: retry_job
-- Operator retry of a dead (or cancelled, or discarded) job: ready now, with a fresh attempt
-- budget.
WITH retried AS (
    UPDATE dispatcher.jobs j
       SET state = 'ready', attempt = 0, due_at = now(), budget_started_at = now(),
           finished_at = NULL, dead_reason = NULL, cancel_requested = false
     WHERE j.id = $1 AND j.state IN ('dead', 'cancelled', 'discarded')
    RETURNING j.*
), outboxed AS (
    INSERT INTO dispatcher.outbox (job_id, queue, tenant, capability, priority)
    SELECT id, queue, tenant, handler || ':' || handler_version, priority FROM retried
     WHERE dispatcher.ready_outbox()
)
SELECT id, key, request_hash, queue, tenant, handler, handler_version,
       target ->> 'url' AS target_url, state, due_at, attempt, max_attempts, max_retry_age_s,
       budget_started_at, lease_owner, lease_expires_at, cancel_requested, progress, result,
       last_error, dead_reason, run_key, created_at, started_at, finished_at, dead_letter_of,
       traceparent, priority, concurrency_key, timeout_s, expires_at, on_success, on_failure,
       replaced_by, replacements, replaced_at, debounce_until
  FROM retried;

-- name: cancel_job
-- Cancel a waiting job at once; a running one finishes its attempt and is then not retried.
WITH target AS (
    SELECT id, state FROM dispatcher.jobs WHERE id = $1 FOR UPDATE
), cancelled AS (
    UPDATE dispatcher.jobs j
       SET state = CASE WHEN t.state IN ('scheduled', 'ready') THEN 'cancelled' ELSE j.state END,
           finished_at = CASE WHEN t.state IN ('scheduled', 'ready') THEN now()
                              ELSE j.finished_at END,
           cancel_requested = (t.state = 'running')
      FROM target t WHERE j.id = t.id AND t.state IN ('scheduled', 'ready', 'running')
    RETURNING j.*
), unqueued AS (
    DELETE FROM dispatcher.outbox o USING cancelled c WHERE o.job_id = c.id
)
SELECT id, key, request_hash, queue, tenant, handler, handler_version,
       target ->> 'url' AS target_url, state, due_at, attempt, max_attempts, max_retry_age_s,
       budget_started_at, lease_owner, lease_expires_at, cancel_requested, progress, result,
       last_error, dead_reason, run_key, created_at, started_at, finished_at, dead_letter_of,
       traceparent, priority, concurrency_key, timeout_s, expires_at, on_success, on_failure,
       replaced_by, replacements, replaced_at, debounce_until
  FROM cancelled;

-- name: discard_job
-- Discard one dead letter: terminal `discarded`, kept and pruned like the dead letter it was.
UPDATE dispatcher.jobs SET state = 'discarded' WHERE id = $1 AND state = 'dead'
RETURNING id, key, request_hash, queue, tenant, handler, handler_version,
          target ->> 'url' AS target_url, state, due_at, attempt, max_attempts, max_retry_age_s,
          budget_started_at, lease_owner, lease_expires_at, cancel_requested, progress, result,
          last_error, dead_reason, run_key, created_at, started_at, finished_at, dead_letter_of,
          traceparent, priority, concurrency_key, timeout_s, expires_at, on_success,
          on_failure, replaced_by, replacements, replaced_at, debounce_until;

-- name: move_dead
-- Bulk redrive ($8 = 'ready': like a retry, with a fresh attempt budget and an outbox row) or
-- discard ($8 = 'discarded') of up to $1 dead jobs matching the filters: $2 queue, $3 dead
-- reason, $4 tenant, $5 died at or after, $6 died before (NULL matches all). $7 fences the
-- walk at the time the bulk call began: a redriven job that dies again is not taken twice.
WITH picked AS (
    SELECT id FROM dispatcher.jobs
     WHERE state = 'dead' AND finished_at <= $7
       AND ($2::text IS NULL OR queue = $2) AND ($3::text IS NULL OR dead_reason = $3)
       AND ($4::text IS NULL OR tenant = $4)
       AND ($5::timestamptz IS NULL OR finished_at >= $5)
       AND ($6::timestamptz IS NULL OR finished_at < $6)
     LIMIT $1
       FOR UPDATE SKIP LOCKED
), moved AS (
    UPDATE dispatcher.jobs j
       SET state = $8,
           attempt = CASE WHEN $8 = 'ready' THEN 0 ELSE j.attempt END,
           due_at = CASE WHEN $8 = 'ready' THEN now() ELSE j.due_at END,
           budget_started_at = CASE WHEN $8 = 'ready' THEN now() ELSE j.budget_started_at END,
           finished_at = CASE WHEN $8 = 'ready' THEN NULL ELSE j.finished_at END,
           dead_reason = CASE WHEN $8 = 'ready' THEN NULL ELSE j.dead_reason END,
           cancel_requested = false
     WHERE j.id = ANY (ARRAY(SELECT id FROM picked)) AND j.state = 'dead'
    RETURNING j.id, j.state, j.queue, j.tenant, j.handler, j.handler_version, j.priority
), outboxed AS (
    INSERT INTO dispatcher.outbox (job_id, queue, tenant, capability, priority)
    SELECT id, queue, tenant, handler || ':' || handler_version, priority FROM moved
     WHERE state = 'ready' AND dispatcher.ready_outbox()
)
SELECT count(*)::int FROM moved;

-- name: count_dead
-- A bulk call's dry run: how many dead jobs match the filters of move_dead (same parameters
-- $1 to $7), counting at most $1.
SELECT count(*)::int FROM (
    SELECT 1 FROM dispatcher.jobs
     WHERE state = 'dead' AND finished_at <= $7
       AND ($2::text IS NULL OR queue = $2) AND ($3::text IS NULL OR dead_reason = $3)
       AND ($4::text IS NULL OR tenant = $4)
       AND ($5::timestamptz IS NULL OR finished_at >= $5)
       AND ($6::timestamptz IS NULL OR finished_at < $6)
     LIMIT $1
) matching;

-- name: job_placement
-- Reschedule, first step: the state of job $1 and where its outbox row would be (no lock).
SELECT state, queue, tenant, priority FROM dispatcher.jobs WHERE id = $1;

-- name: withdraw_outbox_row
-- Reschedule of ready job $1 to a time $4 later than now: withdraw its outbox row first ($2
-- queue, $5 priority and $3 tenant reach it by the claim index), so the outbox lock is taken
-- before the job row's, in the order a claim takes them (never a deadlock with a claim in
-- flight).
DELETE FROM dispatcher.outbox
 WHERE queue = $2 AND priority = $5 AND tenant = $3 AND job_id = $1 AND $4::timestamptz > now();

-- name: reschedule_job
-- Move job $1, seen in state $3, to due time $2 (NULL = now): `scheduled` when later than now,
-- else `ready` (an outbox row written here if it was scheduled). A job never attempted measures
-- its retry age from the new due time, or from now if that is past (greatest() skips a NULL).
-- The idempotency fingerprint (request_hash) is untouched.
WITH moved AS (
    UPDATE dispatcher.jobs j
       SET due_at = coalesce($2, now()),
           state = CASE WHEN coalesce($2, now()) > now() THEN 'scheduled' ELSE 'ready' END,
           budget_started_at = CASE WHEN j.attempt = 0 THEN greatest($2, now())
                                    ELSE j.budget_started_at END
     WHERE j.id = $1 AND j.state = $3
    RETURNING j.*
), outboxed AS (
    INSERT INTO dispatcher.outbox (job_id, queue, tenant, capability, priority)
    SELECT id, queue, tenant, handler || ':' || handler_version, priority FROM moved
     WHERE state = 'ready' AND $3 = 'scheduled' AND dispatcher.ready_outbox()
)
SELECT * FROM moved;

-- name: list_queues
-- The queue registry: pause state, dead-letter notification, the SQL door's defaults.
SELECT name, paused, paused_at, max_attempts, max_retry_age_s, on_dead_target, on_dead_queue
  FROM dispatcher.queues
 ORDER BY name;

-- name: set_queue_paused
-- Pause ($2 true) or resume ($2 false) queue $1; pausing a paused queue keeps its paused_at.
UPDATE dispatcher.queues q
   SET paused = $2, paused_at = CASE WHEN $2 THEN coalesce(q.paused_at, now()) END
 WHERE q.name = $1
RETURNING name, paused, paused_at, max_attempts, max_retry_age_s, on_dead_target, on_dead_queue;

-- name: sync_queue_on_dead
-- Keep queue $1's dead-letter notification ($2 target, $3 queue; NULL: none) as configured.
UPDATE dispatcher.queues SET on_dead_target = $2::jsonb, on_dead_queue = $3 WHERE name = $1;

-- name: upsert_queue
-- Keep the queue registry (defaults the SQL door applies, global limits $4-$6) in step with the
-- configuration; a new bucket (new queue, or no rate before) starts full, a lowered burst caps
-- the tokens held. A run-time override (migration 025) keeps winning over the file's limit.
INSERT INTO dispatcher.queues AS q (name, max_attempts, max_retry_age_s, rate_per_s, burst,
                                    max_inflight, tokens)
VALUES ($1, $2, $3, $4, $5, $6, coalesce($5, 0))
    ON CONFLICT (name) DO UPDATE
   SET max_attempts = excluded.max_attempts, max_retry_age_s = excluded.max_retry_age_s,
       rate_per_s = coalesce((q.overrides->>'rate_per_s')::float8, excluded.rate_per_s),
       burst = coalesce((q.overrides->>'burst')::integer, excluded.burst),
       max_inflight = coalesce((q.overrides->>'max_inflight')::integer, excluded.max_inflight),
       tokens = CASE WHEN q.rate_per_s IS NULL THEN excluded.tokens
                     ELSE least(q.tokens, coalesce((q.overrides->>'burst')::float8,
                                                   excluded.tokens)) END;

-- name: ensure_limit_group
-- A configured limit group exists before a queue names it; its limits are written after the
-- queues (upsert_limit_group), so the sync takes group rows after queue rows, as claims do.
INSERT INTO dispatcher.limit_groups (name) VALUES ($1) ON CONFLICT (name) DO NOTHING;

-- name: set_queue_group
-- Queue $1 shares limit group $2 (NULL: none) with priority $3 within it (lower goes first).
UPDATE dispatcher.queues SET limit_group = $2, group_priority = $3 WHERE name = $1;

-- name: set_queue_key_limits
-- Every concurrency key of queue $1 gets these limits ($2 key_rate_per_s, $3 key_burst, $4
-- key_max_inflight; NULL: none), unless an override (dispatcher.key_limits) says otherwise.
-- A run-time override (migration 025) keeps winning over the file's value.
UPDATE dispatcher.queues q
   SET key_rate_per_s = CASE WHEN q.overrides ? 'key_rate_per_s'
                             THEN (q.overrides->>'key_rate_per_s')::float8 ELSE $2 END,
       key_burst = CASE WHEN q.overrides ? 'key_burst' THEN (q.overrides->>'key_burst')::integer
                        WHEN q.overrides ? 'key_rate_per_s'
                        THEN ceil((q.overrides->>'key_rate_per_s')::float8)::integer
                        ELSE $3 END,
       key_max_inflight = CASE WHEN q.overrides ? 'key_max_inflight'
                               THEN (q.overrides->>'key_max_inflight')::integer ELSE $4 END
 WHERE q.name = $1;

-- name: upsert_limit_group
-- Keep limit group $1's limits ($2 rate_per_s, $3 burst, $4 max_inflight; NULL: none) as
-- configured; a new bucket starts full, a lowered burst caps it (the group's trigger).
INSERT INTO dispatcher.limit_groups AS g (name, rate_per_s, burst, max_inflight, tokens)
VALUES ($1, $2, $3, $4, coalesce($3, 0))
    ON CONFLICT (name) DO UPDATE
   SET rate_per_s = excluded.rate_per_s, burst = excluded.burst,
       max_inflight = excluded.max_inflight,
       tokens = CASE WHEN g.rate_per_s IS NULL THEN excluded.tokens ELSE g.tokens END
 WHERE (g.rate_per_s, g.burst, g.max_inflight)
       IS DISTINCT FROM (excluded.rate_per_s, excluded.burst, excluded.max_inflight);

-- name: drop_unconfigured_limit_groups
-- Groups no longer configured ($1: the configured names); their queues were moved out already.
DELETE FROM dispatcher.limit_groups g
 WHERE g.name <> ALL ($1::text[])
   AND NOT EXISTS (SELECT 1 FROM dispatcher.queues q WHERE q.limit_group = g.name);

-- name: sync_intake_settings
-- Keep the SQL door's past-due tolerance ($1 s) as configured (the database cannot read the
-- daemon's configuration), and whether ready jobs get outbox rows ($2: a relay transport). A
-- relay finds a row for every ready job (those that became ready without one get it here); the
-- in-process transport claims from the state rows and leaves no outbox row behind. A ready job
-- a message already carries (its record in outbox_messages, for the attempt it is ready after)
-- gets none: the lease deleted its row when it made the message, and a row here would publish
-- it a second time at every daemon's start (each waiting message then delivered twice: counted
-- duplicates). A message the broker lost is the relay's sweep's to publish again. $3: the
-- largest payload and target one job may carry (limits.max_payload_bytes, migration 029).
WITH settings AS (
    INSERT INTO dispatcher.intake_settings AS s
           (due_at_past_tolerance_s, ready_outbox, max_payload_bytes)
    VALUES ($1, $2, $3)
        ON CONFLICT (singleton) DO UPDATE
       SET due_at_past_tolerance_s = excluded.due_at_past_tolerance_s,
           ready_outbox = excluded.ready_outbox,
           max_payload_bytes = excluded.max_payload_bytes, updated_at = now()
     WHERE (s.due_at_past_tolerance_s, s.ready_outbox, s.max_payload_bytes)
           IS DISTINCT FROM (excluded.due_at_past_tolerance_s, excluded.ready_outbox,
                             excluded.max_payload_bytes)
), carried AS MATERIALIZED (  -- the jobs of messages out (in the broker, or being consumed)
    SELECT j.id, j.attempt
      FROM dispatcher.outbox_messages m
     CROSS JOIN LATERAL unnest(m.job_ids, m.attempts) AS j(id, attempt)
     WHERE $2
), backfilled AS (
    INSERT INTO dispatcher.outbox (job_id, queue, tenant, capability, priority)
    SELECT s.id, s.queue, s.tenant, s.capability, s.priority FROM dispatcher.job_state s
     WHERE $2 AND s.state = 'ready' AND s.due_at <= now()
       AND NOT EXISTS (SELECT 1 FROM dispatcher.outbox o WHERE o.job_id = s.id)
       AND NOT EXISTS (SELECT 1 FROM carried c WHERE c.id = s.id AND c.attempt = s.attempt)
), unmoved AS (
    -- jobs an in-process due-scan moved ahead of their due time (scan_due): a relay would
    -- deliver them at once, so they wait as scheduled and a due-scan moves them when due
    UPDATE dispatcher.job_state s SET state = 'scheduled'
     WHERE $2 AND s.state = 'ready' AND s.due_at > now()
), dropped AS (
    DELETE FROM dispatcher.outbox WHERE NOT $2
)
SELECT 1;

-- name: upsert_handler
-- Register a handler; the current version only moves forward, so old and new releases agree.
-- $4: the longest deadline a job may ask for (migration 030; NULL keeps the one stored).
INSERT INTO dispatcher.handlers (name, kind, current_version, max_timeout_s)
VALUES ($1, $2, $3, $4::float8)
    ON CONFLICT (name) DO UPDATE
   SET kind = excluded.kind,
       current_version = greatest(dispatcher.handlers.current_version, excluded.current_version),
       max_timeout_s = coalesce(excluded.max_timeout_s, dispatcher.handlers.max_timeout_s);

-- name: count_by_state
-- Jobs per queue and state, for metrics and the status view.
SELECT queue, state, count(*)::bigint AS n FROM dispatcher.job_state GROUP BY queue, state;

-- name: oldest_ready_age
-- How long the longest-waiting ready job of each queue has waited: since its due time, or
-- since its last attempt started when that came later (a job handed back by a draining
-- daemon waits from then, not from a due time long past). One walk of the ready jobs.
-- (epochs, not `now() - min(...)`, which raises on a row stored with '-infinity')
SELECT queue,
       (extract(epoch FROM now())
        - extract(epoch FROM min(greatest(due_at, coalesce(started_at, due_at)))))::float8
           AS age_s
  FROM dispatcher.job_state
 WHERE state = 'ready' AND due_at <= now()  -- not those moved ahead of their due time
 GROUP BY queue;

-- name: now
-- The database clock.
SELECT now();

-- name: lock_running_job
-- Lock the job row for an in-database effect; no row means the lease is no longer ours.
SELECT 1 FROM dispatcher.job_state
 WHERE id = $1 AND attempt = $2 AND lease_owner = $3 AND state = 'running'
   FOR UPDATE;

-- name: count_overdue
-- Jobs due more than $1 seconds ago that are still not terminal, per queue. Each branch walks
-- only its own small partial index (never the whole table, which may hold millions of future
-- jobs): scheduled by due time, ready per queue and tenant, running by lease.
SELECT queue, count(*)::bigint AS n FROM (
    SELECT queue FROM dispatcher.job_state
     WHERE state = 'scheduled' AND due_at < now() - make_interval(secs => $1)
    UNION ALL
    SELECT queue FROM dispatcher.job_state
     WHERE state = 'ready' AND due_at < now() - make_interval(secs => $1)
    UNION ALL
    SELECT queue FROM dispatcher.job_state
     WHERE state = 'running' AND lease_expires_at IS NOT NULL
       AND due_at < now() - make_interval(secs => $1)
) overdue
GROUP BY queue;

-- name: prune_terminal
-- Delete up to $3 jobs in terminal state $1 finished more than $2 seconds ago: state row,
-- intent and attempt history (no foreign key does it: see migration 008); returns how many.
-- Each key goes to the key ledger (migration 029) in the same statement: a replay finds it
-- the moment the job is gone.
WITH doomed AS (
    SELECT id FROM dispatcher.job_state
     WHERE state = $1 AND finished_at < now() - make_interval(secs => $2)
     ORDER BY finished_at
     LIMIT $3
       FOR UPDATE SKIP LOCKED
), pruned AS (
    DELETE FROM dispatcher.job_state s WHERE s.id = ANY (ARRAY(SELECT id FROM doomed))
    RETURNING s.id, s.state, s.finished_at
), intents AS (
    DELETE FROM dispatcher.intents i WHERE i.id = ANY (ARRAY(SELECT id FROM pruned))
    RETURNING i.id, i.key, i.request_hash
), ledger AS (
    INSERT INTO dispatcher.key_ledger AS l (key, request_hash, job_id, state, finished_at)
    SELECT i.key, i.request_hash, i.id, p.state, p.finished_at
      FROM intents i JOIN pruned p ON p.id = i.id
        -- a key can name a second job only if its ledger row was pruned first: newest wins
        ON CONFLICT (key) DO UPDATE
       SET request_hash = excluded.request_hash, job_id = excluded.job_id,
           state = excluded.state, finished_at = excluded.finished_at
), history AS (
    DELETE FROM dispatcher.attempts a WHERE a.job_id = ANY (ARRAY(SELECT id FROM pruned))
)
SELECT count(*)::int FROM pruned;

-- name: prune_keys
-- Forget up to $2 keys of the key ledger whose jobs finished more than $1 seconds ago
-- (retention.keys_s): from then on the key may name new work.
WITH doomed AS (
    SELECT key FROM dispatcher.key_ledger
     WHERE finished_at < now() - make_interval(secs => $1)
     ORDER BY finished_at
     LIMIT $2
       FOR UPDATE SKIP LOCKED
)
DELETE FROM dispatcher.key_ledger l USING doomed d WHERE l.key = d.key;

-- name: estimated_jobs
-- The planner's row estimate of the jobs (pg_class.reltuples of the state table; -1 before any
-- ANALYZE).
SELECT reltuples::float8 FROM pg_class WHERE oid = 'dispatcher.job_state'::regclass;

-- name: estimate_by_state
-- Jobs per queue and state estimated from planner statistics ($1 = the table's row estimate),
-- for tables too large to count on a timer: frequency of the state times frequency of the queue.
WITH states AS (
    SELECT v AS state, f AS freq
      FROM pg_stats s, unnest(s.most_common_vals::text::text[], s.most_common_freqs) AS u(v, f)
     WHERE s.schemaname = 'dispatcher' AND s.tablename = 'job_state' AND s.attname = 'state'
), queues AS (
    SELECT v AS queue, f AS freq
      FROM pg_stats s, unnest(s.most_common_vals::text::text[], s.most_common_freqs) AS u(v, f)
     WHERE s.schemaname = 'dispatcher' AND s.tablename = 'job_state' AND s.attname = 'queue'
)
SELECT q.queue, s.state, round($1 * s.freq * q.freq)::bigint AS n FROM states s, queues q;

-- name: error_search_indexed
-- Whether the last-error search has its trigram index (migration 039 builds it where pg_trgm
-- can be created), valid and ready.
SELECT EXISTS (SELECT FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
                WHERE c.relname = 'jobs_last_error_trgm'
                  AND c.relnamespace = 'dispatcher'::regnamespace AND i.indisvalid);

-- name: prefix_extent
-- Before a key-prefix page (job_reads.prefix_slice): how many keys start with $1 (a LIKE
-- pattern) below id $2 (NULL: any), counted to $3 at most from jobs_key_prefix_id alone, and
-- the oldest and newest ids (each one end of the primary key).
SELECT (SELECT count(*) FROM (SELECT FROM dispatcher.intents
                               WHERE key LIKE $1 AND ($2::bigint IS NULL OR id < $2)
                               LIMIT $3::integer) m)::integer AS matches,
       (SELECT min(id) FROM dispatcher.intents) AS oldest,
       (SELECT max(id) FROM dispatcher.intents) AS newest;

-- name: error_scan_floor
-- Without that index: the id above which the newest $1 jobs are (a constant for the list
-- statement, which the planner then estimates as the range it is).
SELECT coalesce(max(id), 0) - $1 FROM dispatcher.job_state;

-- name: dead_letter_groups
-- The console's dead letters by queue and reason: per queue of the registry, its newest $1
-- dead jobs (a backward walk of jobs_terminal), grouped; a queue's counts add up to $1 at most.
SELECT q.name AS queue, d.dead_reason, count(*)::int AS n, max(d.finished_at) AS newest,
       min(d.finished_at) AS oldest
  FROM dispatcher.queues q
 CROSS JOIN LATERAL (
       SELECT j.dead_reason, j.finished_at FROM dispatcher.job_state j
        WHERE j.state = 'dead' AND j.queue = q.name
        ORDER BY j.finished_at DESC
        LIMIT $1) d
 GROUP BY q.name, d.dead_reason
 ORDER BY max(d.finished_at) DESC;

