"""Which pools reset a connection on release (dispatcher/db/pool.py `create_pool`): the pools of
the daemon's own statements send nothing more, the handlers' pool resets what handler code may
have left in the session."""

from __future__ import annotations

import pytest

from dispatcher.db.pool import create_pool


@pytest.mark.parametrize("reset_sessions", [False, True])
async def test_a_release_resets_the_session_only_where_asked(
    db_url: str, reset_sessions: bool
) -> None:
    pool = await create_pool(db_url, size=1, min_size=1, reset_sessions=reset_sessions)
    sent: list[str] = []
    try:
        async with pool.acquire() as conn:
            conn.add_query_logger(lambda record: sent.append(record.query))
            await conn.execute("SET application_name = 'left-behind'")
        async with pool.acquire() as conn:  # the pool's only connection, again
            name = await conn.fetchval("SHOW application_name")
    finally:
        await pool.close()
    resets = [q for q in sent if "RESET ALL" in q]
    if reset_sessions:
        assert resets and name == "dispatcher"
    else:
        assert not resets and name == "left-behind"  # no round trip after the statement
