-- A memory budget for jobs in flight (issue 20, defect 3; docs/memory.md).
--
-- Measured before: a daemon draining 2,000 jobs of 3 MB (stored through the SQL door, which
-- has no size limit) peaked at 1,221 MB resident; a claim took up to `claim_batch` jobs
-- whatever their size. Now each claim is given a number of bytes, and takes the longest prefix
-- of its candidates whose payload and target bytes fit (one job larger than the whole budget
-- still runs when the daemon holds nothing else: `alone`).
--
-- The size must be cheap to read in the claim: each intent records it when it is written, by
-- a trigger, so every door (HTTP intake, dispatcher.enqueue, enqueue_many, cron, a row inserted
-- into dispatcher.jobs or dispatcher.intents directly) sets it. Rows stored before this
-- migration have none: the claim measures those (stored_bytes) when it meets them.

ALTER TABLE dispatcher.intents ADD COLUMN size_bytes bigint;

-- dispatcher.stored_bytes and dispatcher.intent_bytes, with its trigger intents_size_bytes,
-- were created here; their bodies: db/functions/.
