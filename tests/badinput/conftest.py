"""The bad-input suite's live daemon: the shared `module_daemon` (a real child process on the
module's own database, tests/harness/fixtures.py), configured here so hostile clients of one
module hit one long-lived server."""

from __future__ import annotations

from pathlib import Path

import pytest

BODY_LIMIT_BYTES = 8192
# The environment of the suite's live daemon, but its database.
LIVE_ENV = {
    "DISPATCHER_BODY_LIMIT_BYTES": str(BODY_LIMIT_BYTES),
    "DISPATCHER_HANDLERS__REPORT__KIND": "python",
    "DISPATCHER_HANDLERS__REPORT__FUNCTION": "tests.badinput.handlers:noop",
    # one schedule, "nightly", for the schedule routes (SCHEDULE in test_schemathesis)
    "DISPATCHER_CONFIG": str(Path(__file__).with_name("schedules.toml")),
    # accepted jobs must wait, not run: these tests are about the front door
    "DISPATCHER_QUEUES__DEFAULT__RATE_PER_S": "0.001",
    "DISPATCHER_QUEUES__DEFAULT__BURST": "1",
}


def live_env(db_url: str) -> dict[str, str]:
    """The environment of the suite's live daemon on `db_url`."""
    return {"DISPATCHER_DATABASE_URL": db_url, **LIVE_ENV}


@pytest.fixture(scope="module")
def module_daemon_env() -> dict[str, str]:
    return LIVE_ENV
