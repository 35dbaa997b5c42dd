-- Limiter state that outlives a limits change (issue 22, "lowering a queue's limits stalls it").
--
-- Measured before (tests/db/test_limits_change.py): a queue at 1000/s, burst 1000, 2,000 in
-- flight, one claim of 100 parks 8 x 100 permits (migration 016); lowering the limits to 2/s,
-- burst 5, 4 in flight dropped those permits (the trigger) but left `permits_parked` at 800.
-- The next refill was capped at burst - permits_parked = 5 - 800, the bucket went 795 tokens
-- into debt and the queue started nothing for 398 s. On daemons (2 drain 3,000 jobs, one is
-- killed, 3 start with the lower limits) it started 23-68 jobs in 10 s instead of ~128.
--
-- What a queue's limiter keeps between claims, and what a change of its limits now does to it:
--   claim_permits.n     parked under the old limits: dropped, and given back to the bucket
--                       (they were part of its level), which is then capped at the new burst
--   permits_parked      the cap on the next refill: zero, since nothing is parked any more
--   tokens              at most the new burst (a raised one refills at the new rate)
--   tokens_at           kept: the refill since then is credited at the new rate, capped by the
--                       new burst, so the bucket's level never passes the new burst
--   running jobs        counted afresh by every claim (job_state), nothing cached
-- The change takes the queue row first, then the slots (waiting for the claims that hold one,
-- which never wait for the queue row while they do), so no claim sees half of it. The same
-- trigger serves every door that changes limits: the daemon's start with another file
-- (upsert_queue), a run-time change, a plain UPDATE.
--
-- And what no door may write: a rate without a burst (the refill had no cap at all).
ALTER TABLE dispatcher.queues
    ADD CONSTRAINT queues_rate_needs_a_burst CHECK (rate_per_s IS NULL OR burst IS NOT NULL);

DROP TRIGGER queues_limits_changed ON dispatcher.queues;
DROP FUNCTION dispatcher.drop_claim_permits();

CREATE FUNCTION dispatcher.limits_changed() RETURNS trigger
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

CREATE TRIGGER queues_limits_changed
    BEFORE UPDATE OF rate_per_s, burst, max_inflight ON dispatcher.queues
    FOR EACH ROW
    WHEN ((OLD.rate_per_s, OLD.burst, OLD.max_inflight)
          IS DISTINCT FROM (NEW.rate_per_s, NEW.burst, NEW.max_inflight))
    EXECUTE FUNCTION dispatcher.limits_changed();

-- A bucket already in debt from the defect (tokens below zero) is made whole.
UPDATE dispatcher.queues SET tokens = 0, permits_parked = 0 WHERE tokens < 0;
