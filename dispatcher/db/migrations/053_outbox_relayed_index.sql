-- One index for the relayed rows (leased: published, or held by a consumer) in place of two:
-- `(queue, job_id)` serves the per-queue walks of the window's count, the release, the sweep and
-- a gone daemon's release (its leading column, as outbox_relayed_queue did) and the claim's
-- probe of each delivered job's rows (queue and job id).
-- Why: both old indexes had the same predicate, so to the planner a walk of outbox_relayed_queue
-- filtering job ids looked as cheap as a probe of outbox_relayed_job whenever the statistics
-- were taken while few rows were leased (after a quiet spell, before a burst). It then chose the
-- walk for every delivery: a claim of 1,000 deliveries read the window's 1,000 x 1,000 rows,
-- 150-260 ms instead of 17-23 (docs/scaling.md; tests/db/test_relay.py reproduces those
-- statistics). One index for both leaves the planner nothing to get wrong, and a lease writes
-- one index entry fewer. The relayed rows are a few windows' worth: the build is short.
DROP INDEX dispatcher.outbox_relayed_job;
DROP INDEX dispatcher.outbox_relayed_queue;
CREATE INDEX outbox_relayed ON dispatcher.outbox (queue, job_id) WHERE leased_until IS NOT NULL;
