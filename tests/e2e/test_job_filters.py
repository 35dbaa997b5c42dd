"""Lookup and filters of the job list on a real daemon process and through the CLI: every filter
and combination lists exactly the jobs that match (compared with the whole list, filtered here),
in order, page by page through the cursor; every bad value is a 422 problem naming the
parameter (a usage error naming the option on the command line)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import asyncpg
import pytest
from yarl import URL

from tests.harness import LOOPBACK_ENV, DaemonProcess, cli, job_changes

BASE = datetime(2031, 1, 1, tzinfo=UTC)
PROBLEM = "application/problem+json"
TENANTS = ["acme", "globex", None, "zürich"]
CONFIG = """
[handlers.report]
kind = "python"
function = "tests.badinput.handlers:noop"

[[schedules]]
name = "nightly"
cron = "0 3 * * *"
handler = "report"
"""


def hours(n: float) -> str:
    return (BASE + timedelta(hours=n)).isoformat().replace("+00:00", "Z")


def seeded_jobs() -> list[tuple[str, dict[str, Any]]]:
    """Twelve waiting jobs: two handlers, four tenants (one absent, one not ASCII), one per hour;
    due times repeat so that a due window orders ties by id."""
    jobs = []
    for i in range(12):
        body: dict[str, Any] = {"due_at": hours(i if i != 7 else 3), "payload": {"i": i}}
        if i % 3:
            body |= {"handler": "http", "target": {"url": "http://127.0.0.1:9/never"}}
        else:
            body["handler"] = "report"
        if (tenant := TENANTS[i % 4]) is not None:
            body["tenant"] = tenant
        jobs.append((f"f-{i}", body))
    return jobs


class Listing:
    def __init__(self, process: DaemonProcess, db_url: str, session: aiohttp.ClientSession):
        self.process, self.db_url, self.session = process, db_url, session
        self.run_keys: list[str] = []

    async def list(self, **params: Any) -> tuple[int, dict[str, Any]]:
        query = "&".join(f"{k}={quote(str(v), safe='')}" for k, v in params.items())
        url = URL(f"{self.process.base_url}/v1/jobs?{query}", encoded=True)
        async with self.session.get(url) as r:
            return r.status, await r.json(content_type=None)

    async def items(self, **params: Any) -> list[dict[str, Any]]:
        status, body = await self.list(limit=1000, **params)
        assert status == 200, body
        assert body["next_cursor"] is None or len(body["items"]) == 1000
        return body["items"]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def module_daemon_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    config = tmp_path_factory.mktemp("filters") / "dispatcher.toml"
    config.write_text(CONFIG)
    return {"DISPATCHER_CONFIG": str(config), **LOOPBACK_ENV}  # with a 0.2 s scan


@pytest.fixture(scope="module")
async def listing(module_daemon: DaemonProcess, module_db_url: str) -> AsyncIterator[Listing]:
    """The module's daemon with its jobs seeded once."""
    async with aiohttp.ClientSession() as session:
        d = Listing(module_daemon, module_db_url, session)
        await seed(d)
        yield d


async def seed(d: Listing) -> None:
    base = d.process.base_url
    for key, body in seeded_jobs():
        async with d.session.post(
            f"{base}/v1/jobs", json=body, headers={"Idempotency-Key": key}
        ) as r:
            assert r.status == 202, await r.text()
    # two cron runs: their units carry run keys (and run at once, to success)
    for days in (1, 2):
        period = (datetime.now(UTC) - timedelta(days=days)).replace(
            hour=3, minute=0, second=0, microsecond=0
        )
        async with d.session.post(
            f"{base}/v1/schedules/nightly/trigger", json={"period_start": period.isoformat()}
        ) as r:
            assert r.status == 202, await r.text()
            d.run_keys.append((await r.json())["run_key"])

    async def units_done(conn: asyncpg.Connection) -> bool:
        units = await conn.fetch(
            "SELECT state FROM dispatcher.jobs WHERE handler = 'report' AND run_key IS NOT NULL"
        )
        return len(units) == 2 and all(j["state"] == "succeeded" for j in units)

    async with job_changes(d.db_url) as jobs:
        await jobs.until(units_done, timeout_s=20, what="the cron units to succeed")


def newest_first(jobs: list[dict[str, Any]]) -> list[str]:
    return [j["key"] for j in sorted(jobs, key=lambda j: -j["id"])]


def earliest_due_first(jobs: list[dict[str, Any]]) -> list[str]:
    return [j["key"] for j in sorted(jobs, key=lambda j: (j["due_at"], j["id"]))]


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)


Rule = Callable[[dict[str, Any]], bool]
CASES: list[tuple[str, dict[str, Any], Rule]] = [
    ("tenant", {"tenant": "acme"}, lambda j: j["tenant"] == "acme"),
    ("tenant not ASCII", {"tenant": "zürich"}, lambda j: j["tenant"] == "zürich"),
    ("unknown tenant", {"tenant": "initech"}, lambda j: False),
    ("handler", {"handler": "report"}, lambda j: j["handler"] == "report"),
    ("handler http", {"handler": "http"}, lambda j: j["handler"] == "http"),
    (
        "tenant+handler+state+queue",
        {"tenant": "globex", "handler": "http", "state": "scheduled", "queue": "default"},
        lambda j: (j["tenant"], j["handler"], j["state"]) == ("globex", "http", "scheduled"),
    ),
    ("key", {"key": "f-5"}, lambda j: j["key"] == "f-5"),
    ("key prefix", {"key_prefix": "f-1"}, lambda j: j["key"].startswith("f-1")),
    (
        "key prefix + tenant",
        {"key_prefix": "f-", "tenant": "acme"},
        lambda j: j["tenant"] == "acme",
    ),
    ("key prefix _ literal", {"key_prefix": "f_"}, lambda j: False),
    (
        "concurrency key: the tenant's",
        {"concurrency_key": "globex"},
        lambda j: j["tenant"] == "globex",
    ),
    ("error text, none failed", {"error": "refused"}, lambda j: False),
    ("key around spaces", {"key": " f-5\t"}, lambda j: j["key"] == "f-5"),
    ("key + other tenant", {"key": "f-5", "tenant": "acme"}, lambda j: False),
    ("unknown key", {"key": "f-99"}, lambda j: False),
    (
        "due window",
        {"due_after": hours(2), "due_before": hours(7)},
        lambda j: at(hours(2)) <= at(j["due_at"]) < at(hours(7)),
    ),
    ("due after", {"due_after": hours(9)}, lambda j: at(j["due_at"]) >= at(hours(9))),
    ("due before", {"due_before": hours(3)}, lambda j: at(j["due_at"]) < at(hours(3))),
    (
        "due window + tenant, offset",
        {"due_after": "2031-01-01T03:00:00+02:00", "tenant": "zürich"},
        lambda j: at(j["due_at"]) >= at(hours(1)) and j["tenant"] == "zürich",
    ),
]


@pytest.mark.parametrize(("filters", "rule"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
async def test_each_filter_lists_exactly_the_matching_jobs_page_by_page(
    listing: Listing, filters: dict[str, Any], rule: Rule
) -> None:
    everything = await listing.items()
    assert len(everything) == 14  # the seeded jobs and two cron units
    matching = [j for j in everything if rule(j)]
    by_due = "due_after" in filters or "due_before" in filters
    expected = earliest_due_first(matching) if by_due else newest_first(matching)

    assert [j["key"] for j in await listing.items(**filters)] == expected

    paged: list[str] = []
    cursor: str | None = None
    for _ in range(20):
        extra = {"cursor": cursor} if cursor else {}
        status, page = await listing.list(limit=2, **filters, **extra)
        assert status == 200, page
        paged += [j["key"] for j in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert paged == expected


async def test_a_run_key_lists_the_units_of_that_run(listing: Listing) -> None:
    first, second = listing.run_keys
    (unit,) = await listing.items(run_key=first)
    assert unit["run_key"] == first and unit["handler"] == "report"
    assert [j["run_key"] for j in await listing.items(run_key=second)] == [second]
    assert await listing.items(run_key="nightly:2000-01-01T03:00:00Z") == []


BAD = [
    ({"due_before": "2031-01-01T00:00:00"}, "due_before: an RFC 3339 time with offset"),
    ({"due_before": "2031-02-30T00:00:00Z"}, "due_before: an RFC 3339 time with offset"),
    ({"due_after": "tomorrow"}, "due_after: an RFC 3339 time with offset"),
    ({"due_after": "9999-12-31T23:59:59-01:00"}, "due_after: out of range"),
    ({"due_after": hours(5), "due_before": hours(5)}, "due_after: must be earlier than"),
    ({"tenant": "a\x00b"}, "tenant: may not contain U+0000"),
    ({"tenant": "t" * 256}, "tenant: at most 255 characters"),
    ({"key": "k\x00"}, "key: an idempotency key"),
    ({"key": "k" * 256}, "key: an idempotency key"),
    ({"key": "clé"}, "key: an idempotency key"),
    ({"handler": "Bad Name"}, "handler:"),
    ({"handler": "h" * 64}, "handler:"),
    ({"run_key": "r\x00"}, "run_key:"),
    ({"run_key": "r" * 256}, "run_key:"),
    ({"reason": "r" * 201}, "reason: a dead reason"),
    ({"reason": "a\x00b"}, "reason: a dead reason"),
    ({"key_prefix": "clé"}, "key_prefix: the start of an idempotency key"),
    ({"key_prefix": "k" * 256}, "key_prefix: the start of an idempotency key"),
    ({"error": "ab"}, "error: 3 to 200 characters"),
    ({"error": "e" * 201}, "error: 3 to 200 characters"),
    ({"error": "ab\x00c"}, "error: 3 to 200 characters"),
    ({"concurrency_key": "c" * 201}, "concurrency_key: a concurrency key"),
    ({"state": "gone"}, "state: must be one of"),
    ({"queue": "q\x00"}, "queue:"),
    ({"tenat": "acme"}, "tenat: not a parameter"),
    ({"cursor": "abc"}, "cursor: pass the next_cursor"),
    ({"cursor": "12", "due_after": hours(1)}, "cursor: pass the next_cursor"),
    ({"cursor": "1.2"}, "cursor: pass the next_cursor"),
    ({"cursor": "9" * 18 + ".1", "due_after": hours(1)}, "cursor: pass the next_cursor"),
    ({"limit": "0"}, "limit: an integer from 1 to 1000"),
]


@pytest.mark.parametrize(("params", "message"), BAD, ids=[m for _, m in BAD])
async def test_bad_filters_are_422_problems_naming_the_parameter(
    listing: Listing, params: dict[str, Any], message: str
) -> None:
    status, body = await listing.list(**params)
    assert status == 422, body
    assert body["status"] == 422 and body["detail"].startswith(message), body


async def test_raw_bad_query_strings_are_422(listing: Listing) -> None:
    for raw, message in (
        ("tenant=%FF", "tenant: must be UTF-8"),
        ("tenant=a&tenant=b", "tenant: given more than once"),
    ):
        url = URL(f"{listing.process.base_url}/v1/jobs?{raw}", encoded=True)
        async with listing.session.get(url) as r:
            assert (r.status, r.content_type) == (422, PROBLEM), raw
            assert (await r.json(content_type=PROBLEM))["detail"].startswith(message)


# the command line -------------------------------------------------------------------------------
async def test_cli_list_takes_the_same_filters(listing: Listing, tmp_path: Path) -> None:
    env = {"DISPATCHER_DATABASE_URL": listing.db_url}
    for filters in (
        {"tenant": "acme"},
        {"handler": "report"},
        {"key": "f-5"},
        {"key_prefix": "f-1"},
        {"concurrency_key": "acme", "state": "scheduled"},
        {"run_key": listing.run_keys[0]},
        {"due_after": hours(2), "due_before": hours(7), "tenant": "zürich"},
        {"due_after": hours(2), "due_before": hours(7)},
    ):
        argv = [f"--{k.replace('_', '-')}={v}" for k, v in filters.items()]
        result = await cli("jobs", "list", "--json", *argv, cwd=tmp_path, env=env)
        assert result.code == 0, result.stderr
        listed = [j["key"] for j in json.loads(result.stdout)]
        assert listed == [j["key"] for j in await listing.items(**filters)], filters
        assert listed, filters
    text = await cli("jobs", "list", "--tenant", "zürich", cwd=tmp_path, env=env)
    assert text.code == 0, text.stderr
    assert [line.split()[-1] for line in text.stdout.splitlines()[1:]] == ["f-11", "f-7", "f-3"]


async def test_cli_list_says_where_to_go_on_and_takes_the_cursor(
    listing: Listing, tmp_path: Path
) -> None:
    """A full page names the --cursor of the next one on stderr (stdout stays the list); a
    key-prefix search that stops at its slice of ids names the cursor below it the same way
    (tests/service/test_api_prefix_slices.py covers the slices)."""
    env = {"DISPATCHER_DATABASE_URL": listing.db_url}
    first = await cli("jobs", "list", "--tenant", "zürich", "--limit", "2", cwd=tmp_path, env=env)
    assert first.code == 0, first.stderr
    assert [line.split()[-1] for line in first.stdout.splitlines()[1:]] == ["f-11", "f-7"]
    (hint,) = first.stderr.splitlines()
    assert hint.startswith("dispatcher: more jobs match; next page: --cursor "), hint
    cursor = hint.rsplit(" ", 1)[1]
    rest = await cli(
        "jobs", "list", "--tenant", "zürich", "--limit", "2", "--cursor", cursor,
        cwd=tmp_path, env=env,
    )  # fmt: skip
    assert rest.code == 0, rest.stderr
    assert [line.split()[-1] for line in rest.stdout.splitlines()[1:]] == ["f-3"]
    assert rest.stderr == ""
    bad = await cli("jobs", "list", "--cursor", "soon", cwd=tmp_path, env=env)
    assert bad.code == 2, bad.stdout
    assert bad.stderr.startswith("dispatcher: --cursor: pass the next_cursor"), bad.stderr


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--due-before", "soon"], "dispatcher: --due-before: an RFC 3339 time with offset"),
        (["--due-after", "2031-01-01T00:00:00"], "dispatcher: --due-after: an RFC 3339"),
        (["--tenant", "t" * 256], "dispatcher: --tenant: at most 255 characters"),
        (["--handler", "Bad Name"], 'dispatcher: --handler: "http" or a handler name'),
        (["--key", "clé"], "dispatcher: --key: an idempotency key"),
        (["--run-key", "r" * 256], "dispatcher: --run-key: a run key"),
        (["--reason", "r" * 201], "dispatcher: --reason: a dead reason"),
        (["--key-prefix", "clé"], "dispatcher: --key-prefix: the start of an idempotency key"),
        (["--error", "ab"], "dispatcher: --error: 3 to 200 characters"),
        (["--concurrency-key", "c" * 201], "dispatcher: --concurrency-key: a concurrency key"),
    ],
)
async def test_cli_bad_filters_are_usage_errors(
    listing: Listing, tmp_path: Path, argv: list[str], message: str
) -> None:
    env = {"DISPATCHER_DATABASE_URL": listing.db_url}
    result = await cli("jobs", "list", *argv, cwd=tmp_path, env=env)
    assert result.code == 2, result.stdout
    (line,) = result.stderr.splitlines()
    assert line.startswith(message), line
