-- Cluster-wide history (issue 26, point 1): one row per queue and minute, plus one row per
-- minute for all queues together (queue '*'), with what happened in that minute on every
-- daemon: attempts started, jobs succeeded, attempts retried, jobs dead, the due-to-start
-- latency of the started attempts as counts per histogram bucket, and the oldest ready job's
-- age. Each daemon adds its own counts every few seconds (dispatcher.engine.history): counts and
-- buckets add, so the rows hold the cluster's totals whichever daemons wrote them; the age is a
-- gauge every daemon reads alike, so a row keeps the largest seen.
--
-- `latency[i]` counts the started attempts whose due-to-start delay fell in bucket i of
-- dispatcher.observability.metrics.LATENCY_BUCKETS (up to and including its bound; the last
-- element: beyond the last bound). Percentiles are read back from the summed buckets.
--
-- A row is updated in place every few seconds while its minute lasts: the fill factor leaves
-- room on each page so those updates stay heap-only (no index entry per update).
CREATE TABLE dispatcher.history (
    queue          text NOT NULL,
    minute         timestamptz NOT NULL CHECK (minute = date_trunc('minute', minute)),
    started        bigint NOT NULL DEFAULT 0 CHECK (started >= 0),
    succeeded      bigint NOT NULL DEFAULT 0 CHECK (succeeded >= 0),
    retried        bigint NOT NULL DEFAULT 0 CHECK (retried >= 0),
    dead           bigint NOT NULL DEFAULT 0 CHECK (dead >= 0),
    latency        bigint[] NOT NULL DEFAULT '{}',
    oldest_ready_s double precision,
    PRIMARY KEY (queue, minute)
) WITH (fillfactor = 70);
-- the pruner deletes the oldest minutes of every queue at once
CREATE INDEX history_minute ON dispatcher.history (minute);
