-- Each limited key's starts (dispatcher.key_state.running_seen) and ends (dispatcher.key_done),
-- migration 040, kept by the statements that move jobs into or out of `running`, whatever they
-- are; and the starts reset (NULL: count again at the next claim) when the key's limits change.
-- Either also hands the relays back the deliveries a key held back (RabbitMQ, migration 045).

-- The jobs one statement moved into or out of `running`, per queue and key. Starts are added
-- to the keys' running_seen where it is known (a claim holds those rows locked already); ends
-- are added to dispatcher.key_done for every key with a row, whose rows no claim locks, so a
-- batch of completions never waits for a claim. Rows are taken in key order (no deadlock
-- between two daemons' batches). A statement that moved no keyed job (a heartbeat, a due-scan)
-- reads its rows once and stops.
--
-- A claim's statement whose key_take added its starts already (the setting
-- dispatcher.key_starts_counted, set by key_take for this statement and cleared here) has
-- only its jobs ended instead of started (expired before their attempt) counted, as ends: its
-- jobs were all ready before it, and key_take counted each as a start of its key.
CREATE OR REPLACE FUNCTION dispatcher.key_running_moved() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    qs text[];
    ks text[];
    ins bigint[];
    outs bigint[];
    counted boolean := false; -- a claim's statement whose starts key_take counted
    starts boolean := false;  -- whether the statement left jobs running (else it only ended some)
BEGIN
    IF TG_OP = 'UPDATE' AND current_setting('dispatcher.key_starts_counted', true) = 'on' THEN
        PERFORM set_config('dispatcher.key_starts_counted', 'off', true);
        counted := true;
        SELECT array_agg(m.queue), array_agg(m.key), array_agg(0::bigint), array_agg(m.o)
          INTO qs, ks, ins, outs
          FROM (SELECT n.queue, n.concurrency_key AS key, count(*) AS o
                  FROM new_rows n WHERE n.state <> 'running' AND n.concurrency_key IS NOT NULL
                 GROUP BY n.queue, n.concurrency_key) m;
    -- no key limited anywhere: the statement's rows are not even read
    ELSIF NOT EXISTS (SELECT 1 FROM dispatcher.key_state) THEN
        RETURN NULL;
    ELSE
        -- (a DELETE trigger has no new rows to name: asked apart)
        IF TG_OP = 'UPDATE' THEN
            starts := EXISTS (SELECT 1 FROM new_rows n WHERE n.state = 'running');
        END IF;
    END IF;
    IF starts THEN
        SELECT array_agg(m.queue ORDER BY m.queue, m.key), array_agg(m.key ORDER BY m.queue, m.key),
               array_agg(m.i ORDER BY m.queue, m.key), array_agg(m.o ORDER BY m.queue, m.key)
          INTO qs, ks, ins, outs
          FROM (SELECT x.queue, x.key, sum(x.i) AS i, sum(x.o) AS o FROM (
                    SELECT o.queue, o.concurrency_key AS key, 0 AS i, 1 AS o
                      FROM old_rows o WHERE o.state = 'running' AND o.concurrency_key IS NOT NULL
                    UNION ALL
                    SELECT n.queue, n.concurrency_key, 1, 0
                      FROM new_rows n WHERE n.state = 'running' AND n.concurrency_key IS NOT NULL
                ) x GROUP BY x.queue, x.key HAVING sum(x.i) <> sum(x.o)) m;
    ELSIF NOT counted THEN
        -- a deletion, or an update that left no job running (a batch of completions): ends
        -- only, the old rows' running jobs per key (the arrays in one order, whichever: the
        -- writes below take their rows in key order)
        SELECT array_agg(m.queue), array_agg(m.key), array_agg(0::bigint), array_agg(m.o)
          INTO qs, ks, ins, outs
          FROM (SELECT o.queue, o.concurrency_key AS key, count(*) AS o
                  FROM old_rows o WHERE o.state = 'running' AND o.concurrency_key IS NOT NULL
                 GROUP BY o.queue, o.concurrency_key) m;
    END IF;
    IF qs IS NULL THEN
        RETURN NULL;
    END IF;
    -- a heartbeat's rows cancel out above; what is left is starts (i) or ends (o) per key
    IF EXISTS (SELECT 1 FROM unnest(ins) i WHERE i > 0) THEN
        PERFORM 1 FROM dispatcher.key_state k
          JOIN unnest(qs, ks, ins) AS m(queue, key, i) ON k.queue = m.queue AND k.key = m.key
         WHERE m.i > 0 AND k.running_seen IS NOT NULL
         ORDER BY k.queue, k.key
           FOR UPDATE OF k;
        UPDATE dispatcher.key_state k SET running_seen = k.running_seen + m.i
          FROM unnest(qs, ks, ins) AS m(queue, key, i)
         WHERE m.i > 0 AND k.queue = m.queue AND k.key = m.key AND k.running_seen IS NOT NULL;
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(outs) o WHERE o > 0) THEN
        INSERT INTO dispatcher.key_done AS d (queue, key, n)
        SELECT m.queue, m.key, m.o FROM unnest(qs, ks, outs) AS m(queue, key, o)
         WHERE m.o > 0
           AND EXISTS (SELECT 1 FROM dispatcher.key_state k
                        WHERE k.queue = m.queue AND k.key = m.key)
         ORDER BY m.queue, m.key
            ON CONFLICT (queue, key) DO UPDATE SET n = d.n + excluded.n;
        PERFORM dispatcher.release_held_deliveries(qs, ks, outs);
    END IF;
    RETURN NULL;
END
$$;

-- Over RabbitMQ, the deliveries a key at its limit held back wait in the outbox, leased, for
-- the key to have room (claim_delivered, migration 045). Each job of the key that left
-- `running` frees a slot: as many of its held rows (keys `ks` of queues `qs`, `ns` slots each)
-- go back to the relays' pick at once, first in the order the relay publishes, and the relays
-- are woken: an idle one waits for nothing else (its own time-out aside).
CREATE OR REPLACE FUNCTION dispatcher.release_held_deliveries(qs text[], ks text[], ns bigint[])
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    released integer;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM dispatcher.outbox WHERE held_key IS NOT NULL) THEN
        RETURN;  -- the usual case, and every one without RabbitMQ: one probe of an empty index
    END IF;
    UPDATE dispatcher.outbox o SET leased_until = NULL, held_key = NULL
     WHERE o.id = ANY (ARRAY(
           SELECT h.id FROM unnest(qs, ks, ns) AS m(queue, key, n)
            CROSS JOIN LATERAL (
                  SELECT x.id FROM dispatcher.outbox x
                   WHERE x.queue = m.queue AND x.held_key = m.key
                   ORDER BY x.priority, x.created_at, x.id
                   LIMIT m.n
                     FOR UPDATE SKIP LOCKED) h
            WHERE m.n > 0));
    GET DIAGNOSTICS released = ROW_COUNT;
    IF released > 0 THEN
        PERFORM dispatcher.wake('ready');
    END IF;
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
-- that was not limited while jobs ran was not counted), and the deliveries its keys held back
-- (RabbitMQ, migration 045) go back to the relays' pick at once, woken: the new limits may
-- start them now, and their leases were timed by the old ones.
CREATE OR REPLACE FUNCTION dispatcher.key_limits_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    q text;
    k text;  -- NULL: every key of the queue
BEGIN
    IF TG_TABLE_NAME = 'queues' THEN
        q := NEW.name;
    ELSIF TG_OP = 'DELETE' THEN
        q := OLD.queue;
        k := OLD.key;
    ELSE
        q := NEW.queue;
        k := NEW.key;
    END IF;
    UPDATE dispatcher.key_state SET running_seen = NULL
     WHERE queue = q AND (k IS NULL OR key = k) AND running_seen IS NOT NULL;
    UPDATE dispatcher.outbox SET leased_until = NULL, held_key = NULL
     WHERE queue = q AND held_key IS NOT NULL AND (k IS NULL OR held_key = k);
    IF FOUND THEN
        PERFORM dispatcher.wake('ready');
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
