-- name: session_create
-- Record a console session signed in now (its id's hash), pruning up to $6 expired ones.
WITH pruned AS (
    DELETE FROM dispatcher.console_sessions
    WHERE id IN (SELECT id FROM dispatcher.console_sessions
                 WHERE expires_at <= now() ORDER BY expires_at LIMIT $6)
)
INSERT INTO dispatcher.console_sessions (id_hash, token_id, token_name, client, expires_at)
VALUES ($1, $2, $3, $4, to_timestamp($5))
RETURNING id

-- name: session_is_active
-- Whether the session with this id hash exists, for this token id, and has not expired.
SELECT EXISTS (
    SELECT FROM dispatcher.console_sessions
    WHERE id_hash = $1 AND token_id = $2 AND expires_at > now()
)

-- name: session_end
-- Sign-out: delete the session with this id hash; its id, or nothing when it was gone.
DELETE FROM dispatcher.console_sessions WHERE id_hash = $1 RETURNING id

-- name: session_list
-- The sessions that have not expired, oldest first (never the id hash).
SELECT id, token_name, client, created_at, expires_at
FROM dispatcher.console_sessions
WHERE expires_at > now()
ORDER BY created_at, id

-- name: session_revoke
-- Revoke one session by its listed id; the id when it existed.
DELETE FROM dispatcher.console_sessions WHERE id = $1 RETURNING id

-- name: session_revoke_all
-- Revoke every session; how many there were (expired ones included).
WITH gone AS (DELETE FROM dispatcher.console_sessions RETURNING expires_at)
SELECT count(*) FILTER (WHERE expires_at > now()) FROM gone

-- name: session_revoke_other_tokens
-- Revoke the sessions of tokens not in $1 (token ids), and expired ones; how many were live.
WITH gone AS (
    DELETE FROM dispatcher.console_sessions
    WHERE token_id <> ALL ($1::text[]) OR expires_at <= now()
    RETURNING expires_at
)
SELECT count(*) FILTER (WHERE expires_at > now()) FROM gone
