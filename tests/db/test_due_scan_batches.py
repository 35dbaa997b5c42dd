"""The due-scan moves a burst in growing batches (engine/due_scan.py): a small first one, so
the workers can start while it moves the rest, and every due job in the end."""

from __future__ import annotations

import asyncpg

from dispatcher.db.jobs import DueMoved, JobRepository
from dispatcher.engine.due_scan import DueScanner
from dispatcher.runtime.timing import TimingEngine
from tests.harness import enqueue_noop_jobs

BURST = 700


class RecordingRepository(JobRepository):
    """The real repository, remembering each scan statement's batch and what it moved."""

    def __init__(self, pool: asyncpg.Pool):
        super().__init__(pool)
        self.batches: list[tuple[int, int]] = []

    async def scan_due(self, batch: int, ahead_s: float = 0.0) -> DueMoved:
        done = await super().scan_due(batch, ahead_s)
        self.batches.append((batch, done.moved))
        return done


async def test_a_burst_moves_in_growing_batches_each_waking_the_workers(
    pool: asyncpg.Pool,
) -> None:
    await pool.execute("INSERT INTO dispatcher.handlers (name, kind) VALUES ('noop', 'python')")
    await enqueue_noop_jobs(pool, "burst", BURST, due="now() + interval '1 hour'")
    # due now by the database's clock, without waiting for it
    await pool.execute("UPDATE dispatcher.job_state SET due_at = now() - interval '1 second'")
    repo = RecordingRepository(pool)
    wakes: list[int] = []
    scanner = DueScanner(
        repo, TimingEngine(), batch=2000, interval_s=60, on_ready=lambda: wakes.append(1)
    )

    assert await scanner.run_once() == BURST
    assert repo.batches == [(125, 125), (500, 500), (2000, 75)]
    assert len(wakes) == 3  # the workers heard after each batch that moved jobs
    ready = "SELECT count(*) FROM dispatcher.job_state WHERE state = 'ready'"
    assert await pool.fetchval(ready) == BURST
