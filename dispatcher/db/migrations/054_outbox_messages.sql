-- A message is the record, not its rows (docs/scaling.md, "One record a message"). A relay
-- leased each outbox row it published (a new version of the row and its index entries) and the
-- claim that started the job deleted it: two writes of every row for the RabbitMQ transport,
-- 11.6 us of a lease's 15 a job. Now the lease deletes the rows it takes and writes one row
-- here for each message it publishes: its queue, its relay, the jobs it carries and the attempt
-- each is ready after. What the leased rows told is told here, a message at a time:
-- - the window: the jobs of a queue's messages not yet handled (`jobs - handled`): the claim
--   that handles a message's jobs (started, refused, or no longer ready) counts them, and
--   deletes the message with its last;
-- - a batch the broker did not confirm: its relay gives the messages back (their ready jobs
--   get outbox rows again, the messages are deleted);
-- - a relay whose daemon died: the due-scan's rescue gives back its messages;
-- - a message the broker lost: one still here after rabbitmq.republish_after_s gives back its
--   jobs still ready for the attempt it carried (the sweep).
-- Rows an earlier release's relay leased (leased_by, published_at) are swept as before.
--
-- An outbox row carries the attempt its job is ready after where the statement that writes it
-- knows it (intake, the due-scan, the rescue, a refused delivery, a message given back): the
-- lease then reads no state row for it (NULL: it reads the state row, as before).
ALTER TABLE dispatcher.outbox ADD COLUMN attempt integer;
CREATE TABLE dispatcher.outbox_messages (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue text NOT NULL,
    relay text NOT NULL,  -- the owner of the relay that published it (liveness, migration 022)
    published_at timestamptz NOT NULL DEFAULT now(),
    jobs integer NOT NULL,  -- cardinality(job_ids)
    handled integer NOT NULL DEFAULT 0,  -- of them, those a claim handled
    job_ids bigint[] NOT NULL,
    attempts integer[] NOT NULL  -- the attempt each job was ready after, the consumer's fence
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 2000,
        fillfactor = 70);  -- the count of a message's handled jobs: an update in its page
-- the window's sum per queue; the sweep's oldest first
CREATE INDEX outbox_messages_queue ON dispatcher.outbox_messages (queue, published_at);
