-- New limits apply at once: the permits parked under the old ones are dropped (the change waits
-- for a claim that holds a slot, then empties that slot too).
CREATE OR REPLACE FUNCTION dispatcher.drop_claim_permits() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE dispatcher.claim_permits SET n = 0 WHERE queue = NEW.name AND n > 0;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER queues_limits_changed
    AFTER UPDATE OF rate_per_s, burst, max_inflight ON dispatcher.queues
    FOR EACH ROW
    WHEN ((OLD.rate_per_s, OLD.burst, OLD.max_inflight)
          IS DISTINCT FROM (NEW.rate_per_s, NEW.burst, NEW.max_inflight))
    EXECUTE FUNCTION dispatcher.drop_claim_permits();
