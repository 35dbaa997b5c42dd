"""Every benchmark answers `--help` with its usage and exits, and refuses an argument it does not
know, without starting a run (bench_idle, bench_pooling, bench_outcomes and bench_timing once
started minutes of measuring on `--help`)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from tests.harness.commands import run_program

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "tests" / "bench"
# programs the benchmarks run, not benchmarks: the daemon's own command line with candidate
# patches (its --help is the daemon's), and the procrastinate peer, which runs in the throw-away
# environment the peer benchmark installs procrastinate into
HELPERS = {"tests.bench.experiment", "tests.bench.peers.procrastinate_peer"}
MODULES = sorted(
    module
    for path in [*BENCH.glob("*.py"), *BENCH.glob("peers/*.py")]
    if 'if __name__ == "__main__":' in path.read_text()
    and (module := ".".join(path.relative_to(ROOT).with_suffix("").parts)) not in HELPERS
)
DEADLINE_S = 60.0  # for each, four at a time: an import takes about a second


async def answer(module: str, argument: str, slots: asyncio.Semaphore) -> tuple[int, str]:
    """The module run with one argument: its exit code and output (killed past the deadline,
    which a benchmark that ignored the argument and started measuring would reach)."""
    argv = [sys.executable, "-m", module, argument]
    async with slots:
        try:
            done = await run_program(
                argv, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout_s=DEADLINE_S
            )
        except TimeoutError:
            return -1, f"{module} {argument}: still running after {DEADLINE_S:.0f} s"
    return done.code, done.stdout + done.stderr


async def answers(argument: str) -> dict[str, tuple[int, str]]:
    slots = asyncio.Semaphore(4)
    results = await asyncio.gather(*(answer(m, argument, slots) for m in MODULES))
    return dict(zip(MODULES, results, strict=True))


def test_every_benchmark_is_found() -> None:
    assert "tests.bench.bench_idle" in MODULES and "tests.bench.peers.run" in MODULES
    assert len(MODULES) >= 30, MODULES


@pytest.mark.parametrize(
    ("argument", "code", "says"),
    [("--help", 0, "usage:"), ("--no-such-option", 2, "error:")],
)
def test_every_benchmark_answers_without_running(argument: str, code: int, says: str) -> None:
    results = asyncio.run(answers(argument))
    wrong = {m: out[-300:] for m, (rc, out) in results.items() if rc != code or says not in out}
    assert not wrong, wrong
