"""Index settings that follow from what an index holds, checked for every index of the schema."""

from __future__ import annotations

import asyncpg

# The btree indexes of the schema whose key ends in their table's one-column primary key, with
# their options (migration 057).
ENDING_IN_THE_PRIMARY_KEY = """
SELECT c.relname AS index, i.indrelid::regclass::text AS table,
       coalesce(c.reloptions, '{}') AS options
  FROM pg_index i
  JOIN pg_class c ON c.oid = i.indexrelid
  JOIN pg_am am ON am.oid = c.relam AND am.amname = 'btree'
  JOIN pg_index pk ON pk.indrelid = i.indrelid AND pk.indisprimary AND pk.indnkeyatts = 1
 WHERE c.relnamespace = 'dispatcher'::regnamespace
   AND NOT i.indisunique AND i.indnkeyatts >= 2
   AND i.indkey[i.indnkeyatts - 1] = pk.indkey[0]
 ORDER BY c.relname
"""
# A job's row enters the claim index again only with a new due time; the state row's other
# indexes get an entry with the same key from every update that is not HOT (one per version)
NEVER_REPEATED = {"jobs_ready_claim"}


async def test_indexes_whose_keys_never_repeat_skip_deduplication(pool: asyncpg.Pool) -> None:
    rows = await pool.fetch(ENDING_IN_THE_PRIMARY_KEY)
    never = {
        r["index"]
        for r in rows
        if r["table"] == "dispatcher.intents" or r["index"] in NEVER_REPEATED
    }
    # the ones an intake writes are among them (the query finds what it should)
    assert {"jobs_ready_claim", "intents_handler_id", "intents_tenant_id"} <= never
    deduplicating = [r["index"] for r in rows if r["index"] in never and _dedup(r["options"])]
    assert not deduplicating, (
        f"{deduplicating}: a key that ends in the id of a row written once never repeats, so "
        "set (deduplicate_items = off) in the migration that creates the index"
    )
    # the others keep it: a row's versions share their keys there
    merging = {r["index"] for r in rows if r["index"] not in never and _dedup(r["options"])}
    assert {"job_state_due_at_rest", "jobs_run_key_id"} <= merging


def _dedup(options: list[str]) -> bool:
    return "deduplicate_items=off" not in options
