-- Two histograms' bucket counts added element by element (a shorter array counts as zeros
-- beyond its end): how a history row takes another daemon's latency buckets.
CREATE OR REPLACE FUNCTION dispatcher.history_add_buckets(a bigint[], b bigint[])
RETURNS bigint[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(array_agg(coalesce(x, 0) + coalesce(y, 0) ORDER BY i), '{}')
      FROM unnest(coalesce(a, '{}'), coalesce(b, '{}')) WITH ORDINALITY AS u(x, y, i)
$$;
