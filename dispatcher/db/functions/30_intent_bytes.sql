-- Each intent records the bytes of its payload and target when written, whatever the door, so
-- the claim's memory budget reads them cheaply (migration 020).
CREATE OR REPLACE FUNCTION dispatcher.intent_bytes() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.size_bytes := dispatcher.stored_bytes(NEW.payload, NEW.target);
    RETURN NEW;
END
$$;

-- An insert that wrote the size itself (dispatcher.enqueue_many_internal, with the same
-- dispatcher.stored_bytes, inlined into its statement) skips the call: a PL/pgSQL trigger per
-- row cost a bulk job about 1 us of PostgreSQL CPU (2026-12-03 evening). Every other insert,
-- and every change of a payload or target, is measured here.
CREATE OR REPLACE TRIGGER intents_size_bytes
    BEFORE INSERT ON dispatcher.intents
    FOR EACH ROW WHEN (NEW.size_bytes IS NULL) EXECUTE FUNCTION dispatcher.intent_bytes();

CREATE OR REPLACE TRIGGER intents_size_bytes_changed
    BEFORE UPDATE OF payload, target ON dispatcher.intents
    FOR EACH ROW EXECUTE FUNCTION dispatcher.intent_bytes();
