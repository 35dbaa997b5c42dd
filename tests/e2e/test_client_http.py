"""dispatcher.client over HTTP against a real daemon (a child process; in process where a test
builds its settings around a proxy or a target; real PostgreSQL, real HTTP on loopback): both
clients enqueue one and many with idempotency keys, read, list, cancel, retry; a database outage
(a proxy the test cuts) answers 503 + Retry-After, which the client waits out and then succeeds
with the same key, creating one job."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from dispatcher.client import (
    ApiError,
    AsyncClient,
    Client,
    Conflict,
    Job,
    NotFound,
    RetryPolicy,
    Unavailable,
)
from dispatcher.client.http import parse_retry_after
from tests.harness import (
    DaemonHandle,
    Target,
    free_port,
    make_settings,
    running_daemon,
    serve_target,
    wait_until,
)
from tests.outage_proxy import outage_proxy

pytestmark = pytest.mark.timeout(120)
TOKEN = "client-test-token-0123456789abcdef"
LATER = datetime.now(UTC) + timedelta(days=1)


@pytest.fixture
def daemon_env() -> dict[str, str]:
    return {"DISPATCHER_API_TOKENS": TOKEN}


async def test_the_async_client_enqueues_reads_lists_cancels_and_retries(
    daemon: DaemonHandle,
) -> None:
    async with AsyncClient(daemon.base_url, token=TOKEN) as client:
        target = {"url": "https://hooks.example.com/a"}
        job = await client.enqueue("order-1", "http", {"n": 1}, target=target, due_at=LATER)
        again = await client.enqueue("order-1", "http", {"n": 1}, target=target, due_at=LATER)
        assert (again["id"], job["state"]) == (job["id"], "scheduled")
        with pytest.raises(Conflict) as conflict:  # the same key, another request
            await client.enqueue("order-1", "http", {"n": 2}, target=target, due_at=LATER)
        assert conflict.value.status == 409 and conflict.value.detail

        results = await client.enqueue_many(
            [Job(f"batch-{i}", "http", {"i": i}, target=target, due_at=LATER) for i in range(3)]
            + [Job("order-1", "http", {"n": 1}, target=target, due_at=LATER)]
            + [Job("bad", "http", {}, due_at=LATER)]  # http without a target
        )
        assert [r["status"] for r in results] == [
            "accepted",
            "accepted",
            "accepted",
            "existing",
            "rejected",
        ]
        assert "target" in results[4]["error"]

        fetched = await client.get(job["id"])
        assert (fetched["key"], fetched["state"]) == ("order-1", "scheduled")
        with pytest.raises(NotFound):
            await client.get(999_999_999)

        page = await client.list_jobs(limit=2, state="scheduled")
        assert len(page.items) == 2 and page.next_cursor is not None
        keys = [j["key"] async for j in client.iter_jobs(page_size=2, state="scheduled")]
        assert sorted(keys) == ["batch-0", "batch-1", "batch-2", "order-1"]

        cancelled = await client.cancel(job["id"])
        assert cancelled["state"] == "cancelled"
        with pytest.raises(Conflict):
            await client.cancel(job["id"])  # already cancelled: the state refuses
        retried = await client.retry(job["id"])
        assert retried["state"] == "ready"


async def test_the_clients_send_priority_and_concurrency_key_and_filter_by_priority(
    daemon: DaemonHandle,
) -> None:
    target = {"url": "https://hooks.example.com/p"}
    async with AsyncClient(daemon.base_url, token=TOKEN) as client:
        urgent = await client.enqueue(
            "urgent", "http", {}, target=target, due_at=LATER, priority=-10, tenant="t"
        )
        await client.enqueue_many(
            [
                Job(
                    "keyless",
                    "http",
                    {},
                    target=target,
                    due_at=LATER,
                    tenant="t",
                    concurrency_key="",
                ),
                Job("keyed", "http", {}, target=target, due_at=LATER, concurrency_key="acct"),
            ]
        )
        page = await client.list_jobs(priority=-10)
        assert [j["key"] for j in page.items] == ["urgent"]
        view = await client.get(urgent["id"])
        assert (view["priority"], view["concurrency_key"]) == (-10, "t")
        listed = {j["key"]: j async for j in client.iter_jobs(state="scheduled")}
        assert listed["keyless"]["concurrency_key"] is None
        assert listed["keyed"]["concurrency_key"] == "acct"
    sync = Client(daemon.base_url, token=TOKEN)
    await asyncio.to_thread(
        sync.enqueue, "sync-urgent", "http", {}, target=target, due_at=LATER, priority=-10
    )
    page = await asyncio.to_thread(sync.list_jobs, priority=-10)
    assert sorted(j["key"] for j in page.items) == ["sync-urgent", "urgent"]


async def test_the_sync_client_does_the_same_over_the_standard_library(
    daemon: DaemonHandle,
) -> None:
    def use() -> None:
        client = Client(daemon.base_url, token=TOKEN)
        target = {"url": "https://hooks.example.com/s"}
        job = client.enqueue("sync-1", "http", {"n": 1}, target=target, due_at=LATER)
        assert (
            client.enqueue("sync-1", "http", {"n": 1}, target=target, due_at=LATER)["id"]
            == (job["id"])
        )
        with pytest.raises(Conflict):
            client.enqueue("sync-1", "http", {"n": 9}, target=target, due_at=LATER)
        results = client.enqueue_many([Job("sync-2", "http", target=target, due_at=LATER)])
        assert results[0]["status"] == "accepted"
        assert client.get(job["id"])["key"] == "sync-1"
        assert sorted(j["key"] for j in client.iter_jobs(page_size=1)) == ["sync-1", "sync-2"]
        assert client.cancel(job["id"])["state"] == "cancelled"
        assert client.retry(job["id"])["state"] == "ready"
        with pytest.raises(NotFound):
            client.cancel(999_999_999)
        with pytest.raises(ApiError) as unauthorised:
            Client(daemon.base_url, token="wrong").get(job["id"])
        assert unauthorised.value.status == 401

    await asyncio.to_thread(use)


async def test_a_job_due_now_is_delivered(db_url: str) -> None:
    settings = make_settings(db_url, api_tokens=[TOKEN])
    async with (
        serve_target(Target()) as target,
        running_daemon(settings) as daemon,
        AsyncClient(daemon.base_url, token=TOKEN) as client,
    ):
        job = await client.enqueue("now-1", "http", {"hello": 1}, target={"url": target.url})

        async def done() -> bool:
            return (await client.get(job["id"]))["state"] == "succeeded"

        await wait_until(done, what="the job delivered")
    assert target.request_keys() == ["now-1"]


@pytest.mark.parametrize("flavour", ["async", "sync"])
async def test_503_retry_after_is_waited_out_then_the_same_key_creates_one_job(
    db_url: str, flavour: str
) -> None:
    """The daemon cannot reach its database: 503 + Retry-After (5 s). The client waits what it
    was told, the database comes back, and the retried request creates the job once."""
    waits: list[tuple[int, float]] = []
    told = threading.Event()

    def on_retry(error: ApiError, delay_s: float) -> None:
        waits.append((error.status, delay_s))
        told.set()

    async with outage_proxy(db_url) as proxy:
        settings = make_settings(proxy.url, api_tokens=[TOKEN])
        async with running_daemon(settings) as daemon:
            await proxy.cut()
            body = {"target": {"url": "https://hooks.example.com/o"}, "due_at": LATER}
            if flavour == "async":
                client = AsyncClient(daemon.base_url, token=TOKEN, on_retry=on_retry)
                call = asyncio.ensure_future(client.enqueue("outage-1", "http", {}, **body))
            else:
                sync = Client(daemon.base_url, token=TOKEN, on_retry=on_retry)
                call = asyncio.ensure_future(
                    asyncio.to_thread(sync.enqueue, "outage-1", "http", {}, **body)
                )
            await wait_until(told.is_set, timeout_s=30, what="a 503 the client will retry")
            await proxy.restore()
            job = await asyncio.wait_for(call, 60)
            if flavour == "async":
                await client.close()
    assert job["key"] == "outage-1"
    assert waits[0] == (503, 5.0)  # the daemon's Retry-After, not a guess
    conn = await asyncpg.connect(db_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM dispatcher.jobs") == 1
    finally:
        await conn.close()


async def test_when_retries_run_out_the_503_is_raised_and_nothing_was_created(
    db_url: str,
) -> None:
    policy = RetryPolicy(attempts=2, max_delay_s=0.05)
    async with outage_proxy(db_url) as proxy, running_daemon(make_settings(proxy.url)) as daemon:
        await proxy.cut()
        async with AsyncClient(daemon.base_url, retry=policy) as client:
            with pytest.raises(Unavailable) as refused:
                await client.enqueue(
                    "gone-1", "http", {}, target={"url": "https://hooks.example.com/g"}
                )
        await proxy.restore()
    assert refused.value.status == 503 and "database is unavailable" in refused.value.detail
    conn = await asyncpg.connect(db_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM dispatcher.jobs") == 0
    finally:
        await conn.close()


async def test_a_daemon_that_is_not_listening_is_retried_then_reported() -> None:
    seen: list[float] = []
    port = free_port()  # nothing listens there
    client = Client(
        f"http://127.0.0.1:{port}",
        retry=RetryPolicy(attempts=3, base_delay_s=0.01, max_delay_s=0.02),
        on_retry=lambda _error, delay_s: seen.append(delay_s),
    )
    with pytest.raises(Unavailable) as refused:
        await asyncio.to_thread(client.get, 1)
    assert len(seen) == 2 and all(0 <= d <= 0.02 for d in seen)
    assert f"127.0.0.1:{port}" in refused.value.detail


def test_retry_after_is_read_as_seconds_or_as_an_http_date() -> None:
    now = datetime(2026, 12, 2, 8, 0, 0, tzinfo=UTC)
    assert parse_retry_after("7", now) == 7.0
    assert parse_retry_after("Wed, 02 Dec 2026 08:00:30 GMT", now) == 30.0
    assert parse_retry_after("Wed, 02 Dec 2026 07:00:00 GMT", now) == 0.0  # past: at once
    assert parse_retry_after("soon", now) is None and parse_retry_after(None, now) is None
    assert RetryPolicy(max_delay_s=10).delay_s(0, "3600") == 10  # bounded by the policy
