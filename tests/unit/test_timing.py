"""The timing engine on the real clock: periodic rounds never overlap, a failed round does not
end the job, a one-shot job runs at its instant, a wake-up brings a round forward, and stop()
or cancel() return only once no call of theirs runs (bounded, then cancelled)."""

from __future__ import annotations

import asyncio
import logging
import threading
from datetime import UTC, datetime, timedelta

import pytest

from dispatcher.runtime.timing import TimingEngine
from tests.harness import wait_until


async def test_rounds_never_overlap_and_a_failure_does_not_end_the_job(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = TimingEngine()
    running, most, rounds = [0], [0], [0]

    async def slow_and_sometimes_failing() -> None:
        running[0] += 1
        most[0] = max(most[0], running[0])
        rounds[0] += 1
        try:
            await asyncio.sleep(0.12)  # longer than the interval: the next rounds are moot
            if rounds[0] == 1:
                raise RuntimeError("database blip")
        finally:
            running[0] -= 1

    engine.every("slow", 0.02, slow_and_sometimes_failing)
    await engine.start()
    try:
        with caplog.at_level(logging.WARNING, logger="dispatcher"):
            await wait_until(lambda: engine.calls("slow") >= 3, timeout_s=10)
    finally:
        await engine.stop()
    assert most[0] == 1
    assert "slow failed (it runs again at its next time): database blip" in caplog.text


async def test_jobs_run_on_the_event_loop_thread() -> None:
    engine, threads = TimingEngine(), set()

    async def where() -> None:
        threads.add(threading.get_ident())

    engine.every("where", 0.01, where)
    await engine.start()
    try:
        await wait_until(lambda: engine.calls("where") >= 2, timeout_s=10)
    finally:
        await engine.stop()
    assert threads == {threading.get_ident()}


async def test_a_one_shot_job_runs_at_its_instant_and_run_now_brings_it_forward() -> None:
    engine, ran_at = TimingEngine(), []

    async def note() -> None:
        ran_at.append(datetime.now(UTC))

    await engine.start()
    try:
        soon = datetime.now(UTC) + timedelta(seconds=0.2)
        engine.at("soon", soon, note)
        assert engine.next_run("soon") == soon
        await wait_until(lambda: engine.calls("soon") == 1, timeout_s=10)
        assert ran_at[0] >= soon
        assert engine.next_run("soon") is None  # a one-shot job is gone once it ran

        engine.at("later", datetime.now(UTC) + timedelta(hours=1), note)
        engine.run_now("later")  # a wake-up
        await wait_until(lambda: engine.calls("later") == 1, timeout_s=10)
        engine.run_now("no-such-job")  # harmless
    finally:
        await engine.stop()


async def test_cancel_and_stop_wait_for_calls_in_flight_then_nothing_runs() -> None:
    engine = TimingEngine(stop_timeout_s=0.5)
    started, finished, cancelled = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def finishes() -> None:
        started.set()
        await asyncio.sleep(0.1)
        finished.set()

    async def hangs() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    engine.every("finishes", 0.01, finishes)
    await engine.start()
    await asyncio.wait_for(started.wait(), 10)
    await engine.cancel("finishes")
    assert finished.is_set()  # cancel returned after the call in flight ended
    calls = engine.calls("finishes")
    assert engine.next_run("finishes") is None

    finished.clear()
    engine.at("hangs", datetime.now(UTC), hangs)
    engine.at("finishes-in-stop", datetime.now(UTC), finishes)
    await wait_until(lambda: {"hangs", "finishes-in-stop"} <= set(engine._running), timeout_s=10)
    await engine.stop()
    assert finished.is_set()  # a call in flight at stop() ends on its own (not cancelled)
    await engine.stop()  # idempotent
    assert cancelled.is_set()  # past stop_timeout_s, the call was cancelled
    engine.every("after-stop", 0.01, finishes)  # ignored: nothing runs after stop
    assert engine.next_run("after-stop") is None
    assert engine.calls("finishes") == calls


async def test_stop_cuts_a_periodic_round_short_at_once_and_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Sampling or pruning in flight never holds up a drain, and leaves no error line."""
    engine = TimingEngine(stop_timeout_s=30)
    cut = asyncio.Event()

    async def long_round() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cut.set()

    engine.every("long-round", 0.01, long_round)
    await engine.start()
    await wait_until(lambda: "long-round" in engine._running, timeout_s=10)
    with caplog.at_level(logging.INFO):
        async with asyncio.timeout(5):  # far below stop_timeout_s
            await engine.stop()
    assert cut.is_set()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


async def test_a_wake_up_during_a_round_runs_one_more_round_after_it() -> None:
    """The due-scan's wake-up: one that arrives while a round runs (after it read the
    database) is not lost, and many of them make one more round, not many."""
    engine, release, rounds = TimingEngine(), asyncio.Event(), [0]

    async def scan() -> None:
        rounds[0] += 1
        if rounds[0] == 1:
            await release.wait()

    engine.every("due-scan", 3600, scan)
    await engine.start()
    try:
        engine.run_now("due-scan")
        await wait_until(lambda: rounds[0] == 1, timeout_s=10)
        for _ in range(5):
            engine.run_now("due-scan")
        release.set()
        await wait_until(lambda: engine.calls("due-scan") == 1, timeout_s=10)
        assert rounds[0] == 2
        # run_by: the next round no later than that instant; a later one does not postpone it
        soon = datetime.now(UTC) + timedelta(seconds=0.2)
        engine.run_by("due-scan", soon)
        engine.run_by("due-scan", soon + timedelta(hours=1))
        assert engine.next_run("due-scan") == soon
        await wait_until(lambda: rounds[0] == 3, timeout_s=10)
    finally:
        await engine.stop()


def test_an_interval_must_be_positive() -> None:
    engine = TimingEngine()

    async def nothing() -> None:
        return None

    with pytest.raises(ValueError, match="interval_s must be > 0"):
        engine.every("bad", 0, nothing)
