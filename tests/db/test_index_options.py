"""Index settings that follow from what an index holds, checked for every index of the schema."""

from __future__ import annotations

import asyncpg

# The btree indexes of the schema whose key ends in their table's one-column primary key, with
# their options: such a key never repeats across rows, so deduplication has nothing to merge
# (migration 057).
ENDING_IN_THE_PRIMARY_KEY = """
SELECT c.relname AS index, coalesce(c.reloptions, '{}') AS options
  FROM pg_index i
  JOIN pg_class c ON c.oid = i.indexrelid
  JOIN pg_am am ON am.oid = c.relam AND am.amname = 'btree'
  JOIN pg_index pk ON pk.indrelid = i.indrelid AND pk.indisprimary AND pk.indnkeyatts = 1
 WHERE c.relnamespace = 'dispatcher'::regnamespace
   AND NOT i.indisunique AND i.indnkeyatts >= 2
   AND i.indkey[i.indnkeyatts - 1] = pk.indkey[0]
 ORDER BY c.relname
"""


async def test_indexes_whose_key_ends_in_the_primary_key_skip_deduplication(
    pool: asyncpg.Pool,
) -> None:
    rows = await pool.fetch(ENDING_IN_THE_PRIMARY_KEY)
    indexes = {r["index"] for r in rows}
    # the ones an intake writes are among them (the query finds what it should)
    assert {"jobs_ready_claim", "intents_handler_id", "outbox_to_relay"} <= indexes
    deduplicating = [r["index"] for r in rows if "deduplicate_items=off" not in r["options"]]
    assert not deduplicating, (
        f"{deduplicating}: a key ending in the row's id never repeats, so set "
        "(deduplicate_items = off) in the migration that creates the index"
    )
