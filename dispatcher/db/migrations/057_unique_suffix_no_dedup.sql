-- No deduplication pass on the indexes whose keys never repeat: those of the intents (written
-- once, keyed by the job's id at the end) and the claim index (its key ends in the id, and a
-- job enters it again only with a new due time: a retry, a rescue, run-now).
--
-- Deduplication (PostgreSQL 13+) merges index entries with equal keys; before a full leaf page
-- splits, its pass compares every neighbouring pair of entries on the page, column by column.
-- On these indexes it never merges anything: pure cost, paid at every page split of every
-- intake. In a batch of 10,000 due-now jobs (enqueue_many) it was 2.3 % of PostgreSQL's
-- instructions (125,593 -> 122,730 a job, callgrind: tests/bench/bench_instructions.py), in
-- the claim index and the handler index.
--
-- Not here: the other indexes of job_state that end in the id (the due index at rest, the run
-- key's, the dead reasons'). An update of a state row that is not HOT writes a new entry with
-- the same key for every such index its new version belongs to (a scheduled job that succeeds
-- enters the due index at rest again with its own due time and id), and deduplication keeps
-- those versions in one entry until vacuum.
ALTER INDEX dispatcher.jobs_ready_claim SET (deduplicate_items = off);
ALTER INDEX dispatcher.intents_handler_id SET (deduplicate_items = off);
ALTER INDEX dispatcher.intents_tenant_id SET (deduplicate_items = off);
ALTER INDEX dispatcher.intents_priority_id SET (deduplicate_items = off);
ALTER INDEX dispatcher.intents_concurrency_key_id SET (deduplicate_items = off);
