"""The deliveries a concurrency key held back over RabbitMQ (claim_delivered, migration 045), on
real PostgreSQL. An idle relay sleeps until it is woken (issue 24 goal 6), so every door by
which a key gets room again must hand its held rows back to the relays by itself: the key's
next token (the row's lease runs out then, and the claim says when), one of its jobs leaving
`running` by any path, a change of its limits (each releases the rows and wakes the relays).

Whether a statement woke the relays is read without a timer, as in test_wake_gate: a plain
`NOTIFY dispatcher_wake, 'sentinel'` follows it, and what arrives before the sentinel is what
the statement sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from dispatcher.db.jobs import JobRepository
from dispatcher.db.notifications import CHANNEL
from dispatcher.db.registry import Limits
from dispatcher.db.relay import Claimed, RelayRepository
from tests.db.test_global_limits import CAPABILITIES
from tests.db.test_key_limits import setup
from tests.db.test_key_running import PATHS

NOTICE_S = 10.0


class Relays:
    """What the relays see: a listening connection that holds the wake gate, as a daemon's
    does (so dispatcher.wake sends), and the outbox rows the keys hold back."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.heard: asyncio.Queue[str] = asyncio.Queue()

    async def woken_by(self, conn: asyncpg.Connection | asyncpg.Pool, statement: str) -> bool:
        """Run `statement` (its own transaction): whether it woke the relays."""
        await self.heard_since()  # what the test's setup sent
        await conn.execute(statement)
        return "ready" in await self.heard_since()

    async def heard_since(self) -> list[str]:
        """The notices committed since the last call (or since listening)."""
        await self.conn.execute(f"NOTIFY {CHANNEL}, 'sentinel'")
        got: list[str] = []
        async with asyncio.timeout(NOTICE_S):
            while (notice := await self.heard.get()) != "sentinel":
                got.append(notice)
        return got

    async def held(self) -> int:
        """Rows a key holds back: leased by nobody (not published), naming their key."""
        return int(
            await self.conn.fetchval(
                "SELECT count(*) FROM dispatcher.outbox WHERE held_key IS NOT NULL"
                " AND leased_until > now() AND leased_by IS NULL"
            )
        )

    async def to_publish(self) -> int:
        """Rows the relays may pick now (leased_until NULL), none still naming a key."""
        return int(
            await self.conn.fetchval(
                "SELECT count(*) FROM dispatcher.outbox WHERE leased_until IS NULL"
                " AND held_key IS NULL"
            )
        )


@pytest.fixture
async def relays(db_url: str) -> AsyncIterator[Relays]:
    conn = await asyncpg.connect(db_url)
    found = Relays(conn)
    await conn.add_listener(CHANNEL, lambda *args: found.heard.put_nowait(args[-1]))
    await conn.execute("SELECT dispatcher.hold_wake_gate()")
    try:
        yield found
    finally:
        await conn.close()


async def deliver_all(repo: JobRepository, key_limits: Limits, jobs: int) -> Claimed:
    """Key "a" with `key_limits` and `jobs` ready jobs, every one delivered to one claim; their
    relay rows as the relay leaves them once published (the claim deletes those it starts)."""
    await setup(repo, key_limits, {"a": jobs})
    await repo.pool.execute("UPDATE dispatcher.intake_settings SET ready_outbox = true")
    await repo.pool.execute(
        "INSERT INTO dispatcher.outbox (job_id, queue, tenant, capability, leased_until,"
        "                               leased_by)"
        " SELECT id, queue, tenant, 'work:1', now() + interval '1 hour', 'r1'"
        "   FROM dispatcher.jobs"
    )
    rows = await repo.pool.fetch("SELECT id, attempt FROM dispatcher.jobs ORDER BY id")
    delivered = [(r["id"], r["attempt"]) for r in rows]
    return await RelayRepository(repo.pool).claim_delivered(
        "default", delivered, CAPABILITIES, "d0", 60
    )


async def test_a_delivery_held_by_the_keys_rate_comes_back_when_its_next_token_is_due(
    repo: JobRepository, relays: Relays
) -> None:
    # one token every 2 s: the held row is leased about 2 s (it was a quarter second, so it went
    # out and was refused again 8 times before the key could take it), and the claim says when
    claimed = await deliver_all(repo, (0.5, 1, None), 2)
    assert len(claimed.jobs) == 1 and claimed.key_held == 1
    [due] = claimed.release_in_s
    assert 1.5 < due <= 2.0
    lease = await relays.conn.fetchval(
        "SELECT extract(epoch FROM leased_until - now()) FROM dispatcher.outbox"
        " WHERE held_key = 'a'"
    )
    assert 1.0 < lease <= 2.0


async def test_a_delivery_held_by_the_keys_cap_is_leased_a_quarter_second_at_most(
    repo: JobRepository,
) -> None:
    claimed = await deliver_all(repo, (None, None, 1), 3)
    assert len(claimed.jobs) == 1 and claimed.key_held == 2
    assert claimed.release_in_s == (0.25,)


@pytest.mark.parametrize("path", [p for p in PATHS if p != "bulk cancel"])
async def test_every_path_out_of_running_hands_a_held_delivery_back_and_wakes_the_relays(
    repo: JobRepository, relays: Relays, path: str
) -> None:
    claimed = await deliver_all(repo, (None, None, 1), 3)
    assert len(claimed.jobs) == 1 and await relays.held() == 2
    [job] = claimed.jobs
    await relays.heard_since()
    await PATHS[path](repo, job)
    # the path's statement released one row (one slot freed) and woke the relays; what it did
    # to the job itself (made it ready again, with a row of its own) is not a held row
    assert await relays.held() == 1
    assert await relays.to_publish() >= 1
    assert "ready" in await relays.heard_since()


async def test_an_end_on_a_key_holding_nothing_back_wakes_nobody(
    repo: JobRepository, relays: Relays
) -> None:
    claimed = await deliver_all(repo, (None, None, 2), 2)
    assert len(claimed.jobs) == 2 and await relays.held() == 0
    job = claimed.jobs[0]
    await relays.heard_since()
    await repo.complete([job.id], [job.attempt], [None], "d0")
    assert "ready" not in await relays.heard_since()


@pytest.mark.parametrize(
    "change",
    [
        "UPDATE dispatcher.queues SET key_max_inflight = 5 WHERE name = 'default'",
        "INSERT INTO dispatcher.key_limits (queue, key, max_inflight) VALUES ('default', 'a', 5)",
    ],
)
async def test_a_change_of_the_keys_limits_hands_every_held_delivery_back(
    repo: JobRepository, relays: Relays, change: str
) -> None:
    await deliver_all(repo, (None, None, 1), 4)
    assert await relays.held() == 3
    assert await relays.woken_by(repo.pool, change)
    assert await relays.held() == 0 and await relays.to_publish() == 3


async def test_a_released_row_names_no_key_so_an_end_never_releases_it_twice(
    repo: JobRepository, relays: Relays
) -> None:
    # the lease ran out: release_outbox hands the row back; a relay leases it to publish; the
    # key's job ending then must not take it from that relay
    claimed = await deliver_all(repo, (None, None, 1), 2)
    await repo.pool.execute("UPDATE dispatcher.outbox SET leased_until = now() - interval '1 s'")
    relay = RelayRepository(repo.pool)
    await relay.release_outbox(100)
    leased = await relay.lease_outbox({"default": 10}, {"default": 1}, 10, "r1")
    assert [r.job_id for r in leased] == [claimed.refused.pop()]
    [job] = claimed.jobs
    await repo.complete([job.id], [job.attempt], [None], "d0")
    assert await relays.to_publish() == 0
