-- The idempotency fingerprint, version 2: each part hashed with the functions PostgreSQL's hash
-- partitioning uses (stable across major versions), each with its own seed; JSON as jsonb's
-- canonical text; the due time as UTC. 64 bits, prefixed 'v2:'. Why: migration 005.
CREATE OR REPLACE FUNCTION dispatcher.request_fingerprint(
    handler text, target jsonb, payload jsonb, queue text, tenant text,
    requested_due_at timestamptz, max_attempts integer, max_retry_age_s integer
) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT 'v2:' || (hashtextextended(handler, 1)
                     # coalesce(hashtextextended(target::text, 2), 0)
                     # hashtextextended(payload::text, 3)
                     # hashtextextended(queue, 4)
                     # hashtextextended(tenant, 5)
                     # coalesce(timestamp_hash_extended(requested_due_at AT TIME ZONE 'UTC', 6), 0)
                     # coalesce(hashint4extended(max_attempts, 7), 0)
                     # coalesce(hashint4extended(max_retry_age_s, 8), 0))::text
$$;
