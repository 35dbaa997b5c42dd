-- Bulk actions on jobs (issue 26, point 3): retry, cancel, discard, reschedule or run now every
-- job of a selection (ids) or of a filter (the job list's), in batches of a few hundred rows per
-- transaction. One row per bulk action records where its walk is: each batch moves its jobs and
-- advances `cursor_id` and `counts` in the same transaction, so a bulk action cut off (a
-- restart, a lost connection) resumes where it stopped when asked again with the same key, and
-- a finished one asked again changes nothing and answers what it did.
--
-- `request_hash` is the fingerprint of the action and its selection: the same key with another
-- request is refused. `fence_id` is the highest job id when the action began: jobs that arrive
-- later are never taken. The walk goes from the fence downwards (newest first, as the list).
CREATE TABLE dispatcher.bulk_actions (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key          text NOT NULL UNIQUE
                 CHECK (length(key) BETWEEN 1 AND 255 AND key ~ '^[ -~]+$'),
    action       text NOT NULL,
    request_hash text NOT NULL,
    actor        text NOT NULL,
    fence_id     bigint NOT NULL,
    cursor_id    bigint,  -- the last job id a finished batch looked at; NULL: none yet
    counts       jsonb NOT NULL DEFAULT '{}',
    created_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz
);
-- the pruner drops finished records after the dead retention
CREATE INDEX bulk_actions_finished_at ON dispatcher.bulk_actions (finished_at)
    WHERE finished_at IS NOT NULL;
