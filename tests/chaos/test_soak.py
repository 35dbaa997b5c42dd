"""The chaos soak itself, briefly, in the suite: so the harness (its private PostgreSQL, daemons,
target, faults and checks) is exercised by every test run, not only by CI's 3-minute soak."""

from __future__ import annotations

import pytest

from tests.chaos.soak import Options, run_soak

SOAK_MINUTES = 20 / 60


# set-up and settle on top of the 20 s of chaos; a job repeated every lease can take a minute
@pytest.mark.timeout(300)
async def test_a_short_soak_holds_every_invariant() -> None:
    report = await run_soak(Options(SOAK_MINUTES, "inprocess", seed=3))
    assert report["checks"]["nothing_lost"]["accepted"] > 50, report
    assert sum(report["faults"].values()) >= 1, report
    assert report["checks"]["http_repeats"]["requests"] > 0, report
    assert report["violations"] == [], report["violations"]
