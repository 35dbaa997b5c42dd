-- Keys outlive their jobs (issue 23, point 1; docs/guides/intake-contracts.md).
--
-- Before: once retention pruned a finished job (7 days by default), its key was free again and
-- a replay of the same request created a new job: the effect ran twice. Now the pruner, in the
-- statement that deletes a batch of finished jobs, writes one ledger row per key: the request's
-- fingerprint, the job's id, its final state and when it finished. Every enqueue door answers a
-- key found here as it answers an existing job (same request: the original id and final state,
-- marked pruned; another request: a conflict), and never creates a job for it. The pruner drops
-- ledger rows `retention.keys_s` after the job finished (90 days by default, never less than
-- any job retention: the configuration refuses it).
--
-- Written when a job is pruned, not when it ends: the drain writes nothing more, and the row
-- is built from the one the pruner deletes anyway (measured in docs/guides/intake-contracts.md).

CREATE TABLE dispatcher.key_ledger (
    key          text PRIMARY KEY,
    request_hash text NOT NULL,
    job_id       bigint NOT NULL,
    state        text NOT NULL,
    finished_at  timestamptz NOT NULL
);
-- the pruner walks the ledger oldest first
CREATE INDEX key_ledger_finished_at ON dispatcher.key_ledger (finished_at);

-- The largest payload and target (bytes of JSON text) one job may carry, whatever its door
-- (issue 23, point 3): written by the daemon at start beside the past-due tolerance.
ALTER TABLE dispatcher.intake_settings
    ADD COLUMN max_payload_bytes bigint NOT NULL DEFAULT 262144
        CHECK (max_payload_bytes BETWEEN 1024 AND 67108864);
