"""Migration 060: the state row's check of its seven states is read from a domain the table's
check casts to, so a statement that writes one state row no longer parses the seven values from
the table's catalog (docs/performance: "The plain case's own claim statement"). The upgrade
keeps the tables and their indexes; every writer is still refused a state outside the seven,
under the constraint's old name."""

from __future__ import annotations

import asyncpg
import pytest

from tests.db.test_checks_as_domains import ENQUEUE, STORAGE, jobs_at_version, upgrade_to

STATES = ("scheduled", "ready", "running", "succeeded", "dead", "cancelled", "discarded")


async def test_the_upgrade_keeps_the_tables_and_moves_the_seven_states_to_the_domain(
    empty_db_url: str,
) -> None:
    conn = await asyncpg.connect(empty_db_url)
    try:
        ids = await jobs_at_version(conn, 59)
        storage = dict(await conn.fetch(STORAGE))
        assert await upgrade_to(conn, 60) == ["060_state_check_in_a_domain.sql"]
        assert dict(await conn.fetch(STORAGE)) == storage  # nothing rewritten, no index rebuilt
        kept = await conn.fetch("SELECT id, state FROM dispatcher.jobs ORDER BY id")
        assert [(r["id"], r["state"]) for r in kept] == [(i, "scheduled") for i in ids]
        table_check = await conn.fetchval(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE conrelid = 'dispatcher.job_state'::regclass"
            "   AND conname = 'job_state_state_check'"
        )
        assert "job_state_value" in table_check and "succeeded" not in table_check
        assert await conn.fetchval(ENQUEUE, "after") > ids[-1]
    finally:
        await conn.close()


async def test_a_state_outside_the_seven_is_refused_by_name(conn: asyncpg.Connection) -> None:
    """An UPDATE straight on the table, as an operator's SQL would write it, changes nothing."""
    await conn.execute("INSERT INTO dispatcher.handlers (name, kind) VALUES ('noop', 'python')")
    job_id = await conn.fetchval(ENQUEUE, "checked")
    with pytest.raises(asyncpg.CheckViolationError, match="job_state_state_check"):
        await conn.execute("UPDATE dispatcher.job_state SET state = 'paused' WHERE id = $1", job_id)
    assert await conn.fetchval("SELECT state FROM dispatcher.job_state WHERE id = $1", job_id) == (
        "scheduled"
    )


@pytest.mark.parametrize("state", STATES)
async def test_each_of_the_seven_states_is_accepted(conn: asyncpg.Connection, state: str) -> None:
    await conn.execute("INSERT INTO dispatcher.handlers (name, kind) VALUES ('noop', 'python')")
    job_id = await conn.fetchval(ENQUEUE, f"state-{state}")
    owner = "someone" if state == "running" else None  # job_state_lease_check
    await conn.execute(
        "UPDATE dispatcher.job_state SET state = $2, lease_owner = $3 WHERE id = $1",
        job_id,
        state,
        owner,
    )
    assert await conn.fetchval("SELECT state FROM dispatcher.job_state WHERE id = $1", job_id) == (
        state
    )
