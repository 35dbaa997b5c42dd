"""The console sessions repository (dispatcher.db.sessions, migration 021) on real PostgreSQL:
the database clock decides expiry, sign-in prunes expired rows, a start ends the sessions of
removed tokens, and the per-request lookup is one index probe at any table size."""

from __future__ import annotations

import hashlib
import time

import asyncpg

from dispatcher.db.queries import query
from dispatcher.db.sessions import PRUNE_PER_SIGN_IN, SessionRepository
from tests.db.test_plans import plan


def id_hash(n: int) -> bytes:
    return hashlib.sha256(str(n).encode()).digest()


async def test_a_session_is_active_until_ended_expired_or_its_token_differs(
    pool: asyncpg.Pool,
) -> None:
    repo = SessionRepository(pool)
    later = time.time() + 3600
    await repo.create(id_hash(1), "token-a", "ops", "192.0.2.1", later)
    assert await repo.is_active(id_hash(1), "token-a")
    assert not await repo.is_active(id_hash(1), "token-b")  # the cookie names another token
    assert not await repo.is_active(id_hash(2), "token-a")
    assert await repo.end(id_hash(1)) and not await repo.end(id_hash(1))
    assert not await repo.is_active(id_hash(1), "token-a")
    await repo.create(id_hash(3), "token-a", "ops", "192.0.2.1", time.time() - 1)
    assert not await repo.is_active(id_hash(3), "token-a")
    assert await repo.live_sessions() == []


async def test_a_sign_in_prunes_expired_sessions(pool: asyncpg.Pool) -> None:
    repo = SessionRepository(pool)
    await pool.execute(
        "INSERT INTO dispatcher.console_sessions (id_hash, token_id, token_name, client, "
        "expires_at) SELECT sha256(g::text::bytea), 'token-a', 'ops', '192.0.2.1', "
        "now() - interval '1 minute' FROM generate_series(1, $1::int) g",
        PRUNE_PER_SIGN_IN + 5,
    )
    count = "SELECT count(*) FROM dispatcher.console_sessions"
    assert await pool.fetchval(count) == PRUNE_PER_SIGN_IN + 5
    await repo.create(id_hash(-1), "token-a", "ops", "192.0.2.1", time.time() + 60)
    assert await pool.fetchval(count) == 6  # 100 expired went, 5 expired and the new one stay
    await repo.create(id_hash(-2), "token-a", "ops", "192.0.2.1", time.time() + 60)
    assert await pool.fetchval(count) == 2


async def test_a_start_ends_the_sessions_of_removed_tokens(pool: asyncpg.Pool) -> None:
    repo = SessionRepository(pool)
    later = time.time() + 3600
    for n, token in enumerate(("kept", "removed", "removed")):
        await repo.create(id_hash(n), token, token, "192.0.2.1", later)
    assert await repo.revoke_other_tokens(["kept"]) == 2
    assert [s.token_name for s in await repo.live_sessions()] == ["kept"]
    assert await repo.revoke_other_tokens([]) == 1  # no tokens configured: none stays


async def test_the_lookup_is_one_index_probe(pool: asyncpg.Pool) -> None:
    await pool.execute(
        "INSERT INTO dispatcher.console_sessions (id_hash, token_id, token_name, client, "
        "expires_at) SELECT sha256(g::text::bytea), 'token-a', 'ops', '192.0.2.1', "
        "now() + interval '1 hour' FROM generate_series(1, 20000) g"
    )
    await pool.execute("ANALYZE dispatcher.console_sessions")
    text = await plan(pool, query("session_is_active"), id_hash(7), "token-a")
    assert "Index Scan using console_sessions_id_hash_key" in text, text
    assert "Seq Scan" not in text, text
