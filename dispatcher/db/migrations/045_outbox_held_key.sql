-- Over RabbitMQ, a delivery whose concurrency key is at its limit is refused: the claim writes
-- its job a new outbox row, leased until the key may start a job again (claim_delivered). An
-- idle relay sleeps until a wake-up (issue 24 goal 6), so the row must come back by itself the
-- moment the key has room: by its rate, the lease runs out when the key's next token is due;
-- by its cap, the lease cannot know when a running job of the key ends, so the statement that
-- ends one releases the key's held rows and wakes the relays (30_key_running.sql), and a
-- change of the key's limits does the same. held_key names the key a row waits for; it is
-- cleared when the row is released, so a row a relay leased to publish is never released
-- twice.
ALTER TABLE dispatcher.outbox ADD COLUMN held_key text;

-- The held rows of one key of a queue: usually none, so a job's end probes an empty range.
CREATE INDEX outbox_held_key ON dispatcher.outbox (queue, held_key) WHERE held_key IS NOT NULL;
