-- A job, whole: its intent joined with its state row (migration 015), with the columns, in the
-- order, of the table this replaced, so every reader is unchanged. `queue` and `run_key` come
-- from the state row so that a filter on either next to `state` reaches the state table's
-- indexes; `priority` and `concurrency_key` (migration 023; the claim reads the state row's)
-- from the intent, whose indexes serve the list's filters on them (migration 048).
-- Last, each job's contract (migrations 030 and 032) for the status reads.
-- Writes through it: 30_jobs_view_write.sql.
CREATE OR REPLACE VIEW dispatcher.jobs AS
SELECT i.id, i.key, i.request_hash, s.queue, i.tenant, i.handler, i.handler_version, i.target,
       i.payload, s.state, s.due_at, s.attempt, i.max_attempts, i.max_retry_age_s,
       s.budget_started_at, s.lease_owner, s.lease_expires_at, s.cancel_requested, s.progress,
       s.result, s.last_error, s.dead_reason, s.run_key, i.created_at, s.started_at,
       s.finished_at, i.dead_letter_of, i.traceparent, i.priority, i.concurrency_key,
       i.timeout_s, s.expires_at, i.on_success, i.on_failure, i.replaced_by, i.replacements,
       i.replaced_at, i.debounce_until
  FROM dispatcher.intents i
  JOIN dispatcher.job_state s ON s.id = i.id;

-- What an insert through the view gets for a column it leaves out, as the table's defaults were.
ALTER VIEW dispatcher.jobs ALTER COLUMN tenant SET DEFAULT '';
ALTER VIEW dispatcher.jobs ALTER COLUMN handler_version SET DEFAULT 1;
ALTER VIEW dispatcher.jobs ALTER COLUMN attempt SET DEFAULT 0;
ALTER VIEW dispatcher.jobs ALTER COLUMN cancel_requested SET DEFAULT false;
ALTER VIEW dispatcher.jobs ALTER COLUMN created_at SET DEFAULT now();
ALTER VIEW dispatcher.jobs ALTER COLUMN priority SET DEFAULT 0;
