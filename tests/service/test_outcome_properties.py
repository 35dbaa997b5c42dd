"""Property tests of invariant 10 (issue 20, Build 1): whatever a handler returns or raises and
whatever a target answers, the attempt ends its own job, terminal, with the right reason, and
the jobs written in the same batch are not affected.

The executor and the completer drive real effects (python handlers, HTTP to a loopback target)
against the real database, one claim per example: a few plain jobs and a few generated
outcomes, run together so their completions share a write. The stored form of each outcome is
the one db/outcomes.py documents (checked by reading it back), and a plain job's result is
stored exactly as returned."""

from __future__ import annotations

import asyncio
import datetime
import gzip
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import asyncpg
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from dispatcher.config.settings import HandlerSettings, QueueSettings, Settings
from dispatcher.core import jsoncodec
from dispatcher.db.jobs import JobRepository
from dispatcher.db.outcomes import ERROR_CHARS, storable_result, storable_text
from dispatcher.effects.base import Effect
from dispatcher.effects.http import HttpEffect
from dispatcher.effects.python import PythonEffect
from dispatcher.engine.completer import Completer
from dispatcher.engine.executor import Executor, describe
from dispatcher.errors import Reject, RetryLater
from dispatcher.model import Job, NewJob
from tests.harness import free_port

# the registry a daemon writes at start (the shared `registry` fixture registers it)
pytestmark = pytest.mark.registry(
    {"default": (1, 3600)},
    {"give": ("python", 1), "give_tx": ("python", 1), "http": ("http", 1)},
)

OWNER = "host:1:outcomes"
PLAIN_JOBS = 3
PROPERTY_SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# what each generated job's handler does: keyed by job key, filled per example
OUTCOMES: dict[str, Any] = {}


class Raises:
    """A handler outcome that raises `exc` instead of returning."""

    def __init__(self, exc: BaseException):
        self.exc = exc

    def __repr__(self) -> str:
        return f"Raises({type(self.exc).__name__})"


class Opaque:
    """An object no JSON encoder knows."""


class BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


class NulRepr:
    def __repr__(self) -> str:
        return "nul\x00repr\ud800"


class BadText(Exception):
    """An exception whose text cannot even be made."""

    def __str__(self) -> str:
        raise RuntimeError("no text")


async def give(job: Job, ctx: Any) -> Any:
    """The handler of every python job: the outcome the example chose for this job's key."""
    outcome = OUTCOMES[job.key]
    if isinstance(outcome, Raises):
        raise outcome.exc
    return outcome


def cyclic_list() -> list[Any]:
    value: list[Any] = [1]
    value.append(value)
    return value


def cyclic_dict() -> dict[str, Any]:
    value: dict[str, Any] = {"a": 1}
    value["self"] = {"again": value}
    return value


def nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


any_text = st.text(st.characters(exclude_categories=()), max_size=30)  # NUL and surrogates too
numbers = (
    st.integers()
    # around Python's int-to-text limit (4,300 digits) and far past it; made by `map`, as
    # hypothesis cannot even print such an int in a strategy's description
    | st.integers(min_value=4290, max_value=4310).map(lambda digits: 10 ** (digits - 1))
    | st.sampled_from([5000, -6000, 64, -63]).map(
        lambda e: (10 if abs(e) > 99 else 2) ** abs(e) * (1 if e > 0 else -1)
    )
    | st.floats()
)
leaves = (
    st.none()
    | st.booleans()
    | numbers
    | any_text
    | st.binary(max_size=40)
    | st.frozensets(st.integers(), max_size=3).map(set)
    | st.builds(Opaque)
    | st.builds(BadRepr)
    | st.builds(NulRepr)
    | st.just(datetime.datetime(2031, 5, 31, 2, 0, tzinfo=datetime.UTC))
    | st.just(Decimal("1.5"))
    | st.just(complex(1, 2))
)
keys = any_text | st.integers() | st.floats() | st.none() | st.tuples(st.integers())
structures = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(keys, inner, max_size=4)  # type: ignore[arg-type]
    ),
    max_leaves=12,
)
large = st.sampled_from(["x" * 300_000, "\x00" * 70_000, list(range(100_000))]).map(
    lambda v: v if isinstance(v, str) else list(v)
)
results = (
    structures
    | st.builds(cyclic_list)
    | st.builds(cyclic_dict)
    | st.integers(min_value=60, max_value=400).map(nested)
    | large
)
raised = st.one_of(
    any_text.map(lambda t: ValueError(t)),
    any_text.map(lambda t: RetryLater(t, delay_s=0)),
    any_text.map(lambda t: Reject(t, code="rejected_by_handler")),
    st.builds(BadText),
    st.sampled_from([123, None, {"why": "\x00"}]).map(lambda r: Reject(r, code="odd_reason")),
    st.sampled_from([123, b"\x00"]).map(lambda r: RetryLater(r, delay_s=0)),
).map(Raises)
outcomes = results | raised


class _Attempt:
    timed_out = False

    def effect_ended(self) -> None:
        return None


@pytest.fixture
async def executors(registry: JobRepository) -> AsyncIterator[dict[str, Executor]]:
    """One executor per kind of effect, sharing one completer (whose batches they fill)."""
    completer = Completer(registry, OWNER)
    await completer.start()
    config = Settings.model_validate(
        {"target_allow_http": True, "target_allow_cidrs": ["127.0.0.0/8"]}
    )
    effects: dict[str, Effect] = {
        "give": PythonEffect(
            "give",
            HandlerSettings(kind="python", function=f"{__name__}:give", transactional=False),
            registry,
            OWNER,
        ),
        "give_tx": PythonEffect(
            "give_tx",
            HandlerSettings(kind="python", function=f"{__name__}:give", transactional=True),
            registry,
            OWNER,
        ),
        "http": HttpEffect(config),
    }
    for effect in effects.values():
        await effect.start()
    timeouts = {"give": 30.0, "give_tx": 30.0, "http": 30.0}
    executor = Executor("default", QueueSettings(), effects, registry, completer, OWNER, timeouts)
    try:
        yield {"default": executor}
    finally:
        for effect in effects.values():
            await effect.stop()
        await completer.stop()


_examples = iter(range(1_000_000))


def example_keys(count: int) -> tuple[list[str], list[str]]:
    """Keys of one example's plain jobs and of its `count` generated ones (unique per run)."""
    n = next(_examples)
    return [f"{n}-plain-{i}" for i in range(PLAIN_JOBS)], [f"{n}-gen-{i}" for i in range(count)]


async def run_claim(
    repo: JobRepository,
    executor: Executor,
    handler: str,
    keys: tuple[list[str], list[str]],
    generated: list[Any],
    **fields: Any,
) -> dict[str, asyncpg.Record]:
    """Enqueue the plain jobs and one job per generated outcome, claim them all, run every
    attempt at once (their completions share the completer's batches), and read back each job
    with its history row, by key."""
    plain, mine = keys
    for key, outcome in zip(mine, generated, strict=True):
        OUTCOMES[key] = outcome
    for i, key in enumerate(plain):
        OUTCOMES[key] = {"plain": i, "text": "é✓"}
    new = [
        NewJob(key=k, handler=handler, payload={}, max_attempts=1, **fields) for k in plain + mine
    ]
    await repo.enqueue_many(new)
    jobs, _ = await repo.claim("default", 100, [f"{handler}:1"], OWNER, 60)
    assert len(jobs) == len(new)
    ended = await asyncio.gather(*(executor.execute(job, _Attempt()) for job in jobs))
    assert all(ended), "an outcome could not be written"
    rows = await repo.pool.fetch(
        "SELECT j.key, j.state, j.dead_reason, j.result, j.last_error, a.outcome, a.excerpt"
        "  FROM dispatcher.jobs j LEFT JOIN dispatcher.attempt_history a ON a.job_id = j.id"
        " WHERE j.key = ANY($1::text[])",
        plain + mine,
    )
    by_key = {r["key"]: r for r in rows}
    assert len(by_key) == len(rows) == len(new)  # one history row per job: one attempt each
    for key in plain:  # not affected: succeeded with exactly what its handler returned
        row = by_key[key]
        assert (row["state"], row["outcome"]) == ("succeeded", "succeeded"), key
        if handler != "http":
            assert row["result"] == OUTCOMES[key]
    return by_key


def described(generated: list[Any]) -> str:
    """The example, for hypothesis' report (repr refuses ints past 4,300 digits)."""
    try:
        return f"generated={generated!r}"[:2000]
    except Exception:  # an int past 4,300 digits, a __repr__ that raises
        return f"generated={storable_result(generated)!r}"[:2000]


def safe_form(value: Any) -> Any:
    """What the database holds for `value`: its safe form, through JSON."""
    return jsoncodec.loads(jsoncodec.dumps(storable_result(value)))


def assert_ended_as_expected(outcome: Any, row: asyncpg.Record) -> None:
    if not isinstance(outcome, Raises):
        assert (row["state"], row["outcome"]) == ("succeeded", "succeeded")
        stored = row["result"]  # decoded by the pool's codec
        expected = safe_form(outcome)
        assert same_json(stored, expected), (stored, expected)
        return
    exc = outcome.exc
    assert row["state"] == "dead"
    if isinstance(exc, Reject):
        assert row["dead_reason"] == exc.code
        assert row["last_error"] == storable_text(exc.reason, ERROR_CHARS)
    else:  # transient: retried until its one attempt was used
        assert row["dead_reason"] == "max_attempts"
        text = exc.reason if isinstance(exc, RetryLater) else describe(exc)
        assert row["last_error"] == storable_text(text, ERROR_CHARS)


def same_json(stored: Any, expected: Any) -> bool:
    """Equal as JSON values, numbers as jsonb keeps them (a float may read back as the int
    numeric it equals in decimal: 5.083759173944102e+16 as 50837591739441020)."""
    if isinstance(expected, float) and isinstance(stored, int | float):
        return float(stored) == expected
    if isinstance(expected, list) and isinstance(stored, list):
        return len(stored) == len(expected) and all(map(same_json, stored, expected))
    if isinstance(expected, dict) and isinstance(stored, dict):
        return stored.keys() == expected.keys() and all(
            same_json(stored[k], expected[k]) for k in expected
        )
    return type(stored) is type(expected) and stored == expected


@pytest.mark.parametrize("handler", ["give", "give_tx"])
@PROPERTY_SETTINGS
@given(generated=st.lists(outcomes, min_size=1, max_size=4))
async def test_every_handler_outcome_ends_its_own_job_and_no_other(
    registry: JobRepository, executors: dict[str, Executor], handler: str, generated: list[Any]
) -> None:
    note(described(generated))
    keys = example_keys(len(generated))
    rows = await run_claim(registry, executors["default"], handler, keys, generated)
    for key, outcome in zip(keys[1], generated, strict=True):
        assert_ended_as_expected(outcome, rows[key])


# target answers: (status, body, headers)
ZEROS_BOMB = gzip.compress(b"\x00" * 10_000_000)  # 10 MB of NUL from about 10 KB
TEXT_BOMB = gzip.compress(b"a\x00\xff\xfe" * 1_000_000)
charset_bodies = st.tuples(
    st.text(max_size=40), st.sampled_from(["utf-16", "latin-1", "shift_jis", "utf-8"])
).map(
    lambda t: (
        t[0].encode(t[1], errors="replace"),
        {"Content-Type": f"text/plain; charset={t[1]}"},
    )
)
bodies = (
    st.binary(max_size=600).map(lambda b: (b, {}))
    | st.sampled_from([ZEROS_BOMB, TEXT_BOMB]).map(lambda b: (b, {"Content-Encoding": "gzip"}))
    | st.binary(max_size=200).map(lambda b: (gzip.compress(b), {"Content-Encoding": "gzip"}))
    | charset_bodies
)
answers = st.tuples(st.sampled_from([200, 201, 299, 400, 404, 429, 500, 503]), bodies)
ANSWERS: dict[str, tuple[int, tuple[bytes, dict[str, str]]]] = {}


async def answer(request: web.Request) -> web.StreamResponse:
    key = request.headers["Idempotency-Key"]
    status, (body, headers) = ANSWERS.get(key, (200, (b'{"ok": true}', {})))
    return web.Response(status=status, body=body, headers=headers)


@pytest.fixture
async def target_url() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}/hook"
    finally:
        await runner.cleanup()


@PROPERTY_SETTINGS
@given(generated=st.lists(answers, min_size=1, max_size=4))
async def test_every_target_answer_ends_its_own_job_and_no_other(
    registry: JobRepository, executors: dict[str, Executor], target_url: str, generated: list[Any]
) -> None:
    note(described(generated))
    keys = example_keys(len(generated))
    ANSWERS.update(zip(keys[1], generated, strict=True))
    target = {"url": target_url}
    executor = executors["default"]
    rows = await run_claim(registry, executor, "http", keys, generated, target=target)
    for key, (status, _) in zip(keys[1], generated, strict=True):
        row = rows[key]
        if 200 <= status < 300:
            assert (row["state"], row["outcome"]) == ("succeeded", "succeeded")
            assert row["result"] == {"status": status}
            assert row["excerpt"] is None or "\x00" not in row["excerpt"]
        else:
            reason = "http_4xx" if 400 <= status < 500 and status != 429 else "max_attempts"
            assert (row["state"], row["dead_reason"]) == ("dead", reason)
            assert row["last_error"].startswith(f"HTTP {status}")
