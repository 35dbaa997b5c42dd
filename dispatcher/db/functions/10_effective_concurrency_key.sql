-- The concurrency key a door stores for the key it was asked for (migration 023): NULL asks for
-- the default, the job's tenant (none without one); '' asks for no key.
CREATE OR REPLACE FUNCTION dispatcher.effective_concurrency_key(requested text, tenant text)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN requested IS NULL THEN nullif(tenant, '') ELSE nullif(requested, '') END
$$;
