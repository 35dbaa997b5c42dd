-- The RabbitMQ transport's statements: the outbox relay, its sweep for lost messages, and the
-- consumer's claim. Same conventions as queries.sql.
--
-- An outbox row's life over RabbitMQ (migration 017): written with the job's move to `ready`;
-- taken (deleted) by the relay that publishes it, which records each message it makes of the
-- rows in outbox_messages (migration 054): the jobs it carries and their attempts. The claim
-- that handles a message's jobs counts them there, and deletes the message with its last: the
-- jobs of a queue's messages not yet handled are the relay's window. A record names its relay
-- until the broker confirmed the message (record_confirmed). A message the broker did not
-- confirm is given back by its relay at once (give_back_messages), as are the messages still
-- naming a relay whose daemon is gone (the due-scan's rescue, queries.sql: whether the broker
-- had them is not known); one not handled within
-- rabbitmq.republish_after_s is a message the broker lost (sweep_lost_messages): its jobs
-- still ready get outbox rows again (dispatcher.messages_again).
-- The rows a consumer writes (refused, held by a key) are leased briefly (leased_until, by
-- nobody) and released once that runs out (release_outbox). The rows an earlier release's
-- relays leased (leased_by, migration 052; published_at, migration 017) are swept once their
-- lease ran out (sweep_unclaimed): kept for a rolling upgrade.

-- name: lease_outbox
-- Relay $7: take up to $4 rows nobody holds, to publish them, of the queues $1, each at most its
-- window ahead of its consumers: $2 (one consumer's) for each daemon registered (every daemon
-- consumes, and claims a share of the window: the whole window shared by three daemons made
-- claims of ~550 deliveries where one daemon's took 1,000), less the jobs of its messages
-- published and not yet handled (migration 054). Within a queue, in the order claim_ready takes ready jobs
-- (dispatcher.relay_pick, migration 023): the lowest priority value first, tenants in turn from
-- where this relay's previous lease of the queue stopped ($5 priorities, $6 tenants, one per
-- queue, NULL at first), the oldest row first; so one tenant's burst does not fill the window
-- ahead of another's job, and an urgent job waits behind at most a window. The rows taken are
-- deleted: each queue's, in that order, make messages of at most $3 jobs (one per queue),
-- each recorded in outbox_messages with the attempt each job is ready after (the consumer's
-- fence). Each job with its message, in the order to publish them, and where it stands in its
-- queue's turns (the relay's next cursor).
WITH consumers AS MATERIALIZED (
    SELECT greatest(count(*), 1)::integer AS n FROM dispatcher.instances
), windows AS MATERIALIZED (
    SELECT w.queue, w.after_priority, w.after_tenant, w.per_message,
           least($4::integer, greatest(0, w.size * (SELECT n FROM consumers) - coalesce((
               SELECT sum(m.jobs - m.handled) FROM dispatcher.outbox_messages m
                WHERE m.queue = w.queue), 0)))::integer AS take
      FROM unnest($1::text[], $2::integer[], $3::integer[], $5::integer[], $6::text[])
           AS w(queue, size, per_message, after_priority, after_tenant)
), picked AS MATERIALIZED (
    SELECT p.id, p.pos, p.priority, p.tenant, p.turn
      FROM windows w
     CROSS JOIN LATERAL dispatcher.relay_pick(w.queue, w.take, w.after_priority,
                                              w.after_tenant) p
     WHERE w.take > 0
     ORDER BY p.pos
     LIMIT $4
), taken AS MATERIALIZED (
    DELETE FROM dispatcher.outbox o
     WHERE o.id = ANY (ARRAY(SELECT id FROM picked))
    RETURNING o.id, o.job_id, o.queue, o.created_at, o.attempt
), carried AS MATERIALIZED (
    -- each job with the attempt it is ready after (carried by its row, else one primary-key
    -- probe of its state), and its message's slice: each queue's rows are a prefix of its
    -- pick, whose positions count from 1; a job with two rows taken goes out once
    SELECT DISTINCT ON (t.job_id)
           t.job_id, t.queue, t.created_at, p.pos, p.priority, p.tenant, p.turn,
           coalesce(t.attempt, (SELECT s.attempt FROM dispatcher.job_state s
                                 WHERE s.id = t.job_id)) AS attempt,
           (p.pos - 1) / w.per_message AS slice
      FROM taken t
      JOIN picked p ON p.id = t.id
      JOIN windows w ON w.queue = t.queue
     ORDER BY t.job_id, p.pos
), messages AS (
    INSERT INTO dispatcher.outbox_messages (queue, relay, jobs, job_ids, attempts)
    SELECT c.queue, $7, count(*), array_agg(c.job_id ORDER BY c.pos),
           array_agg(c.attempt ORDER BY c.pos)
      FROM carried c
     WHERE c.attempt IS NOT NULL  -- its job is gone: nothing to publish
     GROUP BY c.queue, c.slice
    RETURNING id, job_ids
)
SELECT m.id, c.job_id, c.queue, c.attempt,
       extract(epoch FROM now() - c.created_at)::float8 AS age_s, c.priority, c.tenant, c.turn
  FROM messages m
 CROSS JOIN LATERAL unnest(m.job_ids) AS u(job_id)
  JOIN carried c ON c.job_id = u.job_id
 ORDER BY c.pos, c.queue;

-- name: release_outbox
-- Relay: the rows nobody leased to publish whose lease ran out (a refused delivery's row,
-- written leased until it is due again; an earlier release's row its relay did not mark
-- published) go back to the rows the relays pick from (leased_until NULL, migration 041; a row
-- a key held back waits for nothing more: held_key NULL, migration 045). An earlier release's
-- relay's rows (leased_by) are the sweep's once their lease ran out. Up to $1 rows,
-- those nobody holds; how many. Run by a relay when a lease it knows of can have run out (and
-- once a lease time for a relay that died): it walks only the relayed rows (the windows), where
-- the pick, which walks none of them, does not look.
-- Per queue through outbox_relayed (OFFSET 0: with the statistics of a young table the
-- planner chose to read the whole outbox).
WITH expired AS MATERIALIZED (
    SELECT o.id
      FROM dispatcher.queues q
     CROSS JOIN LATERAL (
           SELECT x.id FROM dispatcher.outbox x
            WHERE x.queue = q.name AND x.leased_until IS NOT NULL AND x.published_at IS NULL
              AND x.leased_by IS NULL AND x.leased_until < now()
            LIMIT $1
              FOR UPDATE SKIP LOCKED) o
     LIMIT $1
), released AS (
    UPDATE dispatcher.outbox o SET leased_until = NULL, held_key = NULL
     WHERE o.id = ANY (ARRAY(SELECT id FROM expired))
    RETURNING 1
)
SELECT count(*)::integer FROM released;

-- name: give_back_messages
-- Relay $2: the broker did not confirm these messages ($1 ids): their jobs still ready for the
-- attempt they carried back to the pick, to be published again (dispatcher.messages_again);
-- only this relay's messages. Per queue: how many went back, how many were no longer ready.
SELECT * FROM dispatcher.messages_again(ARRAY(
    SELECT m.id FROM dispatcher.outbox_messages m
     WHERE m.id = ANY ($1::bigint[]) AND m.relay = $2));

-- name: record_confirmed
-- Relay $1: the broker confirmed its messages $2 (dispatcher.record_confirms); how many.
SELECT dispatcher.record_confirms($1, $2);

-- name: sweep_lost_messages
-- Relay sweep: up to $2 messages not yet handled, oldest first, published over $1 seconds
-- ago, or over $3 seconds ago (the confirm timeout) with none of their jobs still ready for
-- the attempt they carried; not of a paused queue, whose consumers claim nothing; only
-- registered queues. The jobs still ready are messages the broker lost: back to the pick, so
-- the relay publishes them again (if a message was only slow, one of the two deliveries is a
-- counted duplicate). A message whose jobs all left ready was handled without being counted
-- (a claim of an earlier release during a rolling upgrade; a job delivered twice in one
-- claim): it leaves the window. Per queue: how many went back, how many were not ready.
SELECT * FROM dispatcher.messages_again(ARRAY(
    SELECT m.id
      FROM dispatcher.queues q
     CROSS JOIN LATERAL (
           SELECT x.id, x.published_at FROM dispatcher.outbox_messages x
            WHERE x.queue = q.name
              AND x.published_at < now() - make_interval(secs => least($1::float8, $3::float8))
              AND (x.published_at < now() - make_interval(secs => $1)
                   OR NOT EXISTS (
                          SELECT 1 FROM unnest(x.job_ids, x.attempts) AS j(id, attempt)
                           CROSS JOIN LATERAL (SELECT s.state, s.attempt
                                                 FROM dispatcher.job_state s
                                                WHERE s.id = j.id OFFSET 0) k
                           WHERE k.state = 'ready' AND k.attempt = j.attempt))
            ORDER BY x.published_at
            LIMIT $2
              FOR UPDATE SKIP LOCKED) m
     WHERE NOT q.paused
     ORDER BY m.published_at
     LIMIT $2));

-- name: sweep_unclaimed
-- Relay sweep of the rows an earlier release's relays leased (before migration 054): up to $2
-- whose lease ran out unclaimed (leased until their message counts as lost, migration 052; or
-- marked published more than $1 seconds ago, migration 017), oldest first; not of a paused
-- queue, whose consumers claim nothing; only registered queues. A row whose job is still ready
-- is a message the broker lost: back to the pick, so the relay publishes it again (if the
-- message was only slow, one of the two deliveries is a counted duplicate). A row whose job is
-- no longer ready is left over: deleted (this release's claims delete no row).
-- One row per queue: how many were published again, how many deleted.
-- Per queue through outbox_relayed (OFFSET 0: with the statistics of a young table the
-- planner chose to read the whole outbox); each queue's oldest first, at most $2 of each locked.
WITH stale AS MATERIALIZED (
    SELECT o.id, o.job_id, o.queue
      FROM dispatcher.queues q
     CROSS JOIN LATERAL (
           SELECT x.id, x.job_id, x.queue, coalesce(x.published_at, x.leased_until) AS since
             FROM dispatcher.outbox x
            WHERE x.queue = q.name AND x.leased_until IS NOT NULL
              AND (x.published_at < now() - make_interval(secs => $1)
                   OR (x.leased_by IS NOT NULL AND x.leased_until < now()))
            ORDER BY since
            LIMIT $2
              FOR UPDATE SKIP LOCKED) o
     WHERE NOT q.paused
     ORDER BY o.since
     LIMIT $2
), judged AS MATERIALIZED (
    -- the state by primary key (a condition on `state` here could walk an index of ready rows)
    SELECT s.id, s.queue,
           coalesce((SELECT j.state FROM dispatcher.job_state j WHERE j.id = s.job_id) = 'ready',
                    false) AS ready
      FROM stale s
), again AS (
    UPDATE dispatcher.outbox o
       SET published_at = NULL, leased_until = NULL, leased_by = NULL  -- to pick again
     WHERE o.id = ANY (ARRAY(SELECT id FROM judged WHERE ready))
    RETURNING o.queue
), dropped AS (
    DELETE FROM dispatcher.outbox o WHERE o.id = ANY (ARRAY(SELECT id FROM judged WHERE NOT ready))
    RETURNING o.queue
)
SELECT queue, count(*) FILTER (WHERE again)::integer AS republished,
       count(*) FILTER (WHERE NOT again)::integer AS dropped
  FROM (SELECT queue, true AS again FROM again
        UNION ALL SELECT queue, false FROM dropped) d
 GROUP BY queue;

-- name: claim_delivered
-- Consumer: lease the delivered jobs ($2 ids, $3 the attempt each message was published after)
-- of queue $1 that this process can run ($6 handler:version pairs) to owner $4 for $5 seconds,
-- the first delivered first, within the queue's global limits (none while the queue is
-- paused: all held, look again in a second). A job no longer ready, or ready for another
-- attempt, is not eligible (a duplicate delivery). A ready job this process cannot run (a
-- mixed-version fleet) is refused: a new outbox row, published again after a second, carries
-- it to another daemon; so is one whose concurrency key is at its limit, its row leased until
-- the key may start one (held_key names the key: one of its jobs ending releases the row
-- sooner, migration 045). The jobs handled here (started, refused, no longer ready) are counted
-- in the messages that carried them ($9, one per delivery; $10, the messages of deliveries the
-- consumer dropped as duplicates), a message done with deleted: its place in the relay's
-- window is free (migration 054; the relay took its rows already).
-- The daemon's memory budget (migration 020): of the jobs the limits grant, in delivery order,
-- the claim starts the longest prefix whose payload and target bytes fit in $7; with $8 (the
-- daemon holds nothing else) the first is started whatever its size. The rest are held back,
-- as the limits hold them.
-- The last row is always the marker: the eligible ids (those not claimed were held back by the
-- limits), the refused ids, the limiter's wait, and in how many seconds the refused rows'
-- leases run out.
WITH paused AS MATERIALIZED (
    SELECT EXISTS (SELECT 1 FROM dispatcher.queues q WHERE q.name = $1 AND q.paused) AS paused
), grant_ AS MATERIALIZED (
    SELECT g.granted, CASE WHEN p.paused THEN 1.0 ELSE g.wait_s END::float8 AS wait_s
      FROM paused p
     CROSS JOIN LATERAL dispatcher.claim_grant(
           $1, CASE WHEN p.paused THEN 0 ELSE cardinality($2::bigint[]) END) g
), delivered AS MATERIALIZED (
    -- one primary-key probe per delivery (OFFSET 0: a join let the planner hash a scan of
    -- every state row)
    SELECT k.id, k.tenant, k.capability, k.state, d.pos, k.priority, k.expires_at, k.attempt,
           k.state = 'ready' AND k.attempt = d.attempt AS ready
      FROM unnest($2::bigint[], $3::integer[]) WITH ORDINALITY AS d(id, attempt, pos)
     CROSS JOIN LATERAL (SELECT k.* FROM dispatcher.job_state k
                          WHERE k.id = d.id AND k.queue = $1 OFFSET 0) k
), ready AS MATERIALIZED (
    SELECT id, tenant, capability, pos, priority, expires_at, attempt FROM delivered
     WHERE ready
), eligible AS MATERIALIZED (
    SELECT id, pos, expires_at FROM ready WHERE capability = ANY ($6::text[])
), budgeted AS MATERIALIZED (
    -- one primary-key probe of the intents per job granted, for its size and for what the
    -- claimed job carries (read once, as in claim_ready)
    SELECT b.* FROM (
        SELECT g.n, g.expires_at AS ttl, z.*, sum(z.size_bytes) OVER (ORDER BY g.n) AS upto
          FROM (SELECT id, expires_at, row_number() OVER (ORDER BY pos) AS n FROM eligible
                 ORDER BY pos LIMIT (SELECT granted FROM grant_)) g
         CROSS JOIN LATERAL (
               SELECT i.id, i.key, i.tenant, i.handler, i.handler_version, i.target, i.payload,
                      i.max_attempts, i.traceparent, i.timeout_s,
                      coalesce(i.size_bytes, dispatcher.stored_bytes(i.payload, i.target))
                      AS size_bytes, i.concurrency_key
                 FROM dispatcher.intents i WHERE i.id = g.id OFFSET 0) z) b
     WHERE b.upto <= $7::bigint OR (b.n = 1 AND $8::boolean)
), keyed AS MATERIALIZED (
    -- what each job's concurrency key may start now (migration 024)
    -- (a job past its TTL takes no key: it is ended, not started)
    SELECT dispatcher.key_take($1, ARRAY(SELECT id FROM budgeted
                                          WHERE ttl IS NULL OR ttl > now() ORDER BY n),
                               ARRAY(SELECT concurrency_key FROM budgeted
                                      WHERE ttl IS NULL OR ttl > now() ORDER BY n)) AS ids
), held_ids AS MATERIALIZED (
    -- the others, those their keys hold back (a hashed set difference): mostly none, so the
    -- tests below against this array cost nothing, where a test against the ids that may start
    -- compared each job with all of them (11 of a 1,000-job claim's 52 ms). key_take returns
    -- a subset of the jobs it was given: all of them (no key limits, as a rule) means none
    -- held, known without the difference (1.7 ms of a claim of 1,000)
    SELECT CASE WHEN cardinality(k.ids) = (SELECT count(*) FROM budgeted
                                            WHERE ttl IS NULL OR ttl > now())
                THEN '{}'::bigint[]
                ELSE ARRAY(SELECT id FROM budgeted WHERE ttl IS NULL OR ttl > now()
                           EXCEPT SELECT unnest(k.ids)) END AS ids
      FROM keyed k
), key_held AS MATERIALIZED (
    -- held back by their keys: refused like a version this process cannot run, so their
    -- deliveries do not hold prefetch places the other keys need; out again once the key has
    -- room (key_due)
    SELECT r.id, r.tenant, r.capability, r.priority, r.attempt, b.concurrency_key AS key
      FROM ready r JOIN budgeted b ON b.id = r.id
     WHERE (b.ttl IS NULL OR b.ttl > now())
       AND r.id = ANY ((SELECT ids FROM held_ids)::bigint[])
), key_due AS MATERIALIZED (
    -- in how many seconds each key that held jobs back may start one again (migration 045):
    -- by its rate, when its next token is due (its bucket as this statement read it, less the
    -- tokens this claim took: if another claim took one meanwhile, early, and held again then);
    -- by its cap, a quarter second at most (the end of one of its jobs releases the rows at
    -- once, 30_key_running.sql; this bounds what a race with that end leaves behind)
    SELECT h.key,
           coalesce(nullif(greatest(0.0, (1.0 - (least(l.burst, k.tokens + extract(
               epoch FROM clock_timestamp() - k.tokens_at) * l.rate_per_s) - t.n))
               / l.rate_per_s), 0.0), 0.25)::float8 AS due_s
      FROM (SELECT DISTINCT key FROM key_held) h
      JOIN dispatcher.queues qq ON qq.name = $1
     CROSS JOIN LATERAL dispatcher.key_limits_of(qq, h.key) l
      LEFT JOIN dispatcher.key_state k ON k.queue = $1 AND k.key = h.key
     CROSS JOIN LATERAL (SELECT count(*) AS n FROM budgeted b
                          WHERE b.concurrency_key = h.key
                            AND (b.ttl IS NULL OR b.ttl > now())
                            AND NOT b.id = ANY ((SELECT ids FROM held_ids)::bigint[])) t
), refused AS (
    INSERT INTO dispatcher.outbox (job_id, queue, tenant, capability, leased_until, priority,
                                   held_key, attempt)
    SELECT id, $1, tenant, capability, now() + interval '1 second', priority, NULL, attempt
      FROM ready WHERE NOT capability = ANY ($6::text[])
    UNION ALL
    SELECT h.id, $1, h.tenant, h.capability, now() + make_interval(secs => d.due_s), h.priority,
           h.key, h.attempt
      FROM key_held h JOIN key_due d ON d.key = h.key
    RETURNING job_id, leased_until - now() AS due
), started AS (
    UPDATE dispatcher.job_state s
       SET state = 'running', attempt = s.attempt + 1, lease_owner = $4,
           lease_expires_at = now() + make_interval(secs => $5), started_at = now()
     -- in delivery order when the limits grant fewer: the consumer hands over what it held
     -- back first (by id, a held job lost to every newer delivery of an older burst)
     -- its TTL as read above (set once, at intake): no probe for it (migration 030)
     WHERE s.id = ANY (ARRAY(SELECT id FROM budgeted
                          WHERE (ttl IS NULL OR ttl > now())
                            AND NOT id = ANY ((SELECT ids FROM held_ids)::bigint[])))
       -- re-checked when a concurrent claim got there first; written so that no index of ready
       -- rows matches it: with stale statistics the planner walked all of jobs_ready_claim
       -- (migration 015), testing every entry against the id array (1.4 s for 1,000 ids among
       -- 20,000 ready jobs), where the primary key takes one probe per id
       AND CASE WHEN s.state = 'ready' THEN true ELSE false END
    RETURNING s.id, s.queue, s.attempt, s.due_at, s.progress, s.run_key
), expired AS (
    -- delivered in time, past its time to live now: ended, never started (migration 030)
    UPDATE dispatcher.job_state s
       SET state = 'dead', dead_reason = 'expired', finished_at = now(),
           last_error = 'expired at ' || s.expires_at || ' before an attempt started'
     WHERE s.id = ANY (ARRAY(SELECT id FROM budgeted WHERE ttl <= now()))
       AND CASE WHEN s.state = 'ready' THEN true ELSE false END
    RETURNING s.id
), claimed AS (
    SELECT c.id, i.key, c.queue, i.tenant, i.handler, i.handler_version, i.target, i.payload,
           c.attempt, i.max_attempts,
           least(greatest(c.due_at, lower(dispatcher.due_at_range())),
                 upper(dispatcher.due_at_range())) AS due_at,
           c.progress, c.run_key,
           CASE WHEN c.due_at <@ dispatcher.due_at_range()
                THEN extract(epoch FROM now() - c.due_at) ELSE 0 END::float8 AS due_to_start_s,
           i.traceparent,
           i.size_bytes,
           i.timeout_s  -- the 17th column, as in claim_ready
      FROM started c
      JOIN budgeted i ON i.id = c.id
), handled AS MATERIALIZED (
    -- per message (migration 054; $9, one per delivery, NULL for an earlier release's), how
    -- many of its jobs this claim handled: all delivered but those the limits or the memory
    -- budget held back (the consumer offers those again), and the deliveries the consumer
    -- dropped as a second delivery of a job in this claim ($10, their messages): left
    -- uncounted, their message would hold its place in the window until the sweep
    -- (the difference only when some were held: every eligible job started, expired or
    -- key-held is the rule)
    SELECT h.message, count(*)::integer AS n
      FROM (SELECT d.message
              FROM unnest($2::bigint[], $9::bigint[]) AS d(id, message)
             WHERE d.message IS NOT NULL
               AND NOT d.id = ANY (CASE WHEN (SELECT count(*) FROM eligible)
                                             = (SELECT count(*) FROM started)
                                               + (SELECT count(*) FROM expired)
                                               + (SELECT count(*) FROM key_held)
                                        THEN '{}'::bigint[]
                                        ELSE ARRAY(SELECT id FROM eligible
                                                   EXCEPT SELECT id FROM started
                                                   EXCEPT SELECT id FROM expired
                                                   EXCEPT SELECT id FROM key_held) END)
            UNION ALL
            SELECT m FROM unnest($10::bigint[]) AS m WHERE m IS NOT NULL) h
     GROUP BY h.message
), retired AS (
    -- a message whose jobs were all handled leaves the window (each message by its primary
    -- key: joined, the planner hashed a scan of the table, dead rows and all)
    DELETE FROM dispatcher.outbox_messages m
     WHERE m.id = ANY (ARRAY(SELECT message FROM handled))
       AND m.handled + (SELECT h.n FROM handled h WHERE h.message = m.id) >= m.jobs
), counted AS (
    UPDATE dispatcher.outbox_messages m
       SET handled = m.handled + (SELECT h.n FROM handled h WHERE h.message = m.id)
     WHERE m.id = ANY (ARRAY(SELECT message FROM handled))
       AND m.handled + (SELECT h.n FROM handled h WHERE h.message = m.id) < m.jobs
), consumed AS (
    -- a rolling upgrade: the rows an earlier release's relay leased (its messages name no
    -- record: $9 NULL) of the jobs done with here, deleted as that release's claim did (a job
    -- ready for another attempt keeps its row: it carries that attempt's message); one probe
    -- of outbox_relayed (queue, job id) per such job, none when every message names a record
    DELETE FROM dispatcher.outbox o
     WHERE o.id = ANY (ARRAY(
           SELECT r.id
             FROM (SELECT id FROM started
                   UNION ALL SELECT id FROM expired
                   UNION ALL SELECT id FROM ready WHERE NOT capability = ANY ($6::text[])
                   UNION ALL SELECT id FROM key_held
                   UNION ALL SELECT id FROM delivered WHERE state <> 'ready') done
            CROSS JOIN LATERAL (SELECT x.id FROM dispatcher.outbox x
                                 WHERE x.queue = $1 AND x.job_id = done.id
                                   AND x.leased_until IS NOT NULL
                                OFFSET 0) r
            WHERE done.id = ANY (ARRAY(SELECT d.id
                                         FROM unnest($2::bigint[], $9::bigint[]) AS d(id, message)
                                        WHERE d.message IS NULL))))
)
SELECT c.*, NULL::bigint[] AS eligible, NULL::bigint[] AS refused, NULL::float8 AS wait_s,
       NULL::integer AS key_held, NULL::int AS expired_count, NULL::float8[] AS release_in_s
  FROM claimed c
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       NULL, NULL,
       -- an expired job is done with, not held back: its delivery is acknowledged
       ARRAY(SELECT id FROM eligible
              WHERE id NOT IN (SELECT id FROM key_held) AND id NOT IN (SELECT id FROM expired)),
       ARRAY(SELECT job_id FROM refused),
       dispatcher.claim_settle($1, g.granted, (SELECT count(*) FROM started)::int, g.wait_s),
       (SELECT count(*) FROM key_held)::int,
       (SELECT count(*) FROM expired)::int,
       -- when the refused rows' leases run out, in seconds from now (the relay releases them
       -- then: an idle relay polls for nothing)
       ARRAY(SELECT DISTINCT extract(epoch FROM due)::float8 FROM refused)
  FROM grant_ g;
