"""The work poll (dispatcher/engine/work_poll.py), in process, real PostgreSQL: idle claim loops
claim nothing while the one poll looks for all of them; with `database.wakeups = "poll"` the
daemon holds no LISTEN connection, no session settings and no liveness lock, and work another
process enqueues still starts."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from dispatcher.engine.work_poll import WorkPoller
from dispatcher.relay.transport import InProcessTransport
from tests.harness import make_settings, running_daemon, stored_job, wait_until

STARTED: list[str] = []
QUEUES = {f"q{i:02d}": {"max_inflight": 5} for i in range(20)}  # and "default"
HANDLERS = {"record": {"kind": "python", "function": f"{__name__}:record"}}


async def record(job: Any, ctx: Any) -> None:
    STARTED.append(job.key)


class Counts:
    """Claims and poll rounds, counted around the real methods."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.claims = 0
        self.polls = 0
        receive, poll = InProcessTransport.receive, WorkPoller.run_once

        async def counted_receive(transport: Any, *args: Any) -> Any:
            self.claims += 1
            return await receive(transport, *args)

        async def counted_poll(poller: Any) -> Any:
            self.polls += 1
            return await poll(poller)

        monkeypatch.setattr(InProcessTransport, "receive", counted_receive)
        monkeypatch.setattr(WorkPoller, "run_once", counted_poll)


async def test_idle_claim_loops_claim_nothing_while_the_poll_looks(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """20 queues, nothing due: 10 polls at 0.1 s and not one claim between them (each loop
    claimed every scan interval before: 200 claims in the same time)."""
    counts = Counts(monkeypatch)
    settings = make_settings(db_url, scan_interval_s=0.1, queues=QUEUES, handlers=HANDLERS)
    async with running_daemon(settings):
        await wait_until(lambda: counts.claims >= len(QUEUES) + 1, what="every loop's first claim")
        claims, polls = counts.claims, counts.polls
        await wait_until(lambda: counts.polls >= polls + 10, what="10 polls")
        assert counts.claims == claims


async def test_poll_mode_keeps_no_session_and_still_starts_work_from_elsewhere(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    STARTED.clear()
    settings = make_settings(
        db_url,
        scan_interval_s=3600,  # the poll alone finds the SQL door's jobs
        queues=QUEUES,
        handlers=HANDLERS,
        database={"wakeups": "poll", "poll_interval_s": 0.05},
    )
    conn = await asyncpg.connect(db_url)
    try:
        async with running_daemon(settings) as running:
            names = await conn.fetch(
                "SELECT application_name FROM pg_stat_activity WHERE datname = current_database()"
            )
            held = {r["application_name"] for r in names}
            assert "dispatcher:wake-listener" not in held
            assert "dispatcher:liveness" not in held
            assert running.daemon._liveness is None
            async with running.daemon._repo.pool.acquire() as pooled:  # type: ignore[union-attr]
                assert await pooled.fetchval("SHOW plan_cache_mode") == "auto"  # not sent
            await conn.execute("SELECT dispatcher.enqueue('elsewhere', 'record', queue => 'q07')")
            await conn.execute(
                "SELECT dispatcher.enqueue('soon', 'record', due_at => now() + interval '0.3 s',"
                " queue => 'q11')"
            )

            async def both_succeeded() -> bool:
                rows = [await stored_job(conn, key=k) for k in ("elsewhere", "soon")]
                return all(r is not None and r["state"] == "succeeded" for r in rows)

            await wait_until(both_succeeded, timeout_s=20, what="the SQL door's jobs to succeed")
    finally:
        await conn.close()
    assert sorted(STARTED) == ["elsewhere", "soon"]


async def test_a_notice_among_many_queues_claims_only_where_work_is(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A NOTIFY names no queue: with 20 queues it runs the poll, which wakes q07 alone (it was
    20 claims per notice, and the due job waited behind them)."""
    STARTED.clear()
    counts = Counts(monkeypatch)
    settings = make_settings(db_url, scan_interval_s=3600, queues=QUEUES, handlers=HANDLERS)
    conn = await asyncpg.connect(db_url)
    try:
        async with running_daemon(settings):
            await wait_until(
                lambda: counts.claims >= len(QUEUES) + 1, what="every loop's first claim"
            )
            claims = counts.claims
            await conn.execute("SELECT dispatcher.enqueue('noticed', 'record', queue => 'q07')")
            await wait_until(lambda: STARTED == ["noticed"], what="the job to start")
            assert counts.claims - claims <= 2  # q07's claim, and one more it may look again
    finally:
        await conn.close()
