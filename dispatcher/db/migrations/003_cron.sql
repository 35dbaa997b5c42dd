-- Cron: one run receipt per scheduled period, the periods that were missed, and how far each
-- schedule's periods have been accounted for.

-- A run receipt. The primary key is the run key `<schedule>:<period start, UTC, RFC 3339>`, so a
-- second fire of the same period (another instance, a retried trigger, a restart) converges on
-- this row and, through the unit keys `<run_key>:<unit>`, on the same jobs. The receipt is
-- written in the same transaction as its units (a queued run: as its release).
CREATE TABLE dispatcher.runs (
    run_key          text PRIMARY KEY CHECK (length(run_key) BETWEEN 1 AND 150),
    schedule         text NOT NULL,
    period_start     timestamptz NOT NULL,
    via              text NOT NULL CHECK (via IN ('cron', 'catch_up', 'api')),
    unit_count       integer NOT NULL CHECK (unit_count >= 0),
    -- What the overlap policy did: 'none' (no unfinished earlier run), 'allowed' (ran beside
    -- it), 'skipped' (no units, finished at once), 'queued' (units wait in queued_jobs until
    -- every earlier run of the schedule has finished).
    overlap_decision text NOT NULL
                     CHECK (overlap_decision IN ('none', 'allowed', 'skipped', 'queued')),
    overlap_with     text,
    queued_jobs      jsonb,
    created_at       timestamptz NOT NULL DEFAULT now(),
    released_at      timestamptz,
    finished_at      timestamptz,
    -- Snapshot of the unit outcomes, taken when the run finishes. Until then (and while the
    -- jobs exist) the counters are computed from dispatcher.jobs by run_key; see run_receipts.
    succeeded        integer,
    dead             integer,
    cancelled        integer,
    UNIQUE (schedule, period_start),
    CHECK ((released_at IS NULL) = (queued_jobs IS NOT NULL)),
    CHECK (finished_at IS NULL OR released_at IS NOT NULL)
);
CREATE INDEX runs_unfinished ON dispatcher.runs (schedule, period_start) WHERE finished_at IS NULL;

-- The view dispatcher.run_receipts (receipts with live unit counters) was created here; its
-- body: db/functions/20_run_receipts.sql.

-- Per schedule: every period start at or before checked_through has been accounted for (it
-- has a run, or it was recorded in missed_periods). `enabled` is the state last configured,
-- used to say why periods passed while no dispatcher was running.
CREATE TABLE dispatcher.schedule_state (
    schedule        text PRIMARY KEY,
    enabled         boolean NOT NULL,
    tracked_since   timestamptz NOT NULL DEFAULT now(),
    checked_through timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- Periods that passed without a run and were not backfilled: 'not_fired' (no dispatcher was up,
-- or none fired it within misfire_grace_s), 'disabled', 'coalesced' (several periods were late
-- at once; only the latest fired).
-- A period stays outstanding until a run exists for it (catch-up or an explicit trigger).
CREATE TABLE dispatcher.missed_periods (
    schedule     text NOT NULL,
    period_start timestamptz NOT NULL,
    reason       text NOT NULL CHECK (reason IN ('not_fired', 'disabled', 'coalesced')),
    detected_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (schedule, period_start)
);
