-- Each limited key's count of running jobs (dispatcher.key_state.running_seen, migration 040),
-- kept by the statements that move jobs into or out of `running`, whatever they are; and reset
-- (NULL: count again at the next claim) when the key's limits change.

-- The jobs one statement moved into (+1) or out of (-1) `running`, summed per queue and key,
-- applied to the keys whose count is known, their rows locked in key order (two completions
-- of different daemons lock the same keys in the same order: no deadlock). A statement that
-- moved no keyed job in or out (a heartbeat, a due-scan) reads its rows once and stops.
CREATE OR REPLACE FUNCTION dispatcher.key_running_moved() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    qs text[];
    ks text[];
    ds integer[];
BEGIN
    -- no key counted anywhere (no key limits in use): the statement's rows are not even read
    IF NOT EXISTS (SELECT 1 FROM dispatcher.key_state WHERE running_seen IS NOT NULL) THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'UPDATE' THEN
        SELECT array_agg(m.queue ORDER BY m.queue, m.key), array_agg(m.key ORDER BY m.queue, m.key),
               array_agg(m.d ORDER BY m.queue, m.key)
          INTO qs, ks, ds
          FROM (SELECT x.queue, x.key, sum(x.d)::integer AS d FROM (
                    SELECT o.queue, o.concurrency_key AS key, -1 AS d
                      FROM old_rows o WHERE o.state = 'running' AND o.concurrency_key IS NOT NULL
                    UNION ALL
                    SELECT n.queue, n.concurrency_key, 1
                      FROM new_rows n WHERE n.state = 'running' AND n.concurrency_key IS NOT NULL
                ) x GROUP BY x.queue, x.key HAVING sum(x.d) <> 0) m;
    ELSE
        SELECT array_agg(m.queue ORDER BY m.queue, m.key), array_agg(m.key ORDER BY m.queue, m.key),
               array_agg(m.d ORDER BY m.queue, m.key)
          INTO qs, ks, ds
          FROM (SELECT o.queue, o.concurrency_key AS key, -count(*)::integer AS d
                  FROM old_rows o WHERE o.state = 'running' AND o.concurrency_key IS NOT NULL
                 GROUP BY o.queue, o.concurrency_key) m;
    END IF;
    IF qs IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM 1 FROM dispatcher.key_state k
      JOIN unnest(qs, ks) AS m(queue, key) ON k.queue = m.queue AND k.key = m.key
     WHERE k.running_seen IS NOT NULL
     ORDER BY k.queue, k.key
       FOR UPDATE OF k;
    UPDATE dispatcher.key_state k SET running_seen = greatest(0, k.running_seen + m.d)
      FROM unnest(qs, ks, ds) AS m(queue, key, d)
     WHERE k.queue = m.queue AND k.key = m.key AND k.running_seen IS NOT NULL;
    RETURN NULL;
END
$$;

-- Heartbeats and other updates that keep a running job running pass through the same function:
-- their old and new rows cancel out per key. The transition tables cost a row copy each (a
-- trigger on `UPDATE OF state` cannot have them).
CREATE OR REPLACE TRIGGER job_state_key_running
    AFTER UPDATE ON dispatcher.job_state
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION dispatcher.key_running_moved();

CREATE OR REPLACE TRIGGER job_state_key_running_deleted
    AFTER DELETE ON dispatcher.job_state
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION dispatcher.key_running_moved();

-- A queue's key limits changed: its keys' counts are counted again at their next claim (a key
-- that was not limited while jobs ran was not counted).
CREATE OR REPLACE FUNCTION dispatcher.key_limits_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'queues' THEN
        UPDATE dispatcher.key_state SET running_seen = NULL
         WHERE queue = NEW.name AND running_seen IS NOT NULL;
    ELSIF TG_OP = 'DELETE' THEN
        UPDATE dispatcher.key_state SET running_seen = NULL
         WHERE queue = OLD.queue AND key = OLD.key AND running_seen IS NOT NULL;
    ELSE
        UPDATE dispatcher.key_state SET running_seen = NULL
         WHERE queue = NEW.queue AND key = NEW.key AND running_seen IS NOT NULL;
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER queues_key_limits_changed
    AFTER UPDATE OF key_max_inflight, key_rate_per_s, key_burst ON dispatcher.queues
    FOR EACH ROW
    WHEN ((OLD.key_max_inflight, OLD.key_rate_per_s, OLD.key_burst)
          IS DISTINCT FROM (NEW.key_max_inflight, NEW.key_rate_per_s, NEW.key_burst))
    EXECUTE FUNCTION dispatcher.key_limits_changed();

CREATE OR REPLACE TRIGGER key_limits_changed
    AFTER INSERT OR UPDATE OR DELETE ON dispatcher.key_limits
    FOR EACH ROW EXECUTE FUNCTION dispatcher.key_limits_changed();
