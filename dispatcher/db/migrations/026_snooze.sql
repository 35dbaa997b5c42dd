-- Snooze (issue 23): a handler may ask to run again later without spending an attempt. Its
-- attempt leaves a history row with the outcome 'snoozed' (the next attempt carries the same
-- number again, as after a drain's 'released'); the snoozes since the job's budget started are
-- counted from these rows, so no column is added to the hot state table.
ALTER TABLE dispatcher.attempts DROP CONSTRAINT IF EXISTS attempts_outcome_check;
ALTER TABLE dispatcher.attempts
    ADD CONSTRAINT attempts_outcome_check CHECK (outcome IN
        ('succeeded', 'retried', 'dead', 'cancelled', 'lease_expired', 'released', 'snoozed'));
