-- Give back the permits or tokens of a grant the claim did not use, where they came from (the
-- queue's slot or bucket, and its group's bucket); returns `wait_s` unchanged, so the claim can
-- call it from the row it always returns.
CREATE OR REPLACE FUNCTION dispatcher.claim_settle(q text, granted integer, started integer,
                                                   wait_s float8)
RETURNS float8
LANGUAGE plpgsql VOLATILE
-- planned once per connection and kept, read by index (10_claim_pick.sql says why)
SET plan_cache_mode = auto SET enable_seqscan = off
AS $$
DECLARE
    first_slot text := nullif(current_setting('dispatcher.permit_slot', true), '');
BEGIN
    IF granted > started THEN
        IF first_slot IS NOT NULL THEN  -- this transaction holds that slot's row
            UPDATE dispatcher.claim_permits SET n = n + (granted - started)
             WHERE queue = q AND slot = first_slot::integer;
        ELSE
            UPDATE dispatcher.queues
               SET tokens = least(burst, tokens + (granted - started))
             WHERE name = q AND rate_per_s IS NOT NULL;
            -- the queue row is locked by this claim (a grouped queue never claims on a slot)
            UPDATE dispatcher.limit_groups g
               SET tokens = least(g.burst, g.tokens + (granted - started))
              FROM dispatcher.queues m
             WHERE m.name = q AND g.name = m.limit_group AND g.rate_per_s IS NOT NULL;
        END IF;
    END IF;
    RETURN wait_s;
END
$$;
