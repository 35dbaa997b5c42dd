-- The broker confirmed these messages (ids) of relay `relay_name`: their records name no relay
-- from now on. The message is in the broker, so the rescue after that relay's daemon ends (a
-- stop, a kill) gives none of them back to be published twice; the sweep still covers a
-- message the broker loses. A record a claim holds at that moment is skipped (it stays the
-- relay's: a duplicate after a kill at worst), so the relay never waits on a claim, nor two
-- statements on each other's records. How many were recorded.
CREATE OR REPLACE FUNCTION dispatcher.record_confirms(relay_name text, ids bigint[])
RETURNS integer
LANGUAGE plpgsql VOLATILE
-- each record by its id, whatever the statistics of a table that churns say
SET plan_cache_mode = auto SET enable_seqscan = off
AS $$
DECLARE
    recorded integer;
BEGIN
    UPDATE dispatcher.outbox_messages m SET relay = ''
     WHERE m.id = ANY (ARRAY(SELECT x.id FROM dispatcher.outbox_messages x
                              WHERE x.id = ANY (ids) AND x.relay = relay_name
                                FOR UPDATE SKIP LOCKED));
    GET DIAGNOSTICS recorded = ROW_COUNT;
    RETURN recorded;
END
$$;
