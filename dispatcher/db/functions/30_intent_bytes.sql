-- Each intent records the bytes of its payload and target when written, whatever the door, so
-- the claim's memory budget reads them cheaply (migration 020).
CREATE OR REPLACE FUNCTION dispatcher.intent_bytes() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.size_bytes := dispatcher.stored_bytes(NEW.payload, NEW.target);
    RETURN NEW;
END
$$;

CREATE OR REPLACE TRIGGER intents_size_bytes
    BEFORE INSERT OR UPDATE OF payload, target ON dispatcher.intents
    FOR EACH ROW EXECUTE FUNCTION dispatcher.intent_bytes();
