-- Global limits without putting every claim of a queue in one line (issue 13).
--
-- Measured before (tests/bench/bench_scaleout.py, 3 daemons, a queue limited to 1,000,000/s
-- and 2,000 or 100,000 in flight): about half of the claim statement's samples in
-- pg_stat_activity waited on a lock (Lock:transactionid, Lock:tuple). claim_grant (013) locks
-- the queue's registry row first thing in every claim and the claim holds the lock until it
-- commits, so the claims of all daemons ran one after another: all daemons together could not
-- claim faster than one claim statement after the other.
--
-- Now headroom is handed out ahead as *permits*: one permit is one start token and one in-flight
-- slot, taken from the queue's limits when it is minted. A queue has a few permit slots (rows
-- of dispatcher.claim_permits). A claim first takes permits from slots no other claim holds
-- (FOR UPDATE SKIP LOCKED): it locks those slots only, never the queue row, so claims on
-- different slots run side by side. A claim that finds no idle slot with permits locks the
-- queue row as in 013, refills the bucket and grants itself what it wants; when the headroom
-- left is at least that much again, it also parks one such share in each idle empty slot for
-- the claims that come next. Near the limits nothing is left to park and every claim goes
-- through the queue row, as in 013. Such a claim, short of headroom, first takes back the
-- permits of slots nobody holds.
--
-- Why the limits still hold:
--   in flight  running jobs + parked permits <= max_inflight whenever permits are minted, both
--              counted in one statement (one snapshot) under the row lock. A claim on a slot
--              turns permits into running jobs in one commit, so that sum never grows outside
--              the row lock; completions only lower it.
--   rate       permits are minted from the bucket's tokens: tokens + parked permits is the
--              bucket's level, which only refilling raises (at rate_per_s, up to the burst).
--              Parked permits are spent outside the row lock, so the refill credited at a claim
--              is capped at burst - (the most permits parked since the last refill), which is
--              what queues.permits_parked records: the level never passes the burst, so starts
--              in any window stay within rate x window + burst.
--   unused     a claim gives back what it did not start where it took it (its first slot, or
--              the bucket), in the same statement (claim_settle, as in 013)
-- Changing a queue's limits empties its slots (trigger queues_limits_changed), so a lowered
-- limit applies at once. Running jobs are counted in the state table, as in 015's grant (jobs_running_queue).
CREATE TABLE dispatcher.claim_permits (
    queue text NOT NULL,
    slot  integer NOT NULL,
    n     integer NOT NULL DEFAULT 0 CHECK (n >= 0),
    PRIMARY KEY (queue, slot)
) WITH (fillfactor = 50);  -- every claim on permits rewrites a row: keep the updates HOT

-- Permits parked after the last claim that locked the row: until the next one, no more are.
ALTER TABLE dispatcher.queues ADD COLUMN permits_parked integer NOT NULL DEFAULT 0;

-- claim_grant and claim_settle changed to hand out permits, and dispatcher.drop_claim_permits
-- with its trigger queues_limits_changed created here; their bodies: db/functions/.
