-- The bytes of a payload and target as the daemon receives them. A value not compressed (any
-- value a door was just given) has its size in its header: O(1), nothing read. A compressed
-- one (copied from another table's row, or stored before this migration) is measured by its
-- text, which the daemon receives: it costs a read, once.
CREATE OR REPLACE FUNCTION dispatcher.stored_bytes(payload jsonb, target jsonb) RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT (CASE WHEN pg_column_compression(payload) IS NULL
                 THEN coalesce(pg_column_size(payload), 0)
                 ELSE octet_length(payload::text) END)::bigint
         + (CASE WHEN pg_column_compression(target) IS NULL
                 THEN coalesce(pg_column_size(target), 0)
                 ELSE octet_length(target::text) END)::bigint
$$;
