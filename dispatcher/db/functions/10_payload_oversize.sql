-- The bytes of a job's payload and target as JSON text (what the daemon receives) when they
-- exceed `max_bytes`, else NULL. The text is rendered only for a job that could exceed it:
-- jsonb's text is at most six times its binary size (a control character, 1 byte stored, is
-- written \u0001), so a small job costs two header reads, not a rendering. STABLE, as what it
-- calls is (pg_column_size): so declared, it is inlined into the calling query, where a
-- function call per item cost as much as the rest of the check.
CREATE OR REPLACE FUNCTION dispatcher.payload_oversize(payload jsonb, target jsonb,
                                                        max_bytes bigint)
RETURNS bigint LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN 6 * (coalesce(pg_column_size(payload), 0)
                          + coalesce(pg_column_size(target), 0)) + 64 <= max_bytes THEN NULL
                ELSE nullif(greatest(coalesce(octet_length(payload::text), 0)
                                     + coalesce(octet_length(target::text), 0), max_bytes),
                            max_bytes)
           END
$$;
