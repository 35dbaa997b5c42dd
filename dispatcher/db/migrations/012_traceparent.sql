-- Tracing: the W3C trace context a job was accepted in, so each attempt's span joins the
-- producer's trace and the http effect can send it on (README, "Tracing"). NULL when the job
-- was accepted with tracing off, through the SQL door, or by cron.
--
-- Cost on upgrade: a nullable column without a default is a catalog change (no table rewrite).
-- The check is added NOT VALID: existing rows are all NULL, so nothing needs scanning, and
-- every new or changed value is still checked.

ALTER TABLE dispatcher.jobs ADD COLUMN traceparent text;

-- Only a normalized version-00 traceparent is ever stored: the claim hands it to the tracer
-- as it is, so a hand-written value must not reach it.
ALTER TABLE dispatcher.jobs ADD CONSTRAINT jobs_traceparent_w3c
    CHECK (traceparent ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-0[01]$') NOT VALID;
