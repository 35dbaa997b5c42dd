"""The test harness itself (tests/harness/, docs/testing.md): the shared `daemon` fixture runs a
real child process on the test's database, a log event is awaited as it is written, a change of
the jobs table wakes a waiter through its NOTIFY, a target wakes one as requests arrive, and a
wait that times out says what it waited for and what it saw. The Python blocks of
docs/testing.md are tests of this module, word for word."""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import sys
import time

import aiohttp
import asyncpg
import pytest

from tests.docs_blocks import ROOT, blocks
from tests.harness import (
    DaemonHandle,
    DaemonProcess,
    Target,
    job_changes,
    running_daemon,
    serve_target,
)

REPORT = {
    "DISPATCHER_HANDLERS__REPORT__KIND": "python",
    "DISPATCHER_HANDLERS__REPORT__FUNCTION": "tests.badinput.handlers:noop",
}


@pytest.fixture
def daemon_env() -> dict[str, str]:
    """This module's daemon: the shared fixture with a python handler `report`."""
    return REPORT


async def test_a_job_through_a_daemon_process(daemon: DaemonHandle, db_url: str) -> None:
    async with job_changes(db_url) as jobs:
        job = await daemon.post_job("report-1", {"handler": "report", "payload": {"n": 1}})
        await jobs.until_states({"succeeded": 1})
    assert (await daemon.get_job(job["id"]))["state"] == "succeeded"
    ready = await daemon.log.wait_for("dispatcher ready")
    assert ready["level"] == "info"


async def test_a_signal_and_the_log_event_it_causes(daemon: DaemonProcess) -> None:
    daemon.signal(signal.SIGTERM)
    await daemon.log.wait_for("stop signal: draining")
    assert await daemon.wait() == 0


async def test_the_daemon_fixture_is_a_child_process(daemon: DaemonHandle) -> None:
    assert isinstance(daemon, DaemonProcess) and daemon.proc is not None
    assert daemon.proc.pid != os.getpid()


async def test_an_in_process_daemon_from_the_same_environment(db_url: str) -> None:
    env = {"DISPATCHER_DATABASE_URL": db_url, **REPORT}
    async with running_daemon(env) as running:
        assert running.daemon.ready.is_set()  # the object, where a test needs it
        event = await running.log.wait_for("dispatcher ready")
        assert event["logger"].startswith("dispatcher")
        job = await running.post_job("in-process-1", {"handler": "report"})
        assert job["state"] in ("ready", "running", "succeeded")


async def test_a_log_wait_that_times_out_says_what_it_waited_for(daemon: DaemonHandle) -> None:
    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"'never logged'.*the log ends") as failure:
        await daemon.log.wait_for("never logged", timeout_s=0.3)
    assert time.monotonic() - started < 5
    assert "dispatcher ready" in str(failure.value)


async def test_a_change_of_the_jobs_wakes_the_waiter_without_a_timer(db_url: str) -> None:
    conn = await asyncpg.connect(db_url)
    try:
        async with job_changes(db_url) as jobs:
            waiter = asyncio.create_task(jobs.until_states({"scheduled": 1}, timeout_s=10))
            await asyncio.sleep(0)  # the waiter checks once, sees no job, and waits
            assert not waiter.done()
            await conn.execute(
                "SELECT dispatcher.enqueue('k-1', 'http', '{}'::jsonb, now() + interval '1 h',"
                ' target => \'{"url": "https://hooks.example.com/a"}\')'
            )
            await asyncio.wait_for(waiter, 5)
            with pytest.raises(AssertionError, match=r"job states.*last seen \{'scheduled': 1\}"):
                await jobs.until_states({"succeeded": 1}, timeout_s=0.2)
    finally:
        await conn.close()


async def test_a_target_wakes_a_waiter_as_requests_arrive() -> None:
    async with serve_target(Target(delay_s=0.5)) as target:
        waiter = asyncio.create_task(target.wait_for(lambda t: t.inflight == 2, timeout_s=10))
        async with aiohttp.ClientSession() as s:
            posts = [asyncio.create_task(s.post(target.url, data=b"{}")) for _ in range(2)]
            await asyncio.wait_for(waiter, 5)
            for answer in await asyncio.gather(*posts):
                answer.release()
        assert target.max_inflight == 2


def test_the_python_blocks_of_the_testing_page_are_tests_here() -> None:
    source = inspect.getsource(sys.modules[__name__])
    examples = [b for b in blocks(ROOT / "docs/testing.md") if b.language == "python"]
    assert examples, "docs/testing.md shows how to write a test"
    for block in examples:
        assert block.text.strip() in source, f"{block.where} is not a test of this module"
