-- The outbox relay of the RabbitMQ transport. A relay leases a batch of outbox rows (SKIP LOCKED,
-- so any number of daemons relay side by side), publishes them, waits for the broker's
-- confirms, then deletes them. A relay that dies mid-batch leaves its lease to expire and the
-- rows are published again: the consumer's claim, fenced by the attempt, makes that harmless.
-- The in-process transport never sets the column (its claim deletes the rows it takes).
ALTER TABLE dispatcher.outbox ADD COLUMN leased_until timestamptz;
