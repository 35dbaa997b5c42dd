"""Migration 046: one unique index on a job's key (jobs_key_prefix_id, text_pattern_ops,
carrying the id) replaces the constraint jobs_key_key and the prefix index. Jobs written before
keep their keys unique; an index built beforehand with CREATE UNIQUE INDEX CONCURRENTLY (as
docs/guides/operating.md says) is kept, an invalid leftover of one is built again."""

from __future__ import annotations

import asyncpg
import pytest

from dispatcher.db import schema
from tests.harness.indexes import fail_half_way, index_states

PREBUILT = (
    "CREATE UNIQUE INDEX CONCURRENTLY jobs_key_unique ON dispatcher.intents"
    " (key text_pattern_ops) INCLUDE (id)"
)


async def key_indexes(conn: asyncpg.Connection) -> dict[str, str]:
    rows = await conn.fetch(
        """SELECT c.relname, pg_get_indexdef(c.oid) AS def
             FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
            WHERE i.indrelid = 'dispatcher.intents'::regclass
              AND pg_get_indexdef(c.oid) ~ '\\(key'"""
    )
    return {r["relname"]: r["def"] for r in rows}


async def upgrade(conn: asyncpg.Connection, prebuilt: str) -> dict[str, tuple[int, bool]]:
    """Migrate to 045 with a job in place, build the guide's index (or leave it half-built),
    then apply 046 alone: the indexes before it."""
    await schema.migrate(conn, upto=45)
    await conn.execute("INSERT INTO dispatcher.handlers (name, kind) VALUES ('work', 'python')")
    # as a door wrote it (the doors' functions come with the last migration)
    await conn.execute(
        """WITH i AS (INSERT INTO dispatcher.intents (key, request_hash, queue, handler, payload,
                                                    max_attempts, max_retry_age_s)
                      VALUES ('before-046', 'v2:0', 'default', 'work', '{}', 1, 0) RETURNING id)
           INSERT INTO dispatcher.job_state (id, queue, capability, state, due_at,
                                             budget_started_at)
           SELECT id, 'default', 'work:1', 'scheduled', now() + interval '1 day', now() FROM i"""
    )
    if prebuilt != "none":
        await conn.execute(PREBUILT)
    if prebuilt == "invalid":
        await fail_half_way(conn, "jobs_key_unique")
    before = await index_states(conn)
    applied = await schema.migrate(conn, upto=46)
    assert [n for n in applied if not n.startswith("functions/")] == ["046_key_one_index.sql"]
    return before


@pytest.mark.parametrize("prebuilt", ["none", "valid", "invalid"])
async def test_one_unique_key_index_is_left_and_keys_stay_unique(
    empty_db_url: str, prebuilt: str
) -> None:
    conn = await asyncpg.connect(empty_db_url)
    try:
        before = await upgrade(conn, prebuilt)
        after = await index_states(conn)
        assert await key_indexes(conn) == {
            "jobs_key_prefix_id": "CREATE UNIQUE INDEX jobs_key_prefix_id ON dispatcher.intents"
            " USING btree (key text_pattern_ops) INCLUDE (id)"
        }
        assert after["jobs_key_prefix_id"][1]
        prebuilt_oid = before.get("jobs_key_unique", (None, False))[0]
        assert (after["jobs_key_prefix_id"][0] == prebuilt_oid) == (prebuilt == "valid")
        # both doors (their functions come with the last migration) find a key that names a
        # job written before the migration (here with another request), and one written after
        await schema.migrate(conn)
        with pytest.raises(asyncpg.UniqueViolationError, match="already names job"):
            await conn.execute("SELECT dispatcher.enqueue('before-046', 'work')")
        rows = await conn.fetch(
            "SELECT key, outcome, id FROM dispatcher.enqueue_many(ARRAY['after-046', 'before-046'],"
            " ARRAY['work', 'work'], ARRAY['{}', '{}']::jsonb[]) ORDER BY ord"
        )
        assert [(r["key"], r["outcome"]) for r in rows] == [
            ("after-046", "created"),
            ("before-046", "conflict"),
        ]
        assert (
            await conn.fetchval("SELECT dispatcher.enqueue('after-046', 'work')") == rows[0]["id"]
        )
        with pytest.raises(asyncpg.UniqueViolationError):
            await conn.execute(
                "INSERT INTO dispatcher.intents (key, request_hash, queue, handler, payload,"
                " max_attempts, max_retry_age_s) VALUES ('after-046', 'h', 'default', 'work',"
                " '{}', 1, 0)"
            )
    finally:
        await conn.close()
