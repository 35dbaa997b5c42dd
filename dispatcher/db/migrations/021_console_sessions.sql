-- Console sessions on the server (issue 20): signing out ends a session everywhere.
--
-- Before, a session was only a signed cookie: signing out deleted the browser's copy, and a
-- copy taken before still read pages and acted (with its CSRF token) until it expired (8 h).
-- Now every signed-in session has a row here, and a cookie is accepted only while its row
-- exists and has not expired: sign-out, `dispatcher console sessions revoke` and the removal
-- of a token delete rows. Daemons sharing the database share the sessions.
--
-- Only a hash of the session id is stored (the id is in the cookie, a bearer secret); `id`
-- is the public handle the CLI lists and revokes by. One primary-key probe per console
-- request (id_hash); expires_at is indexed for the pruning of expired rows.
CREATE TABLE dispatcher.console_sessions (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id_hash bytea NOT NULL UNIQUE CHECK (octet_length(id_hash) = 32),
    token_id text NOT NULL,        -- which configured token signed in (the cookie's token id)
    token_name text NOT NULL,      -- the token's name, for listing (never the token)
    client text NOT NULL,          -- the address that signed in
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX console_sessions_expiry ON dispatcher.console_sessions (expires_at);
