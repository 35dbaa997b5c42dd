-- The relay's two indexes, reshaped for what a drain over RabbitMQ costs PostgreSQL per job
-- (issue 24, point 4; measured in docs/scaling.md, "Where the time goes").
--
-- 1. The relay's mark of a published row (published_at) becomes a heap-only update (HOT: no
--    new index entry anywhere), which it is only when no index column or index predicate
--    changes. outbox_relayed_queue held published_at as its second column, so every mark wrote
--    a new row version plus an entry in each of the outbox's four indexes. The window count and
--    the sweep read a queue's relayed rows through the index and check published_at on the row
--    (at most the windows plus the batches being published: the sweep sorts a few thousand).
DROP INDEX dispatcher.outbox_relayed_queue;
CREATE INDEX outbox_relayed_queue ON dispatcher.outbox (queue) WHERE leased_until IS NOT NULL;

-- 2. The relay's pick (relay_pick) walks only the rows it may publish. outbox_claim held every
--    row, the published ones first (the oldest ids): each of the pick's walks (the lowest
--    priority, the tenants' turns, each tenant's oldest rows) stepped over the whole window of
--    published rows, checking each on the heap (4,000 rows, 14 of a lease's 30 ms for 500).
--    A row leaves this index when a relay leases it; one whose lease ran out before the broker
--    confirmed it (a relay that stopped mid-batch, a refused delivery's row due again, a row the
--    sweep unmarked) comes back when a relay releases it (release_outbox, leased_until NULL).
--    Each tenant's oldest rows are taken by created_at, then id: ordered by id alone, the
--    primary key offers the same order, and with the statistics of a freshly analyzed table
--    (no row leased yet) the planner walked it, past every leased row.
DROP INDEX dispatcher.outbox_claim;
CREATE INDEX outbox_to_relay ON dispatcher.outbox (queue, priority, tenant, created_at, id)
    WHERE leased_until IS NULL;
UPDATE dispatcher.outbox SET leased_until = NULL
 WHERE published_at IS NULL AND leased_until < now();
