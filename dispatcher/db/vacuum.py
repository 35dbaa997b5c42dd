"""Is the queue's garbage collected? Every job leaves dead rows behind it (each state change
writes a new row version, the outbox deletes what it delivers) and only VACUUM reclaims them.
With autovacuum off nobody does, and claims slow down as they step over the dead rows."""

from __future__ import annotations

import asyncpg

QUEUE_TABLES = ("dispatcher.job_state", "dispatcher.outbox", "dispatcher.outbox_messages")

_SETTINGS = """
SELECT current_setting('autovacuum')::bool AS autovacuum,
       current_setting('track_counts')::bool AS track_counts,
       coalesce(array_agg(c.oid::regclass::text ORDER BY c.relname)
                FILTER (WHERE 'autovacuum_enabled=false' = ANY (c.reloptions)), '{}') AS disabled
  FROM pg_class c
 WHERE c.oid = ANY ($1::regclass[])
"""


async def vacuum_problems(conn: asyncpg.Connection) -> list[str]:
    """What keeps autovacuum from cleaning the queue tables, each with its fix; empty when
    nothing does."""
    row = await conn.fetchrow(_SETTINGS, list(QUEUE_TABLES))
    tables = " and ".join(QUEUE_TABLES)
    problems = []
    if not row["autovacuum"]:
        problems.append(
            f"autovacuum is off on this server, so dead rows in {tables} are never reclaimed "
            "and claims slow down over time: set autovacuum = on in postgresql.conf, or run "
            f"VACUUM {', '.join(QUEUE_TABLES)} from a timer (every minute under load)"
        )
    elif not row["track_counts"]:
        problems.append(
            "track_counts is off, so autovacuum cannot tell when the queue tables need it: "
            "set track_counts = on in postgresql.conf"
        )
    for table in row["disabled"]:
        problems.append(
            f"autovacuum is disabled for {table}: ALTER TABLE {table} RESET (autovacuum_enabled)"
        )
    return problems
