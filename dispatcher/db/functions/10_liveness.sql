-- An owner's liveness lock (migration 022, docs/recovery.md): its key, and whether a session
-- holds it.

-- The lock's key: (namespace, hash of the owner id). The two-integer form shows in pg_locks as
-- classid = namespace, objid = key, objsubid = 2. A hash shared by two owners only delays a
-- rescue (one looks alive while the other lives) to the lease expiry; it never rescues early.
CREATE OR REPLACE FUNCTION dispatcher.liveness_namespace() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 1684632436 $$;  -- 0x64697374, 'dist'

CREATE OR REPLACE FUNCTION dispatcher.liveness_key(owner text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT hashtext(owner) $$;

-- Whether some session of this database holds `owner`'s liveness lock (pg_locks is readable by
-- every role). The rescue asks it again in the statement that rescues, so an owner that took its
-- lock back after it was judged gone keeps its jobs.
CREATE OR REPLACE FUNCTION dispatcher.liveness_held(owner text) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    SELECT EXISTS (
        SELECT 1 FROM pg_locks l
         WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
           AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
           AND l.classid = dispatcher.liveness_namespace()::oid
           AND l.objid = dispatcher.liveness_key(owner)::oid)
$$;
