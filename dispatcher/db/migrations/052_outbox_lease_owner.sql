-- A relay's lease needs no mark (docs/scaling.md, "A lease that needs no mark"). A relay leases
-- the rows it publishes until they count as lost in the broker (rabbitmq.republish_after_s) and
-- names itself in `leased_by`; it no longer marks them published once the broker confirmed
-- them (published_at, migration 017), which cost every job a second write of its row. A batch
-- the broker did not confirm is released by its relay at once; the rows of a relay whose
-- daemon is gone (its liveness lock released, migration 022) by the due-scan's rescue. Rows a
-- consumer wrote (refused, held by a key) keep leased_by NULL and their short lease, as before.
-- Rows of an earlier release (published_at set, leased_by NULL) are swept as before.
ALTER TABLE dispatcher.outbox ADD COLUMN leased_by text;
