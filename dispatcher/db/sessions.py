"""The console sessions repository (the statements of sessions.sql): a row per signed-in
session, keyed by a hash of its id, so that sign-out and revocation end it on every daemon
sharing the database. The database clock decides expiry."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from dispatcher.db.pool import translate_unavailable
from dispatcher.db.queries import query

# Expired rows deleted by each new session: sign-ins outpace expiries, so rows never pile up.
PRUNE_PER_SIGN_IN = 100


@dataclass(frozen=True, slots=True)
class SessionRow:
    """A live session as listed: its public id (for revoking), never its secret id."""

    id: int
    token_name: str
    client: str
    created_at: datetime
    expires_at: datetime


class SessionRepository:
    def __init__(self, pool: asyncpg.Pool):
        self.pool = pool

    @translate_unavailable
    async def create(
        self, id_hash: bytes, token_id: str, token_name: str, client: str, expires_at: float
    ) -> int:
        """Record a new session (expiry in Unix seconds); its public id."""
        new_id: int = await self.pool.fetchval(
            query("session_create"),
            id_hash,
            token_id,
            token_name,
            client,
            expires_at,
            PRUNE_PER_SIGN_IN,
        )
        return new_id

    @translate_unavailable
    async def is_active(self, id_hash: bytes, token_id: str) -> bool:
        return bool(await self.pool.fetchval(query("session_is_active"), id_hash, token_id))

    @translate_unavailable
    async def end(self, id_hash: bytes) -> bool:
        """Sign-out: whether the session still existed."""
        return await self.pool.fetchval(query("session_end"), id_hash) is not None

    @translate_unavailable
    async def live_sessions(self) -> list[SessionRow]:
        return [SessionRow(*row) for row in await self.pool.fetch(query("session_list"))]

    @translate_unavailable
    async def revoke(self, session_id: int) -> bool:
        return await self.pool.fetchval(query("session_revoke"), session_id) is not None

    @translate_unavailable
    async def revoke_all(self) -> int:
        count: int = await self.pool.fetchval(query("session_revoke_all"))
        return count

    @translate_unavailable
    async def revoke_other_tokens(self, token_ids: Sequence[str]) -> int:
        """End the sessions of tokens no longer configured (and drop expired rows)."""
        count: int = await self.pool.fetchval(query("session_revoke_other_tokens"), list(token_ids))
        return count
