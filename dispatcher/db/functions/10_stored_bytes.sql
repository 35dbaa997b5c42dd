-- The bytes of a payload and target as the daemon receives them: their JSON text. Measured by
-- rendering the text, whatever the stored size says: a jsonb's text can be thousands of times
-- its stored size (a number such as 1e131071 is stored in 10 bytes and written with 131,072
-- digits), and this figure is what the claim's memory budget reserves for a job. Rendering a
-- small payload costs about 0.25 us.
CREATE OR REPLACE FUNCTION dispatcher.stored_bytes(payload jsonb, target jsonb) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(octet_length(payload::text), 0)::bigint
         + coalesce(octet_length(target::text), 0)::bigint
$$;
