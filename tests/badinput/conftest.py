"""Fixtures of the bad-input suite: a live daemon (a real child process) on its own database,
shared by the tests of one module so hostile clients hit one long-lived server."""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.conftest import database_name, scratch_database
from tests.harness import DaemonProcess

BODY_LIMIT_BYTES = 8192
_counter = itertools.count()


@pytest.fixture(scope="module")
async def module_db_url(server_url: str, template_url: str) -> AsyncIterator[str]:
    name = f"dispatcher_bad{os.getpid()}_{next(_counter)}"
    async with scratch_database(server_url, name, database_name(template_url)) as url:
        yield url


def live_env(db_url: str) -> dict[str, str]:
    """The environment of the suite's live daemon."""
    return {
        "DISPATCHER_DATABASE_URL": db_url,
        "DISPATCHER_BODY_LIMIT_BYTES": str(BODY_LIMIT_BYTES),
        "DISPATCHER_HANDLERS__REPORT__KIND": "python",
        "DISPATCHER_HANDLERS__REPORT__FUNCTION": "tests.badinput.handlers:noop",
        # one schedule, "nightly", for the schedule routes (SCHEDULE in test_schemathesis)
        "DISPATCHER_CONFIG": str(Path(__file__).with_name("schedules.toml")),
        # accepted jobs must wait, not run: these tests are about the front door
        "DISPATCHER_QUEUES__DEFAULT__RATE_PER_S": "0.001",
        "DISPATCHER_QUEUES__DEFAULT__BURST": "1",
    }


@pytest.fixture(scope="module")
async def live_daemon(module_db_url: str) -> AsyncIterator[DaemonProcess]:
    daemon = DaemonProcess(live_env(module_db_url))
    try:
        yield await daemon.start()
    finally:
        if daemon.proc is not None and daemon.proc.returncode is None:
            daemon.proc.kill()
            await daemon.proc.wait()
