-- The SQL door's batch no longer renders every payload twice: dispatcher.enqueue_many_internal
-- takes the door's limit (`refuse_over`, last, NULL by default) and refuses the call from the
-- sizes its insert writes (db/functions/10_enqueue_many_internal.sql, 10_refuse_oversize.sql).
-- The signature before it is dropped so that a call without the new argument (the daemon's, or
-- an earlier release's during a rolling upgrade) finds the one function.
DROP FUNCTION IF EXISTS
    dispatcher.enqueue_many_internal(text[], text[], jsonb[], timestamptz[], text[], text[],
                                     jsonb[], integer[], integer[], text[], integer[], text[]);
