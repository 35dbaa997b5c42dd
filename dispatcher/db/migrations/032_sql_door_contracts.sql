-- The SQL door takes every contract the HTTP door takes (issue 23; docs/guides/intake-contracts.md).
--
-- Before: dispatcher.enqueue_many had no key mode, deadline, time to live or callbacks, and
-- dispatcher.enqueue no key mode; a replacement (key modes) kept the job's priority,
-- concurrency key, retry settings and contract while its fingerprint said otherwise. Now
-- dispatcher.enqueue takes `on_key` and `debounce_max_s`, dispatcher.enqueue_many one array
-- each of `on_keys`, `debounce_max_s`, `timeout_s`, `expires_ats`, `on_success` and
-- `on_failure`, and dispatcher.replace_scheduled replaces the whole request. Each is appended
-- with a NULL default, so every call written for the old signatures (by name or by position)
-- means what it meant. The bodies are db/functions/10_enqueue.sql, 10_enqueue_many.sql,
-- 10_enqueue_many_contracts.sql, 10_replace_scheduled.sql, 10_replace_one.sql and
-- 10_request_contract.sql; the old signatures are dropped so that no call is ambiguous.
DROP FUNCTION IF EXISTS
    dispatcher.enqueue(text, text, jsonb, timestamptz, text, text, jsonb, integer, integer,
                       integer, text, float8, timestamptz, jsonb, jsonb);
DROP FUNCTION IF EXISTS
    dispatcher.enqueue_many(text[], text[], jsonb[], timestamptz[], text[], text[], jsonb[],
                            integer[], integer[], text[], integer[], text[]);
DROP FUNCTION IF EXISTS
    dispatcher.replace_scheduled(text[], text[], jsonb[], timestamptz[], text[], text[], jsonb[],
                                 integer[], integer[], boolean[], integer[]);

-- What a key mode did to a job, for its status (GET /v1/jobs/{id}, the console's job page,
-- `dispatcher jobs show`): the mode of the last replacement (`replace` or `keep_due`), how many
-- replacements it took, the last one's time, and the latest due time the last replacement's
-- `debounce_max_s` allows (acceptance + debounce_max_s; NULL: unbounded, or keep_due).
-- Written by dispatcher.replace_scheduled only; NULL on every job never replaced, so a job
-- that no key mode touched stores nothing more (nullable columns take only their null bit).
ALTER TABLE dispatcher.intents
    ADD COLUMN replaced_by text CONSTRAINT intents_replaced_by_mode
        CHECK (replaced_by IN ('replace', 'keep_due')),
    ADD COLUMN replacements integer,
    ADD COLUMN replaced_at timestamptz,
    ADD COLUMN debounce_until timestamptz;
