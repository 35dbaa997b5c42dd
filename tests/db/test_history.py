"""The per-minute history (migration 038) against real PostgreSQL: flushes from several daemons
add up (counts and latency buckets; the oldest-ready age keeps the largest), concurrent flushes
of many queues never deadlock, reads sum minutes into aligned steps, and the pruner deletes
exactly the minutes past `retention.history_s`, in bounded batches."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from dispatcher.config.settings import RetentionSettings
from dispatcher.db.history import ALL_QUEUES, Counts, HistoryStore
from dispatcher.db.jobs import JobRepository
from dispatcher.db.queries import query
from dispatcher.engine.history import HistoryRecorder, Reading, with_total
from dispatcher.engine.pruning import Pruner
from dispatcher.operator.history import RANGES, read_history, start_of

MINUTE = datetime(2026, 12, 1, 12, 7, tzinfo=UTC)


async def rows(pool: asyncpg.Pool) -> dict[tuple[str, datetime], asyncpg.Record]:
    found = await pool.fetch("SELECT * FROM dispatcher.history")
    return {(r["queue"], r["minute"]): r for r in found}


async def test_three_daemons_flushes_add_up(pool: asyncpg.Pool) -> None:
    daemons = [HistoryStore(pool) for _ in range(3)]
    at = MINUTE + timedelta(seconds=17)  # any second of the minute lands on the minute
    for i, store in enumerate(daemons):
        await store.add(
            with_total(
                {
                    "mail": Counts(10 + i, 9, 1, i, (5, 4, 1), oldest_ready_s=2.0 + i),
                    "sms": Counts(3, 3, 0, 0, (0, 3)),
                }
            ),
            at,
        )
    found = await rows(pool)
    mail, sms, total = (found[(q, MINUTE)] for q in ("mail", "sms", ALL_QUEUES))
    assert (mail["started"], mail["succeeded"], mail["retried"], mail["dead"]) == (33, 27, 3, 3)
    assert mail["latency"] == [15, 12, 3] and mail["oldest_ready_s"] == 4.0
    assert sms["latency"] == [0, 9] and sms["oldest_ready_s"] is None
    assert (total["started"], total["latency"], total["oldest_ready_s"]) == (42, [15, 21, 3], 4.0)


async def test_concurrent_flushes_of_many_queues_never_deadlock(pool: asyncpg.Pool) -> None:
    queues = [f"q{i:02d}" for i in range(20)]
    rng = random.Random(7)

    async def daemon() -> None:
        store = HistoryStore(pool)
        for _ in range(15):
            order = rng.sample(queues, len(queues))  # the statement sorts them: any order works
            await store.add(with_total({q: Counts(1, 1) for q in order}), MINUTE)

    await asyncio.wait_for(asyncio.gather(*(daemon() for _ in range(6))), 60)
    found = await rows(pool)
    assert {found[(q, MINUTE)]["started"] for q in queues} == {90}
    assert found[(ALL_QUEUES, MINUTE)]["started"] == 90 * len(queues)


async def test_empty_counts_write_nothing(pool: asyncpg.Pool) -> None:
    await HistoryStore(pool).add({"mail": Counts()}, MINUTE)
    assert await rows(pool) == {}


async def test_reads_sum_minutes_into_aligned_steps(pool: asyncpg.Pool) -> None:
    store = HistoryStore(pool)
    now = datetime(2026, 12, 1, 12, 7, 30, tzinfo=UTC)
    for minutes_ago, started, latency in ((0, 5, (0, 5)), (1, 7, (7,)), (20, 100, (0, 0, 100))):
        await store.add(
            {"mail": Counts(started, started, latency=latency)},
            now - timedelta(minutes=minutes_ago),
        )
    short = await read_history(store, "mail", RANGES["15m"], now)
    assert len(short["points"]) == 15 and short["step_s"] == 60
    assert [p["started"] for p in short["points"][-2:]] == [7, 5]
    assert short["points"][-1]["at"] == "2026-12-01T12:07:00Z"
    assert sum(p["started"] for p in short["points"]) == 12  # 20 minutes ago is out of range
    assert short["points"][-1]["p50_ms"] == 2.5 and short["points"][-2]["p95_ms"] == 1.0
    assert short["points"][0]["p50_ms"] is None
    day = await read_history(store, "mail", RANGES["24h"], now)
    assert len(day["points"]) == 96 and day["points"][-1]["at"] == "2026-12-01T12:00:00Z"
    assert day["points"][-1]["started"] == 12 and day["points"][-2]["started"] == 100
    assert day["points"][-1]["p95_ms"] == 2.5  # 7 at 1 ms and 5 at 2.5 ms: the 95th is 2.5
    week = await read_history(store, "mail", RANGES["7d"], now)
    assert len(week["points"]) == 84
    assert [p["started"] for p in week["points"][-2:]] == [100, 12]  # 11:47 is in 10:00-12:00
    assert start_of(RANGES["7d"], now) == datetime(2026, 11, 24, 14, tzinfo=UTC)
    assert (await read_history(store, "sms", RANGES["15m"], now))["points"][-1]["started"] == 0


async def test_the_recent_starts_per_second(pool: asyncpg.Pool) -> None:
    store = HistoryStore(pool)
    await store.add(with_total({"mail": Counts(90), "sms": Counts(0, 3)}))
    rates = await store.recent_starts_per_s()
    assert set(rates) == {"mail", "sms"} and rates["sms"] == 0
    assert 90 / 120 <= rates["mail"] <= 90 / 60


async def test_pruning_deletes_exactly_the_expired_minutes(pool: asyncpg.Pool) -> None:
    await pool.execute(
        """INSERT INTO dispatcher.history (queue, minute, started)
           SELECT q, date_trunc('minute', now()) - make_interval(mins => g), 1
             FROM generate_series(0, 3 * 60) g, unnest(ARRAY['a', 'b', '*']) q"""
    )
    settings = RetentionSettings(history_s=3600, batch=50)
    pruned = await Pruner(JobRepository(pool), settings).run_once()
    # minutes that ended more than an hour ago: those that began 61..180 minutes before this
    # one (the one 60 before ended less than an hour ago), three queues each
    assert pruned["history"] == 3 * (180 - 61 + 1)
    left = await pool.fetchval(
        "SELECT max(date_trunc('minute', now()) - minute) FROM dispatcher.history"
    )
    assert left == timedelta(minutes=60)


def test_the_retention_is_validated() -> None:
    with pytest.raises(ValueError, match="history_s"):
        RetentionSettings(history_s=60)
    assert RetentionSettings().history_s == 7 * 86400


async def test_the_recorder_adds_differences_and_flushes_at_stop(pool: asyncpg.Pool) -> None:
    readings = {"mail": Reading(started=100, succeeded=90, buckets=[50, 100])}  # before start
    ages = {"mail": 3.5}
    recorder = HistoryRecorder(
        HistoryStore(pool),
        lambda: dict(ages),
        read=lambda: {
            q: Reading(r.started, r.succeeded, r.retried, r.dead, list(r.buckets))
            for q, r in readings.items()
        },
    )
    await recorder.start()
    readings["mail"] = Reading(started=110, succeeded=97, retried=2, dead=1, buckets=[58, 110])
    await recorder.run_once()
    readings["mail"] = Reading(started=111, succeeded=98, retried=2, dead=1, buckets=[58, 111])
    ages.clear()
    await recorder.stop()  # the last flush
    total = await pool.fetchrow(
        "SELECT sum(started) s, sum(succeeded) ok, sum(retried) r, sum(dead) d, "
        "max(oldest_ready_s) age FROM dispatcher.history WHERE queue = 'mail'"
    )
    assert tuple(total) == (11, 8, 2, 1, 3.5)
    latency = await pool.fetch("SELECT latency FROM dispatcher.history WHERE queue = '*'")
    summed = [sum(x) for x in zip(*(r["latency"] + [0] * 2 for r in latency), strict=False)]
    assert summed[:2] == [8, 3]


async def test_reads_and_pruning_use_the_indexes(pool: asyncpg.Pool) -> None:
    """A week of minutes of 20 queues and '*' (211,680 rows): a 7-day read of one queue is a
    primary-key range scan, the overview's recent starts and the pruner walk the minute index;
    none reads the whole table."""
    await pool.execute(
        """INSERT INTO dispatcher.history (queue, minute, started, latency)
           SELECT q, date_trunc('minute', now()) - make_interval(mins => g), 1, '{1, 2, 3}'
             FROM generate_series(0, 7 * 1440 - 1) g,
                  unnest(array_append(ARRAY(SELECT 'q' || i FROM generate_series(1, 20) i),
                                      '*')) q"""
    )
    await pool.execute("ANALYZE dispatcher.history")
    now = datetime.now(UTC)
    statements = {
        "history_read": (ALL_QUEUES, now - timedelta(days=7), now, 7200),
        "history_recent_starts": (),
        "prune_history": (86400, 1000),
    }
    for name, args in statements.items():
        async with pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(f"EXPLAIN {query(name)}", *args)
        text = "\n".join(r[0] for r in rows)
        assert "Seq Scan on history" not in text, f"{name}:\n{text}"
        assert "Index" in text, f"{name}:\n{text}"
