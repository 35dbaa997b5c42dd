-- The claim's marker row says whether the claim emptied what it could take (`drained`): a
-- plain claim (db/functions/10_claim_ready.sql) whose walk of the one tenant's jobs found
-- fewer than its grant knows nothing else is ready for this worker, so the claim loop waits
-- for a wake-up without first asking again (`ready_left`, a round trip and a statement per
-- claim; about a tenth of the daemon's work per job in the peer benchmark's W3). A new
-- column changes the function's result type, which CREATE OR REPLACE cannot: the function
-- file creates it again with the column. A daemon of the release before reads its marker by
-- column name and ignores the new one.
DROP FUNCTION IF EXISTS dispatcher.claim_ready(text, integer, text[], text, float8, bigint,
                                               boolean, integer, text);
