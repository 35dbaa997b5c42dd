-- The running jobs' two partial indexes become one. `jobs_running_lease (lease_expires_at)` and
-- `jobs_running_queue (queue)`, both `WHERE state = 'running'`, took an entry each for every
-- job a claim started and for every lease a heartbeat renewed: a start wrote the state row's
-- primary key and both. One index on (queue, lease_expires_at) serves both readers: a queue's
-- running jobs (the grant's count, the key limits' recount, the registry's cleanup) are its
-- prefix, and a look for expired leases across queues (the due-scan's rescue, the idle poll)
-- reads its entries, as many as jobs are running, testing each one's lease in the index
-- before it reads a row. PostgreSQL instructions per job of a drain (bench_instructions): the
-- claim of 1,000 114,550 -> 103,446, their completion 101,784 -> 90,160.
--
-- The index is built before the two are dropped, in the migration's transaction: it reads the
-- state table once under a lock that holds its writes (docs/guides/operating.md says how long
-- at 10 million jobs).
CREATE INDEX jobs_running ON dispatcher.job_state (queue, lease_expires_at)
    WHERE state = 'running';
DROP INDEX dispatcher.jobs_running_lease;
DROP INDEX dispatcher.jobs_running_queue;
