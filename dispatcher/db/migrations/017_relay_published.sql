-- The RabbitMQ relay keeps an outbox row until a consumer claims its job, instead of deleting
-- it once the broker confirmed the message. A published row is marked (`published_at`) and the
-- relay leases only unmarked ones; the consumer's claim deletes the relay's rows of the jobs it
-- starts. So, over RabbitMQ too, every ready job has an outbox row (DESIGN: "ready: an outbox
-- row exists"), and the marked rows of a queue are the messages published and not yet claimed:
--   - the relay publishes only a bounded number ahead of the consumers (a window per queue,
--     counted here across all daemons), so one tenant's burst is not all queued in the broker
--     ahead of another tenant's job;
--   - a marked row older than a bound whose job is still ready is a message lost in the broker
--     (queue purged, broker data lost): the relay's sweep unmarks it, and it is published again.
-- The in-process transport never leases nor marks a row (its claim deletes the rows it takes),
-- so neither index below ever holds one of its rows.
ALTER TABLE dispatcher.outbox ADD COLUMN published_at timestamptz;

-- Both indexes hold only the rows a relay has leased (leased_until stays set once published):
-- at most the windows' rows, plus the batches being published. This one gives the window count
-- per queue (published, or leased and being published) and the sweep's walk.
CREATE INDEX outbox_relayed_queue ON dispatcher.outbox (queue, published_at)
    WHERE leased_until IS NOT NULL;
-- The consumer's claim deletes the rows of the jobs it started by job id, even a row whose
-- message it received before the relay's mark committed.
CREATE INDEX outbox_relayed_job ON dispatcher.outbox (job_id) WHERE leased_until IS NOT NULL;

-- Ready jobs an earlier relay published (and whose rows it deleted) get a marked row, as if
-- published now: a consumer's claim deletes it, or, if the message was lost, the sweep has it
-- published again once the bound passed. Reads the job table once (no index reaches ready jobs).
-- With the in-process transport every ready job has a row already and nothing is written; where
-- a database says ready jobs get no outbox row at all (intake_settings.ready_outbox false: the
-- in-process transport without an outbox), there is nothing to fill in.
-- The state table and the setting are read directly, not through dispatcher.jobs and
-- dispatcher.ready_outbox(): a migration needs no body of db/functions/, which are applied only
-- after the last migration (db/schema.py).
INSERT INTO dispatcher.outbox (job_id, queue, tenant, capability, leased_until, published_at)
SELECT s.id, s.queue, s.tenant, s.capability, now(), now()
  FROM dispatcher.job_state s
 WHERE s.state = 'ready'
   AND coalesce((SELECT i.ready_outbox FROM dispatcher.intake_settings i), false)
   AND NOT EXISTS (SELECT 1 FROM dispatcher.outbox o WHERE o.job_id = s.id);
