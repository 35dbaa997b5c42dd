-- No deduplication pass on the indexes whose key ends in their table's primary key.
--
-- Deduplication (PostgreSQL 13+) merges index entries with equal keys; before a full leaf page
-- splits, its pass compares every neighbouring pair of entries on the page, column by column.
-- The key of these indexes ends in the row's id, so no two rows ever share one and the pass
-- never merges anything: it is pure cost, paid at every page split of every intake. In a batch
-- of 10,000 due-now jobs (enqueue_many) it was 2.3 % of PostgreSQL's instructions (1,440.5 ->
-- 1,407.8 million, callgrind, tests/bench/bench_instructions.py), nearly all in the claim
-- index and the handler index. Equal keys of one row's versions (an update that is not HOT)
-- are still removed before a split by bottom-up deletion, which this setting does not turn off.
ALTER INDEX dispatcher.jobs_ready_claim SET (deduplicate_items = off);
ALTER INDEX dispatcher.job_state_due_at_rest SET (deduplicate_items = off);
ALTER INDEX dispatcher.jobs_dead_reason_id SET (deduplicate_items = off);
ALTER INDEX dispatcher.jobs_dead_reason_queue_id SET (deduplicate_items = off);
ALTER INDEX dispatcher.jobs_run_key_id SET (deduplicate_items = off);
ALTER INDEX dispatcher.intents_handler_id SET (deduplicate_items = off);
ALTER INDEX dispatcher.intents_tenant_id SET (deduplicate_items = off);
ALTER INDEX dispatcher.intents_priority_id SET (deduplicate_items = off);
ALTER INDEX dispatcher.intents_concurrency_key_id SET (deduplicate_items = off);
ALTER INDEX dispatcher.outbox_to_relay SET (deduplicate_items = off);
