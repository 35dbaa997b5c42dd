"""Which tests a run takes (docs/running-tests.md): the quick default, the full suite, the opt-ins.

- `pytest` alone runs the quick layers, tests/unit, tests/db and tests/service: the logic, every
  query on real PostgreSQL, and the components driven through `run_once()`.
- `pytest --full` (or `DISPATCHER_TESTS=full`) runs every directory as well: e2e (the daemon as a
  process), faults, badinput, console. CI (.ci/run) runs this, on three workers (-n 3).
- Tests that need more than PostgreSQL run only when asked, and say how when skipped: marker
  `rabbitmq` (a broker on 127.0.0.1:5672) and marker `container` (podman, which the container
  test installs and builds an image with). `--full` asks for both; `--with rabbitmq` or
  `--with container` (or `DISPATCHER_TESTS_WITH=rabbitmq,container`) asks for one.
- A path named on the command line always runs: `pytest tests/e2e/test_cli.py` needs no switch.

conftest.py imports these hooks, so they apply to every run under tests/.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
QUICK_LAYERS = frozenset({"unit", "db", "service"})
# The order the layers run in, longest files first: pytest-xdist hands out whole files in
# collection order (--dist loadfile), so the many short files of the last layers fill in while
# the other worker finishes a long one, instead of one worker running e2e's last long file alone
# at the end (CI's wall time, .ci/run). A layer not named here runs last.
RUN_ORDER = ("e2e", "console", "faults", "chaos", "badinput", "service", "db", "unit")
OPT_IN = {
    "rabbitmq": "needs a RabbitMQ broker on 127.0.0.1:5672 (guest/guest)",
    "container": "builds and runs the container image with podman (installs podman if missing)",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("dispatcher", "dispatcher test selection (docs/running-tests.md)")
    group.addoption(
        "--full",
        action="store_true",
        default=False,
        help="every layer (e2e, faults, badinput, console) and the rabbitmq and container "
        "tests; also DISPATCHER_TESTS=full. Without it: unit, db and service only",
    )
    group.addoption(
        "--with",
        dest="opt_in",
        action="append",
        default=[],
        choices=sorted(OPT_IN),
        help="also run the tests with this marker (repeatable); also "
        "DISPATCHER_TESTS_WITH=rabbitmq,container",
    )


def is_full(config: pytest.Config) -> bool:
    return bool(config.getoption("full")) or os.environ.get("DISPATCHER_TESTS") == "full"


def opted_in(config: pytest.Config) -> set[str]:
    if is_full(config):
        return set(OPT_IN)
    from_env = {m.strip() for m in os.environ.get("DISPATCHER_TESTS_WITH", "").split(",")}
    return (set(config.getoption("opt_in")) | from_env) & set(OPT_IN)


def named_layers(config: pytest.Config) -> set[str]:
    """The layers (tests/<layer>/...) a command-line path points into or below."""
    named = set()
    for arg in config.args:
        path = Path(arg.split("::", 1)[0]).resolve()
        try:
            parts = path.relative_to(TESTS).parts
        except ValueError:
            continue
        if parts:
            named.add(parts[0])
    return named


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Leave out the slow layers in a quick run, unless a path names them."""
    if is_full(config):
        return None
    try:
        parts = collection_path.resolve().relative_to(TESTS).parts
    except ValueError:
        return None
    if not parts or not (TESTS / parts[0]).is_dir() or parts[0] in QUICK_LAYERS:
        return None
    if parts[0] in ("bench", "__pycache__"):
        return None  # pyproject's norecursedirs decides about these
    return True if parts[0] not in named_layers(config) else None


def layer_rank(item: pytest.Item) -> int:
    try:
        layer = item.path.resolve().relative_to(TESTS).parts[0]
    except (ValueError, IndexError):
        return len(RUN_ORDER)
    return RUN_ORDER.index(layer) if layer in RUN_ORDER else len(RUN_ORDER)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=layer_rank)  # stable: a file's tests stay together and in their order
    wanted = opted_in(config)
    for item in items:
        for marker, need in OPT_IN.items():
            if marker not in wanted and item.get_closest_marker(marker) is not None:
                item.add_marker(
                    pytest.mark.skip(
                        reason=f"{marker} tests opt in ({need}): pytest --with {marker}, or --full"
                    )
                )


def pytest_report_header(config: pytest.Config) -> str:
    if is_full(config):
        return "dispatcher tests: the full suite (--full)"
    extra = ", ".join(sorted(opted_in(config))) or "none"
    return (
        "dispatcher tests: quick run (unit, db, service; paths named on the command line); "
        f"opted in: {extra}. The full suite: pytest --full (docs/running-tests.md)"
    )
