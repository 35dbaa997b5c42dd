-- The idempotency fingerprint, version 2: each part hashed with the functions PostgreSQL's hash
-- partitioning uses (stable across major versions), each with its own seed; JSON as jsonb's
-- canonical text; the due time as UTC. 64 bits, prefixed 'v2:'. Why: migration 005.
-- `priority` and `concurrency_key` (as asked at the door: NULL the default, '' none; migration
-- 023) are two more parts, each left out while it asks for its default, so a request that sets
-- neither hashes exactly as before.
-- The same of a request whose target and payload are given as their text (target::text,
-- payload::text): the batch door renders each payload once, for this and for its size.
CREATE OR REPLACE FUNCTION dispatcher.request_fingerprint_text(
    handler text, target text, payload text, queue text, tenant text,
    requested_due_at timestamptz, max_attempts integer, max_retry_age_s integer,
    priority integer DEFAULT 0, concurrency_key text DEFAULT NULL
) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT 'v2:' || (hashtextextended(handler, 1)
                     # coalesce(hashtextextended(target, 2), 0)
                     # hashtextextended(payload, 3)
                     # hashtextextended(queue, 4)
                     # hashtextextended(tenant, 5)
                     # coalesce(timestamp_hash_extended(requested_due_at AT TIME ZONE 'UTC', 6), 0)
                     # coalesce(hashint4extended(max_attempts, 7), 0)
                     # coalesce(hashint4extended(max_retry_age_s, 8), 0)
                     # CASE WHEN coalesce(priority, 0) = 0 THEN 0
                            ELSE hashint4extended(priority, 9) END
                     # CASE WHEN dispatcher.effective_concurrency_key(concurrency_key, tenant)
                                 IS NOT DISTINCT FROM nullif(tenant, '') THEN 0
                            -- no key where the tenant would give one: a part of its own
                            ELSE coalesce(hashtextextended(
                                     dispatcher.effective_concurrency_key(concurrency_key, tenant),
                                     10), 10) END)::text
$$;

CREATE OR REPLACE FUNCTION dispatcher.request_fingerprint(
    handler text, target jsonb, payload jsonb, queue text, tenant text,
    requested_due_at timestamptz, max_attempts integer, max_retry_age_s integer,
    priority integer DEFAULT 0, concurrency_key text DEFAULT NULL
) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT dispatcher.request_fingerprint_text(handler, target::text, payload::text, queue,
                                               tenant, requested_due_at, max_attempts,
                                               max_retry_age_s, priority, concurrency_key)
$$;
