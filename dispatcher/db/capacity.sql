-- Statements about the server itself, not the dispatcher's schema (db/capacity.py).

-- name: server_connections
-- The server's connection slots: max_connections, those reserved for superusers (and, from
-- PostgreSQL 16, for pg_use_reserved_connections), and the client connections open now.
SELECT current_setting('max_connections')::integer AS max_connections,
       current_setting('superuser_reserved_connections')::integer
         + coalesce(nullif(current_setting('reserved_connections', true), '')::integer, 0)
         AS reserved,
       (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')::integer
         AS in_use;
