-- The SQL door: applications enqueue inside their own transaction, so the intent commits or rolls
-- back together with their business change (the transactional outbox). The HTTP API uses the same
-- function, so both doors share one set of idempotency rules.

CREATE TYPE dispatcher.enqueue_result AS (
    ord integer, id bigint, key text, state text, due_at timestamptz, created_at timestamptz,
    outcome text
);

-- Function, view and trigger bodies live in db/functions/, one file each (db/schema.py applies
-- them after the migrations): dispatcher.enqueue_many and dispatcher.enqueue were created
-- here, returning dispatcher.enqueue_result.
