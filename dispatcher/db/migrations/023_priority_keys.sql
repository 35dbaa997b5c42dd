-- Job priorities and concurrency keys (issue 22, points 1 and 4's storage; docs/guides/
-- priorities-and-fairness.md).
--
--   priority         smallint, -100..100, lower runs first, default 0. A claim takes the lowest
--                    value first; within one value tenants take turns; within a tenant the
--                    earliest due first.
--   concurrency_key  text of 1 to 200 characters, or NULL for no key. The doors default it to
--                    the job's tenant (NULL when the job has no tenant); the per-key limits
--                    (key_max_inflight, ...) count jobs by it.
--
-- Both live on the intent (what was asked) and are copied into the state row, where the claim
-- and the per-key limits read them, and into the outbox, where the relay orders its messages
-- by priority. The doors take them as the last arguments of dispatcher.enqueue and
-- dispatcher.enqueue_many (priority => -10, concurrency_key => 'acct-7'); at the SQL door a
-- NULL key means the default (the tenant) and '' means no key. The idempotency fingerprint
-- covers both, but only where they differ from their defaults, so every fingerprint stored
-- before this migration still matches a retry of its request.
--
-- Upgrade cost: adding the columns rewrites nothing (constant defaults; the checks are NOT
-- VALID: every existing row holds the default). Jobs not finished get their tenant as key
-- (one update of those rows); the ready-claim index and the outbox's claim index are rebuilt
-- with the priority in front (one read of the state rows and of the outbox).

ALTER TABLE dispatcher.intents
    ADD COLUMN priority smallint NOT NULL DEFAULT 0,
    ADD COLUMN concurrency_key text,
    ADD CONSTRAINT intents_priority_range CHECK (priority BETWEEN -100 AND 100) NOT VALID,
    ADD CONSTRAINT intents_concurrency_key_length
        CHECK (length(concurrency_key) BETWEEN 1 AND 200) NOT VALID;
ALTER TABLE dispatcher.job_state
    ADD COLUMN priority smallint NOT NULL DEFAULT 0,
    ADD COLUMN concurrency_key text;
ALTER TABLE dispatcher.outbox
    ADD COLUMN priority smallint NOT NULL DEFAULT 0;

-- Unfinished jobs get the default key, as if accepted with it (finished ones are never claimed).
UPDATE dispatcher.job_state SET concurrency_key = tenant
 WHERE state IN ('scheduled', 'ready', 'running') AND tenant <> '';
UPDATE dispatcher.intents i SET concurrency_key = s.concurrency_key
  FROM dispatcher.job_state s
 WHERE s.id = i.id AND s.concurrency_key IS NOT NULL;

-- The claim walks ready jobs by priority, then tenant, then due time (claim_ready).
DROP INDEX dispatcher.jobs_ready_claim;
CREATE INDEX jobs_ready_claim ON dispatcher.job_state (queue, priority, tenant, due_at, id)
    WHERE state = 'ready';
-- The relay leases unpublished rows by priority, then tenant, then age (lease_outbox).
DROP INDEX dispatcher.outbox_claim;
CREATE INDEX outbox_claim ON dispatcher.outbox (queue, priority, tenant, id);
-- The operator's priority filter (GET /v1/jobs?priority=): the jobs off the default, newest
-- first (a filter for the default 0 fills a page from the primary key: most jobs match).
CREATE INDEX jobs_priority_id ON dispatcher.job_state (priority, id) WHERE priority <> 0;

-- Signature changes (the bodies, with the new arguments, are in db/functions/): the doors take
-- `priority` and `concurrency_key` last (10_enqueue.sql, 10_enqueue_many.sql,
-- 10_enqueue_many_internal.sql, 10_enqueue_check.sql), and the fingerprint two more parts
-- (10_request_fingerprint.sql). The claim's and the relay's picks are 10_claim_pick.sql and
-- 10_relay_pick.sql.
DROP FUNCTION IF EXISTS
    dispatcher.enqueue(text, text, jsonb, timestamptz, text, text, jsonb, integer, integer);
DROP FUNCTION IF EXISTS
    dispatcher.enqueue_check(text[], text[], jsonb[], text[], jsonb[], integer[], integer[]);
DROP FUNCTION IF EXISTS
    dispatcher.enqueue_many(text[], text[], jsonb[], timestamptz[], text[], text[], jsonb[],
                            integer[], integer[], text[]);
DROP FUNCTION IF EXISTS
    dispatcher.enqueue_many_internal(text[], text[], jsonb[], timestamptz[], text[], text[],
                                     jsonb[], integer[], integer[], text[]);
DROP FUNCTION IF EXISTS
    dispatcher.request_fingerprint(text, jsonb, jsonb, text, text, timestamptz, integer, integer);
