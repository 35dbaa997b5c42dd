-- Key modes (issue 23, point 2): the jobs a request names by key with another body, replaced
-- while they are still `scheduled` (on_key = replace: debounce; keep_due: throttle). Called
-- for the items the enqueue door answered "conflict". Each item's job is locked, so of many
-- concurrent replacements the last to commit wins and the due-scan, which moves a job to
-- `ready` under the same lock, sees either the old request or the new one, never half.
-- The payload, target and fingerprint are replaced; the due time too unless `keep_due`, and
-- never past the job's acceptance plus `debounce_max_s` (NULL: no bound). A job of another
-- handler, queue or tenant is not replaced (outcome "conflict"); one already ready, running
-- or finished is not either (outcome "not_replaced", with its state). A job the due-scan moved
-- to ready ahead of its due time (queries.sql scan_due) is still waiting for it: replaced as a
-- scheduled one, and scheduled again (the due-scan moves it anew); the relay, which would have
-- its message already, moves nothing ahead.
-- The whole request is replaced (migration 032): the retry settings, `priority` and
-- `concurrency_key` (on the intent and the state row, which the claim orders and limits by)
-- and the contract (deadline, time to live, callbacks), so the fingerprint and the contract
-- stored are the replacing request's: sending it again is a replay, not another request.
-- Each replacement is counted on the intent (replaced_by, replacements, replaced_at,
-- debounce_until: the job's status shows them).
CREATE OR REPLACE FUNCTION dispatcher.replace_scheduled(
    keys text[], handlers text[], payloads jsonb[], due_ats timestamptz[], queues text[],
    tenants text[], targets jsonb[], max_attempts integer[], max_retry_age_s integer[],
    keep_due boolean[], debounce_max_s integer[], priorities integer[] DEFAULT NULL,
    concurrency_keys text[] DEFAULT NULL, timeouts_s float8[] DEFAULT NULL,
    expires_ats timestamptz[] DEFAULT NULL, on_success jsonb[] DEFAULT NULL,
    on_failure jsonb[] DEFAULT NULL
) RETURNS SETOF dispatcher.enqueue_result LANGUAGE plpgsql AS $$
DECLARE
    r      record;
    job    record;
    due    timestamptz;
    woken  boolean := false;
BEGIN
    FOR r IN SELECT u.*, coalesce(u.q, 'default') AS qn, coalesce(u.t, '') AS tn,
                    coalesce(u.pr, 0) AS prio,
                    dispatcher.effective_concurrency_key(u.ck, coalesce(u.t, '')) AS ckey
               FROM unnest(keys, handlers, payloads, due_ats, queues, tenants, targets,
                           max_attempts, max_retry_age_s, keep_due, debounce_max_s,
                           priorities, concurrency_keys, timeouts_s, expires_ats, on_success,
                           on_failure)
                    WITH ORDINALITY AS u(k, h, p, d, q, t, tg, ma, mra, kd, dm, pr, ck, ts, ex,
                                         os, ofl, o)
    LOOP
        SELECT i.id, i.handler, i.queue, i.tenant, i.created_at, s.state, s.due_at
          INTO job
          FROM dispatcher.intents i JOIN dispatcher.job_state s ON s.id = i.id
         WHERE i.key = r.k
           FOR UPDATE OF s;
        IF job.id IS NULL THEN
            CONTINUE;  -- pruned or gone meanwhile: the caller answers it as it was
        END IF;
        IF (job.handler, job.queue, job.tenant) IS DISTINCT FROM (r.h, r.qn, r.tn) THEN
            RETURN NEXT ROW(r.o::integer, job.id, r.k, job.state, job.due_at, job.created_at,
                            'conflict')::dispatcher.enqueue_result;
        ELSIF job.state <> 'scheduled' AND NOT (job.state = 'ready' AND job.due_at > now()) THEN
            RETURN NEXT ROW(r.o::integer, job.id, r.k, job.state, job.due_at, job.created_at,
                            'not_replaced')::dispatcher.enqueue_result;
        ELSE
            due := CASE WHEN r.kd THEN job.due_at
                        ELSE least(greatest(coalesce(r.d, now()), now()),
                                   job.created_at + make_interval(secs => r.dm))
                   END;
            due := coalesce(due, greatest(coalesce(r.d, now()), now()));
            UPDATE dispatcher.intents i
               SET payload = r.p, target = r.tg,
                   request_hash = dispatcher.request_fingerprint(r.h, r.tg, r.p, r.qn, r.tn,
                                                                 r.d, r.ma, r.mra, r.prio, r.ck),
                   max_attempts = coalesce(r.ma, qd.max_attempts),
                   max_retry_age_s = coalesce(r.mra, qd.max_retry_age_s),
                   priority = r.prio, concurrency_key = r.ckey,
                   timeout_s = r.ts, on_success = r.os, on_failure = r.ofl,
                   replaced_by = CASE WHEN r.kd THEN 'keep_due' ELSE 'replace' END,
                   replacements = coalesce(i.replacements, 0) + 1, replaced_at = now(),
                   debounce_until = CASE WHEN NOT r.kd
                                         THEN job.created_at + make_interval(secs => r.dm) END
              FROM dispatcher.queues qd
             WHERE i.id = job.id AND qd.name = r.qn;
            UPDATE dispatcher.job_state
               SET state = 'scheduled', due_at = due, budget_started_at = due, priority = r.prio,
                   concurrency_key = r.ckey, expires_at = r.ex,
                   has_callback = num_nonnulls(r.os, r.ofl) > 0
             WHERE id = job.id;
            woken := woken OR due <> job.due_at OR job.state = 'ready';
            RETURN NEXT ROW(r.o::integer, job.id, r.k, 'scheduled', due, job.created_at,
                            'replaced')::dispatcher.enqueue_result;
        END IF;
    END LOOP;
    IF woken THEN
        PERFORM dispatcher.wake('scheduled');  -- the due-scan's next time moved
    END IF;
END
$$;
