-- The bytes of a job's payload and target as JSON text (what the daemon receives) when they
-- exceed `max_bytes`, else NULL. Always the rendered text, as dispatcher.stored_bytes counts
-- it: no bound from the stored size is safe (a number such as 1e131071 is stored in 10 bytes
-- and written with 131,072 digits). A plain SQL expression: inlined into the calling query,
-- where a function call per item cost as much as the rest of the check.
CREATE OR REPLACE FUNCTION dispatcher.payload_oversize(payload jsonb, target jsonb,
                                                        max_bytes bigint)
RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT nullif(greatest(coalesce(octet_length(payload::text), 0)
                           + coalesce(octet_length(target::text), 0), max_bytes),
                  max_bytes)
$$;
