-- A memory budget for jobs in flight (issue 20, defect 3; docs/memory.md).
--
-- Measured before: a daemon draining 2,000 jobs of 3 MB (stored through the SQL door, which
-- has no size limit) peaked at 1,221 MB resident; a claim took up to `claim_batch` jobs
-- whatever their size. Now each claim is given a number of bytes, and takes the longest prefix
-- of its candidates whose payload and target bytes fit (one job larger than the whole budget
-- still runs when the daemon holds nothing else: `alone`).
--
-- The size must be cheap to read in the claim: each intent records it when it is written, by
-- a trigger, so every door (HTTP intake, dispatcher.enqueue, enqueue_many, cron, a row inserted
-- into dispatcher.jobs or dispatcher.intents directly) sets it. Rows stored before this
-- migration have none: the claim measures those (stored_bytes) when it meets them.

-- The bytes of a payload and target as the daemon receives them. A value not compressed (any
-- value a door was just given) has its size in its header: O(1), nothing read. A compressed
-- one (copied from another table's row, or stored before this migration) is measured by its
-- text, which the daemon receives: it costs a read, once.
CREATE FUNCTION dispatcher.stored_bytes(payload jsonb, target jsonb) RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT (CASE WHEN pg_column_compression(payload) IS NULL
                 THEN coalesce(pg_column_size(payload), 0)
                 ELSE octet_length(payload::text) END)::bigint
         + (CASE WHEN pg_column_compression(target) IS NULL
                 THEN coalesce(pg_column_size(target), 0)
                 ELSE octet_length(target::text) END)::bigint
$$;

ALTER TABLE dispatcher.intents ADD COLUMN size_bytes bigint;

CREATE FUNCTION dispatcher.intent_bytes() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.size_bytes := dispatcher.stored_bytes(NEW.payload, NEW.target);
    RETURN NEW;
END
$$;

CREATE TRIGGER intents_size_bytes
    BEFORE INSERT OR UPDATE OF payload, target ON dispatcher.intents
    FOR EACH ROW EXECUTE FUNCTION dispatcher.intent_bytes();
