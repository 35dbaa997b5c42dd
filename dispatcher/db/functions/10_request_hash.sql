-- The idempotency fingerprint, version 1 (md5), of requests accepted before migration 005: a
-- retry of such a job is compared with it. jsonb text is canonical (sorted keys).
CREATE OR REPLACE FUNCTION dispatcher.request_hash(
    handler text, target jsonb, payload jsonb, queue text, tenant text,
    requested_due_at timestamptz, max_attempts integer, max_retry_age_s integer
) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT md5(jsonb_build_array(handler, target, payload, queue, tenant,
                                 extract(epoch FROM requested_due_at),
                                 max_attempts, max_retry_age_s)::text)
$$;
