-- Vacuum the queue tables sooner than PostgreSQL's defaults would.
--
-- All churn in `jobs` happens in a thin slice (what is due now), while millions of future jobs
-- may sit still. The default trigger (20 % of the table dead) lets 2 million dead rows pile up
-- in a 10-million-row table before a vacuum, and they sit exactly where the due-scan and the
-- claims walk. Measured on a 10-million-row table: a 10,000-job burst started its last job after
-- 549 ms with 435,000 dead rows (4 %) in it, 376 ms after a VACUUM.
-- At 1 % a vacuum is cheap: the dead rows sit on few pages, so PostgreSQL can skip the index pass.
ALTER TABLE dispatcher.jobs SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02
);
-- The outbox is a queue in the strict sense: every row is inserted and deleted once.
ALTER TABLE dispatcher.outbox SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000
);
