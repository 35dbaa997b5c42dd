"""Run-time queue settings on real PostgreSQL (migration 025): an override wins over the file,
survives a start with a different file, is undone by a reset, puts the global limits in force
at once for every claimer, and notifies the daemons."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from dispatcher.db.jobs import JobRepository
from dispatcher.db.queue_limits import QueueSettingsRepository
from dispatcher.model import NewJob

CAPABILITIES = ["work:1"]
FILE = {"rate_per_s": 0.001, "burst": 5, "max_inflight": 100, "windows": []}


async def start(repo: JobRepository, file: dict[str, Any]) -> QueueSettingsRepository:
    """What a daemon does at start: the registry, then the file's live settings."""
    keys = (file.get("key_rate_per_s"), file.get("key_burst"), file.get("key_max_inflight"))
    await repo.sync_registry(
        {"default": (3, 3600)},
        {"work": ("python", 1)},
        limits={"default": (file["rate_per_s"], file["burst"], file["max_inflight"])},
        key_limits={"default": keys},
    )
    store = QueueSettingsRepository(repo.pool)
    await store.record_file_settings({"default": file})
    return store


async def limits(repo: JobRepository) -> tuple[float, int, int]:
    row = await repo.pool.fetchrow(
        "SELECT rate_per_s, burst, max_inflight FROM dispatcher.queues WHERE name = 'default'"
    )
    return row["rate_per_s"], row["burst"], row["max_inflight"]


async def test_an_override_wins_over_the_file_until_reset(repo: JobRepository) -> None:
    store = await start(repo, FILE)
    row = await store.set_overrides(
        "default", {"rate_per_s": 20.0, "windows": ["daily 00:00-01:00"]}
    )
    assert row is not None
    assert row.effective["rate_per_s"] == 20.0 and row.effective["burst"] == 5
    assert row.effective["windows"] == ["daily 00:00-01:00"]
    assert await limits(repo) == (20.0, 5, 100)

    # a restart with a different file: the file's value is recorded, the override still holds
    await start(repo, {**FILE, "rate_per_s": 7.0, "max_inflight": 50})
    (stored,) = await store.all()
    assert stored.file["rate_per_s"] == 7.0 and stored.overrides["rate_per_s"] == 20.0
    assert await limits(repo) == (20.0, 5, 50)

    # null removes one override (a merge patch); reset removes them all
    row = await store.set_overrides("default", {"windows": None})
    assert row is not None and "windows" not in row.overrides and row.overrides["rate_per_s"] == 20
    row = await store.reset_overrides("default")
    assert row is not None and row.overrides == {}
    assert await limits(repo) == (7.0, 5, 50)


async def test_unknown_queue_changes_nothing(repo: JobRepository) -> None:
    store = await start(repo, FILE)
    assert await store.set_overrides("nope", {"rate_per_s": 1.0}) is None
    assert await store.reset_overrides("nope") is None
    (row,) = await store.all()
    assert row.overrides == {}


async def test_a_raised_limit_holds_for_the_next_claim(repo: JobRepository) -> None:
    # the file's bucket is spent and refills once in 1,000 s; the override lets 30 more start
    store = await start(repo, FILE)
    await repo.enqueue_many([NewJob(key=f"k{i}", handler="work", payload={}) for i in range(60)])
    jobs, *_ = await repo.claim_limited("default", 100, CAPABILITIES, "d0", 60)
    assert len(jobs) == 5
    jobs, _, wait_s, *_ = await repo.claim_limited("default", 100, CAPABILITIES, "d0", 60)
    assert jobs == [] and wait_s is not None and wait_s > 100
    await store.set_overrides("default", {"rate_per_s": 1000.0, "burst": 30})
    await asyncio.sleep(0.05)  # refills 50 tokens at the new rate, capped by the new burst
    started = 0
    for _ in range(3):
        jobs, *_ = await repo.claim_limited("default", 100, CAPABILITIES, "d0", 60)
        started += len(jobs)
    assert 30 <= started <= 55  # the burst at once, plus what the new rate refilled meanwhile


async def test_a_lowered_inflight_cap_holds_for_the_next_claim(repo: JobRepository) -> None:
    store = await start(repo, {**FILE, "rate_per_s": 1000.0, "burst": 1000})
    await repo.enqueue_many([NewJob(key=f"k{i}", handler="work", payload={}) for i in range(60)])
    jobs, *_ = await repo.claim_limited("default", 10, CAPABILITIES, "d0", 60)
    assert len(jobs) == 10
    await store.set_overrides("default", {"max_inflight": 12})
    jobs, *_ = await repo.claim_limited("default", 10, CAPABILITIES, "d0", 60)
    assert len(jobs) == 2


async def test_every_change_notifies_the_daemons(repo: JobRepository, db_url: str) -> None:
    store = await start(repo, FILE)
    heard: asyncio.Queue[str] = asyncio.Queue()
    conn = await asyncpg.connect(db_url)
    try:
        await conn.add_listener("dispatcher_wake", lambda *args: heard.put_nowait(args[-1]))
        await store.set_overrides("default", {"max_inflight": 3})
        assert await asyncio.wait_for(heard.get(), 5) == "limits"
        await store.reset_overrides("default")
        assert await asyncio.wait_for(heard.get(), 5) == "limits"
    finally:
        await conn.close()


async def test_a_restart_never_puts_the_files_limits_in_force_over_an_override(
    repo: JobRepository,
) -> None:
    # the registry's upsert at start is one statement: no moment with the file's rate in force
    store = await start(repo, FILE)
    await store.set_overrides("default", {"rate_per_s": 20.0, "burst": 4})
    await repo.sync_registry(
        {"default": (3, 3600)}, {"work": ("python", 1)}, limits={"default": (0.5, 2, 30)}
    )
    assert await limits(repo) == (20.0, 4, 30)


async def key_limits(repo: JobRepository) -> tuple[float | None, int | None, int | None]:
    row = await repo.pool.fetchrow(
        "SELECT key_rate_per_s, key_burst, key_max_inflight FROM dispatcher.queues"
        " WHERE name = 'default'"
    )
    return row["key_rate_per_s"], row["key_burst"], row["key_max_inflight"]


async def test_per_key_overrides_reach_the_key_columns_and_outlive_a_restart(
    repo: JobRepository,
) -> None:
    store = await start(repo, FILE)
    assert await key_limits(repo) == (None, None, None)
    # a key rate alone gets one second's worth of burst, as in the file (024)
    await store.set_overrides("default", {"key_rate_per_s": 2.5, "key_max_inflight": 3})
    assert await key_limits(repo) == (2.5, 3, 3)
    keyed = {**FILE, "key_rate_per_s": 9.0, "key_burst": 9, "key_max_inflight": 9}
    await start(repo, keyed)  # a restart with a file that limits keys: the override holds
    assert await key_limits(repo) == (2.5, 3, 3)
    await store.reset_overrides("default")
    assert await key_limits(repo) == (9.0, 9, 9)
    await store.set_overrides("default", {"key_max_inflight": 1})
    await start(repo, FILE)  # and a file without key limits: the override alone
    assert await key_limits(repo) == (None, None, 1)
    await store.reset_overrides("default")
    assert await key_limits(repo) == (None, None, None)


async def test_windows_written_by_hand_past_every_door_are_reported_not_a_crash(
    repo: JobRepository,
) -> None:
    from datetime import UTC, datetime

    from dispatcher.operator.queue_limits import settings_view

    store = await start(repo, FILE)
    await repo.pool.execute(
        """UPDATE dispatcher.queues SET overrides = '{"windows": ["Mon-Fry 18:00-07:00"]}'"""
    )
    (row,) = await store.all()
    view = settings_view(row, datetime.now(UTC))
    assert "day 'Fry'" in view["window_error"] and view["window_open"] is True
