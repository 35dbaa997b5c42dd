-- A queue's new limits apply at once (migration 024): the permits parked under the old ones are
-- dropped and given back to the bucket, capped at the new burst; the refill's cap on parked
-- permits (permits_parked) is cleared. Waits for the claims that hold a slot, then empties it.
CREATE OR REPLACE FUNCTION dispatcher.limits_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    dropped bigint;
BEGIN
    SELECT coalesce(sum(p.n), 0) INTO dropped FROM (
        SELECT n FROM dispatcher.claim_permits
         WHERE queue = NEW.name AND n > 0
           FOR UPDATE) p;
    IF dropped > 0 THEN
        UPDATE dispatcher.claim_permits SET n = 0 WHERE queue = NEW.name AND n > 0;
    END IF;
    NEW.permits_parked := 0;
    IF NEW.rate_per_s IS NOT NULL THEN
        NEW.tokens := least(NEW.burst, greatest(NEW.tokens, 0) + dropped);
    END IF;
    RETURN NEW;
END
$$;

CREATE OR REPLACE TRIGGER queues_limits_changed
    BEFORE UPDATE OF rate_per_s, burst, max_inflight, limit_group ON dispatcher.queues
    FOR EACH ROW
    WHEN ((OLD.rate_per_s, OLD.burst, OLD.max_inflight, OLD.limit_group)
          IS DISTINCT FROM (NEW.rate_per_s, NEW.burst, NEW.max_inflight, NEW.limit_group))
    EXECUTE FUNCTION dispatcher.limits_changed();

-- A group's new limits apply at once: its bucket never holds more than the new burst.
CREATE OR REPLACE FUNCTION dispatcher.group_limits_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.rate_per_s IS NOT NULL THEN
        NEW.tokens := least(NEW.burst, greatest(NEW.tokens, 0));
    END IF;
    RETURN NEW;
END
$$;

CREATE OR REPLACE TRIGGER limit_groups_limits_changed
    BEFORE UPDATE OF rate_per_s, burst, max_inflight ON dispatcher.limit_groups
    FOR EACH ROW EXECUTE FUNCTION dispatcher.group_limits_changed();
