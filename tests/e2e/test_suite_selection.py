"""The test selection a user gets (tests/suite.py, docs/running-tests.md), by running pytest as
they would: `pytest` collects the quick layers only, `--full` every layer, a named path runs
whatever its layer, and the broker's tests skip saying how to opt in."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

from pytest import mark

from tests.suite import RUN_ORDER

ROOT = Path(__file__).resolve().parents[2]


def pytest(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCHER_TESTS")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=240,
    )


def layers_in_order(collected: str) -> list[str]:
    """Each layer once, in the order its first test was collected."""
    named = [line.split("/")[1] for line in collected.splitlines() if line.startswith("tests/")]
    return list(dict.fromkeys(named))


def layers(collected: str) -> set[str]:
    return set(layers_in_order(collected))


# three collections of the whole suite (20 s each on a quiet slow machine, more beside CI's
# other workers): more than the suite's 120 s default
@mark.timeout(600)
def test_the_default_is_the_quick_layers_and_full_takes_every_layer() -> None:
    quick = pytest("--co", "-q")
    assert quick.returncode == 0, quick.stdout[-2000:]
    assert layers(quick.stdout) == {"unit", "db", "service"}
    # the header says how (printed whatever the selection: a small one is enough)
    assert "The full suite: pytest --full" in pytest("--co", "tests/unit/test_backoff.py").stdout
    full = pytest("--co", "-q", DISPATCHER_TESTS="full")
    assert full.returncode == 0, full.stdout[-2000:]
    assert {"unit", "db", "service", "e2e", "faults", "badinput", "console"} <= layers(full.stdout)
    # the long layers first, each layer's files together (xdist's workers get whole files in
    # this order, tests/suite.py)
    order = layers_in_order(full.stdout)
    assert order == sorted(order, key=RUN_ORDER.index), order
    named = [line.split("/")[1] for line in full.stdout.splitlines() if line.startswith("tests/")]
    assert [layer for layer, _ in itertools.groupby(named)] == order


def test_a_named_path_runs_whatever_its_layer() -> None:
    named = pytest("--co", "-q", "tests/e2e/test_cli.py")
    assert named.returncode == 0 and layers(named.stdout) == {"e2e"}, named.stdout[-2000:]


def test_broker_tests_skip_saying_how_to_opt_in() -> None:
    result = pytest("-q", "-rs", "tests/e2e/test_rabbitmq.py", "-k", "degraded")
    assert result.returncode == 0, result.stdout[-2000:]
    assert "rabbitmq tests opt in" in result.stdout and "--with rabbitmq" in result.stdout
    listed = pytest("--co", "-q", "--with", "rabbitmq", "tests/e2e/test_rabbitmq.py")
    assert "test_a_daemon_with_its_broker_down_starts_and_says_it_is_degraded" in listed.stdout
