-- Messages whose jobs must be published again (migration 054): the broker did not confirm them
-- (their relay gives them back), their relay's daemon died before it knew (the rescue), or the
-- broker lost them (the sweep). Each is deleted; of its jobs, those still ready for the attempt
-- it carried get an outbox row again, for a relay to publish (those a claim started meanwhile,
-- or that ended, are left as they are: a message the broker kept is then a counted duplicate
-- at most). Per queue: how many jobs go out again, how many were no longer ready.
CREATE OR REPLACE FUNCTION dispatcher.messages_again(ids bigint[])
RETURNS TABLE (queue text, republished integer, dropped integer)
LANGUAGE sql VOLATILE AS $$
    WITH gone AS MATERIALIZED (
        DELETE FROM dispatcher.outbox_messages m
         WHERE m.id = ANY (ids)
        RETURNING m.queue, m.job_ids, m.attempts
    ), jobs AS MATERIALIZED (
        -- the state by primary key, one probe a job (a condition on `state` joined here
        -- could walk an index of ready rows)
        SELECT g.queue, k.id, k.tenant, k.capability, k.priority, k.attempt,
               coalesce(k.state = 'ready' AND k.attempt = j.attempt, false) AS ready
          FROM gone g
         CROSS JOIN LATERAL unnest(g.job_ids, g.attempts) AS j(id, attempt)
          LEFT JOIN LATERAL (SELECT s.* FROM dispatcher.job_state s
                              WHERE s.id = j.id OFFSET 0) k ON true
    ), again AS (  -- run to its end whatever the answer reads (a data-modifying WITH)
        INSERT INTO dispatcher.outbox (job_id, queue, tenant, capability, priority, attempt)
        SELECT j.id, j.queue, j.tenant, j.capability, j.priority, j.attempt FROM jobs j
         WHERE j.ready
        RETURNING 1
    )
    SELECT j.queue, count(*) FILTER (WHERE j.ready)::integer,
           count(*) FILTER (WHERE NOT j.ready)::integer
      FROM jobs j
     GROUP BY j.queue
$$;
