"""The RabbitMQ transport through real daemons and a real broker (127.0.0.1:5672, guest/guest):
the relay publishes every ready job, consumers lease and run it once, a re-published outbox row
is a counted duplicate, the broker closing the connection mid-drain loses nothing, and a daemon
whose broker is down starts, takes jobs and says it is degraded. Each test uses its own queue
prefix and deletes its queues afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections import Counter
from collections.abc import AsyncIterator, Sequence

import aiohttp
import asyncpg
import pytest
from aiohttp import web

from dispatcher.db.jobs import JobRepository
from dispatcher.db.relay import OutboxLease, RelayRepository
from dispatcher.model import NewJob
from dispatcher.relay.rabbitmq import OutboxRelay, RabbitLink
from tests.harness import (
    LOOPBACK_ENV,
    DaemonProcess,
    Target,
    free_port,
    serve_target,
    until_job_count,
    wait_until,
)
from tests.harness.fixtures import Spawn
from tests.transports import BROKER, broker_prefix, broker_up

pytestmark = [
    pytest.mark.rabbitmq,
    pytest.mark.skipif(not broker_up(), reason="needs a RabbitMQ broker on 127.0.0.1:5672"),
]


@pytest.fixture
async def prefix() -> AsyncIterator[str]:
    async with broker_prefix() as name:
        yield name


@pytest.fixture
async def prefix_alone() -> AsyncIterator[str]:
    """A prefix while no other test uses the broker: for a test that stops it."""
    async with broker_prefix(exclusive=True) as name:
        yield name


@pytest.fixture
async def target() -> AsyncIterator[Target]:
    async with serve_target(Target()) as t:
        yield t


def env(db_url: str, prefix: str, url: str = BROKER) -> dict[str, str]:
    return {
        "DISPATCHER_DATABASE_URL": db_url,
        "DISPATCHER_TRANSPORT": "rabbitmq",
        "DISPATCHER_RABBITMQ__URL": url,
        "DISPATCHER_RABBITMQ__QUEUE_PREFIX": prefix,
        **LOOPBACK_ENV,
    }


async def enqueue(db_url: str, n: int, url: str, prefix: str = "j") -> None:
    conn = await asyncpg.connect(db_url)
    try:
        await conn.fetchval(
            """SELECT count(*) FROM dispatcher.enqueue_many(
                   (SELECT array_agg($3 || g) FROM generate_series(1, $1) g),
                   array_fill('http'::text, ARRAY[$1]),
                   array_fill('{}'::jsonb, ARRAY[$1]), NULL, NULL, NULL,
                   array_fill($2::jsonb, ARRAY[$1]))""",
            n,
            json.dumps({"url": url}),
            prefix,
        )
    finally:
        await conn.close()


async def succeeded(db_url: str) -> int:
    conn = await asyncpg.connect(db_url)
    try:
        return int(
            await conn.fetchval("SELECT count(*) FROM dispatcher.jobs WHERE state = 'succeeded'")
        )
    finally:
        await conn.close()


async def rabbitmqctl(*args: str) -> str:
    """rabbitmqctl's output; its failure (a node timeout under load) fails the test by name."""
    proc = await asyncio.create_subprocess_exec(
        "rabbitmqctl", "-q", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, f"rabbitmqctl {' '.join(args)}: {err.decode()}"
    return out.decode()


async def close_connections_named(prefix: str) -> int:
    """Close, from the broker's side, the connections of this test's daemons only (the broker
    is shared with other tests)."""
    listed = await rabbitmqctl("list_connections", "pid", "client_properties")
    pids = [line.split()[0] for line in listed.splitlines() if f"dispatcher {prefix}" in line]
    for pid in pids:
        await rabbitmqctl("close_connection", pid, "closed by test")
    return len(pids)


async def done(db_url: str, n: int) -> bool:
    return await succeeded(db_url) >= n


async def metric(daemon: DaemonProcess, name: str) -> float:
    async with aiohttp.ClientSession() as s, s.get(f"{daemon.base_url}/metrics") as r:
        text = await r.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and not line.startswith("#")
    )


async def test_two_daemons_drain_through_the_broker_once_each(
    db_url: str, prefix: str, target: Target, spawn: Spawn
) -> None:
    daemons = await asyncio.gather(*(spawn(env(db_url, prefix)) for _ in range(2)))
    try:
        await enqueue(db_url, 400, target.url)
        await until_job_count(db_url, "succeeded", 400, timeout_s=60, at_least=True)
    finally:
        await asyncio.gather(*(d.stop() for d in daemons))
    counts = Counter(target.request_keys())
    assert len(counts) == 400 and max(counts.values()) == 1


async def test_an_outbox_row_published_twice_has_one_effect(
    db_url: str, prefix: str, target: Target, spawn: Spawn
) -> None:
    daemon = await spawn(env(db_url, prefix))
    try:
        await enqueue(db_url, 1, target.url)
        await until_job_count(db_url, "succeeded", 1, timeout_s=30, at_least=True)
        # the relay crashed after the confirm and before the delete: the row is back
        conn = await asyncpg.connect(db_url)
        try:
            await conn.execute("""
                INSERT INTO dispatcher.outbox (job_id, queue, tenant, capability)
                SELECT id, queue, tenant, 'http:1' FROM dispatcher.jobs""")
            await wait_until(
                lambda: conn.fetchval("SELECT count(*) = 0 FROM dispatcher.outbox"),
                timeout_s=30,
                what="the row published again",
            )
        finally:
            await conn.close()

        async def duplicate_counted() -> bool:
            return await metric(daemon, "dispatcher_duplicate_deliveries_total") >= 1

        await wait_until(duplicate_counted, timeout_s=30, what="a counted duplicate")
    finally:
        await daemon.stop()
    assert len(target.requests) == 1


# what a killed daemon's relay left: its messages recorded (the rows taken), or, from an
# earlier release's relay (migration 052), the rows leased until republish_after_s
KILLED_RELAY_LEFT = {
    "messages": """
        INSERT INTO dispatcher.outbox_messages (queue, relay, jobs, job_ids, attempts)
        SELECT 'default', 'killed-daemon', count(*), array_agg(id), array_agg(0)
          FROM dispatcher.jobs""",
    "leased-rows": """
        INSERT INTO dispatcher.outbox (job_id, queue, tenant, capability, leased_until,
                                       leased_by)
        SELECT id, queue, tenant, 'http:1', now() + interval '300 s', 'killed-daemon'
          FROM dispatcher.jobs""",
}


@pytest.mark.parametrize("left", list(KILLED_RELAY_LEFT))
async def test_what_a_killed_daemons_relay_took_is_published_again_within_seconds(
    db_url: str, prefix: str, target: Target, spawn: Spawn, left: str
) -> None:
    """A daemon killed between its relay's lease and the broker's confirm leaves messages
    recorded (rows leased, by an earlier release) whose messages may never have reached the
    broker, to be swept only after republish_after_s (300 s). Once its liveness lock is seen
    gone, the rescue gives them back and a living daemon's relay publishes them: every job
    runs once, in seconds."""
    await enqueue(db_url, 20, target.url)
    conn = await asyncpg.connect(db_url)
    try:
        # what the killed daemon left: registered, its lock gone, its relay's messages out
        await conn.execute("INSERT INTO dispatcher.instances (owner) VALUES ('killed-daemon')")
        await conn.execute(KILLED_RELAY_LEFT[left])
    finally:
        await conn.close()
    daemon = await spawn(env(db_url, prefix))
    try:
        await until_job_count(db_url, "succeeded", 20, timeout_s=30, at_least=True)
    finally:
        await daemon.stop()
    counts = Counter(target.request_keys())
    assert len(counts) == 20 and max(counts.values()) == 1


async def test_the_broker_closing_the_connection_mid_drain_loses_nothing(
    db_url: str, prefix: str, target: Target, spawn: Spawn
) -> None:
    """The close must land mid-drain and be seen by the daemon before the drain may end.

    Each rabbitmqctl call boots an Erlang VM: seconds on a loaded machine, time in which the
    daemon could finish all 1000 jobs, so the close came after the drain (testing nothing),
    and the metric was read once, racing the daemon's handling of the close frame. So the
    target holds every request after the 100th until the daemon has counted the broker
    failure (a wait with a deadline), and the drain is then still unfinished by construction."""
    gate = asyncio.Event()

    async def held_after_100(request: web.Request, count: int) -> web.StreamResponse:
        if len(target.requests) > 100:
            await gate.wait()
        return web.json_response({"ok": True})

    target.respond = held_after_100
    daemon = await spawn(env(db_url, prefix))
    try:
        await enqueue(db_url, 1000, target.url)
        await target.wait_for(lambda t: len(t.requests) > 100, timeout_s=30, what="work")
        closed = await close_connections_named(prefix)
        assert closed >= 1

        async def failure_seen() -> bool:
            return await metric(daemon, "dispatcher_broker_failures_total") >= 1

        await wait_until(failure_seen, timeout_s=30, what="the daemon to see the close")
        assert not await done(db_url, 1000)  # mid-drain indeed: held requests are unfinished
        gate.set()
        await until_job_count(db_url, "succeeded", 1000, timeout_s=90, at_least=True)
    finally:
        gate.set()
        await daemon.stop()
    counts = Counter(target.request_keys())
    assert len(counts) == 1000


async def test_a_daemon_with_its_broker_down_starts_and_says_it_is_degraded(
    db_url: str, prefix: str, target: Target, spawn: Spawn
) -> None:
    nowhere = f"amqp://guest:guest@127.0.0.1:{free_port()}/"
    daemon = await spawn(env(db_url, prefix, nowhere))
    try:
        async with aiohttp.ClientSession() as s, s.get(f"{daemon.base_url}/readyz") as r:
            body = await r.text()
        assert r.status == 200 and "degraded" in body and "RabbitMQ" in body, body
        await enqueue(db_url, 3, target.url)  # intake and the due-scan go on
        assert await metric(daemon, "dispatcher_broker_failures_total") >= 1
    finally:
        await daemon.stop()


async def ready_count(prefix: str) -> int | None:
    """Messages ready in this test's queue, from the queue itself (a passive declare): the
    counts `rabbitmqctl list_queues` shows are statistics refreshed only every few seconds.
    None while the daemon has not declared the queue yet (on a slow machine the first look can
    come before it): a wait goes on, an assertion of a count fails."""
    import aio_pika
    import aiormq

    connection = await aio_pika.connect(BROKER)
    async with connection:
        channel = await connection.channel()
        try:
            declared = await channel.declare_queue(prefix + "default", passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            return None
        return int(declared.declaration_result.message_count or 0)


async def test_sigterm_returns_held_deliveries_at_once_and_acks_running_ones_after_commit(
    db_url: str, prefix: str, target: Target, spawn: Spawn
) -> None:
    """A queue limited to 1 start/s: the daemon holds deliveries it may not start yet. SIGTERM
    must hand those back to the broker while the running attempts are still running (not when
    the process exits), and ack the running ones once their outcomes commit: a second daemon
    then runs every other job, and nothing is delivered twice."""
    target.delay_s = 8.0
    limited = {
        **env(db_url, prefix),
        "DISPATCHER_QUEUES__DEFAULT__RATE_PER_S": "1",
        "DISPATCHER_QUEUES__DEFAULT__BURST": "1",
        "DISPATCHER_QUEUES__DEFAULT__MAX_INFLIGHT": "10",
        "DISPATCHER_DRAIN_TIMEOUT_S": "30",
    }
    first = await spawn(limited)
    second: DaemonProcess | None = None
    try:
        await enqueue(db_url, 20, target.url)

        async def holding() -> bool:  # prefetch 10, one started per second: the rest held
            return len(target.requests) >= 1 and await ready_count(prefix) == 10

        await wait_until(holding, timeout_s=30, what="deliveries held by the rate limit")
        first.signal(signal.SIGTERM)

        async def handed_back() -> bool:  # all but the running attempts' deliveries
            return await ready_count(prefix) == 20 - len(target.requests)

        await wait_until(handed_back, timeout_s=5, interval_s=0.2, what="held deliveries back")
        assert first.proc is not None and first.proc.returncode is None, "still draining"
        assert target.inflight >= 1  # the running attempt goes on meanwhile
        running_at_sigterm = set(target.request_keys())
        assert await first.wait(30) == 0
        # the running attempts' deliveries were acked, not returned: nothing else went back
        assert await ready_count(prefix) == 20 - len(running_at_sigterm)
        second = await spawn({**limited, "DISPATCHER_QUEUES__DEFAULT__RATE_PER_S": "50"})
        target.delay_s = 0.0
        await until_job_count(db_url, "succeeded", 20, timeout_s=60, at_least=True)
        assert await metric(second, "dispatcher_duplicate_deliveries_total") == 0
    finally:
        await first.stop()
        if second is not None:
            await second.stop()
    counts = Counter(target.request_keys())
    assert len(counts) == 20 and max(counts.values()) == 1


async def purge(prefix: str) -> int:
    """Drop every message ready in this test's queue, as a broker that lost them would."""
    import aio_pika

    connection = await aio_pika.connect(BROKER)
    async with connection:
        channel = await connection.channel()
        declared = await channel.declare_queue(prefix + "default", passive=True)
        purged = await declared.purge()
        return int(purged.message_count or 0)


async def test_messages_lost_in_the_broker_are_published_again_and_run_once(
    db_url: str, prefix: str, target: Target, spawn: Spawn
) -> None:
    """The queue is purged after the relay published its messages and before a consumer took
    them: their jobs stay ready with their outbox rows leased by the relay (published), and
    the relay's sweep publishes them again once that lease, rabbitmq.republish_after_s, ran
    out. Every job runs once in effect, and the republished messages are counted."""
    target.delay_s = 0.25
    slow = {
        **env(db_url, prefix),
        "DISPATCHER_QUEUES__DEFAULT__MAX_INFLIGHT": "2",  # ~8 jobs/s: the rest wait in the broker
        "DISPATCHER_RABBITMQ__PUBLISH_AHEAD": "25",  # a window of 50: all of them published
        "DISPATCHER_RABBITMQ__REPUBLISH_AFTER_S": "2",
    }
    daemon = await spawn(slow)
    try:
        await enqueue(db_url, 50, target.url)

        async def waiting_in_the_broker() -> bool:
            return (await ready_count(prefix) or 0) >= 30

        await wait_until(waiting_in_the_broker, timeout_s=30, what="messages in the broker")
        purged = await purge(prefix)
        assert purged >= 20
        await until_job_count(db_url, "succeeded", 50, timeout_s=60, at_least=True)
        assert await metric(daemon, "dispatcher_outbox_republished_total") >= purged
    finally:
        await daemon.stop()
    counts = Counter(target.request_keys())
    assert len(counts) == 50 and max(counts.values()) == 1


async def test_a_slow_message_published_again_is_a_counted_duplicate(
    db_url: str, prefix: str, target: Target, spawn: Spawn
) -> None:
    """A message merely waiting in the broker longer than rabbitmq.republish_after_s is
    published again; both deliveries arrive, and the claim's attempt fence makes the second a
    counted duplicate: one effect per job."""
    target.delay_s = 1.0
    serial = {
        **env(db_url, prefix),
        "DISPATCHER_QUEUES__DEFAULT__MAX_INFLIGHT": "1",  # one at a time: the others wait
        "DISPATCHER_RABBITMQ__PUBLISH_AHEAD": "4",  # all four published at once
        "DISPATCHER_RABBITMQ__REPUBLISH_AFTER_S": "1",
    }
    daemon = await spawn(serial)
    try:
        await enqueue(db_url, 4, target.url)
        await until_job_count(db_url, "succeeded", 4, timeout_s=60, at_least=True)

        async def duplicates_counted() -> bool:
            return await metric(daemon, "dispatcher_duplicate_deliveries_total") >= 1

        await wait_until(duplicates_counted, timeout_s=30, what="a counted duplicate")
        assert await metric(daemon, "dispatcher_outbox_republished_total") >= 1
    finally:
        await daemon.stop()
    counts = Counter(target.request_keys())
    assert len(counts) == 4 and max(counts.values()) == 1


async def test_a_daemon_killed_mid_stream_loses_nothing_and_its_redeliveries_are_duplicates(
    db_url: str, prefix: str, target: Target, spawn: Spawn
) -> None:
    """kill -9 one of two daemons mid-stream: its unacked deliveries return to the broker and
    reach the survivor, which finds their jobs running (or done) and acks them as counted
    duplicates; its leases expire and those jobs run again. Every job succeeds exactly once in
    the database; only the attempts the dead daemon had in flight may reach the target twice
    (with the same Idempotency-Key)."""
    # each request held long enough that the victim still runs attempts when it is killed
    target.delay_s = 0.2
    short = {
        **env(db_url, prefix),
        "DISPATCHER_LEASE_S": "3",
        # all daemons together run at most this many: a bound on the victim's attempts in flight
        "DISPATCHER_QUEUES__DEFAULT__MAX_INFLIGHT": "100",
    }
    victim, survivor = await asyncio.gather(spawn(short), spawn(short))
    try:
        await enqueue(db_url, 1000, target.url)
        await target.wait_for(lambda t: len(t.requests) > 200, timeout_s=30, what="work")
        # killed while it runs attempts: their deliveries are unacked (a delivery it only held,
        # not started, would reach the survivor as a job still ready: no duplicate). Under a
        # slow machine the survivor may have started everything; the wait says so.
        assert victim.proc is not None
        await wait_until(
            lambda: running_attempts_of(db_url, victim.proc.pid),  # type: ignore[union-attr]
            timeout_s=30,
            interval_s=0.01,
            what="the victim running attempts",
        )
        victim.signal(signal.SIGKILL)
        await victim.wait(10)
        await until_job_count(db_url, "succeeded", 1000, timeout_s=120, at_least=True)
        duplicates = await metric(survivor, "dispatcher_duplicate_deliveries_total")
        assert duplicates >= 1
    finally:
        await asyncio.gather(victim.stop(), survivor.stop())
    counts = Counter(target.request_keys())
    assert len(counts) == 1000
    twice = sum(n - 1 for n in counts.values())
    assert twice <= 100, (twice, duplicates)  # the victim's attempts in flight: the global cap
    conn = await asyncpg.connect(db_url)
    try:
        once = await conn.fetchval("""
            SELECT bool_and(n = 1) FROM (
                SELECT count(*) AS n FROM dispatcher.attempt_history
                 WHERE outcome = 'succeeded' GROUP BY job_id) s""")
    finally:
        await conn.close()
    assert once


async def running_attempts_of(db_url: str, pid: int) -> int:
    """How many attempts the daemon of this process id holds leased (its owner names the pid)."""
    conn = await asyncpg.connect(db_url)
    try:
        return await conn.fetchval(
            "SELECT count(*) FROM dispatcher.job_state "
            "WHERE state = 'running' AND lease_owner LIKE '%:' || $1::text || ':%'",
            str(pid),
        )
    finally:
        await conn.close()


async def broker_answers() -> bool:
    proc = await asyncio.create_subprocess_exec(
        "rabbitmqctl",
        "-q",
        "await_startup",
        "--timeout",
        "5",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    return await proc.wait() == 0 and broker_up()


async def test_the_broker_stopped_and_started_mid_drain_loses_nothing(
    db_url: str, prefix_alone: str, target: Target, spawn: Spawn
) -> None:
    """`rabbitmqctl stop_app` while a daemon drains 1000 jobs, `start_app` a few seconds later:
    the durable quorum queue and its persistent messages survive, the daemon reconnects and
    re-declares, and every job runs. No other test uses the broker meanwhile (the broker lock
    of tests/transports.py), and it is restored in `finally` and awaited, so the rest of the
    suite finds it up."""
    target.delay_s = 0.01
    daemon = await spawn(env(db_url, prefix_alone))
    try:
        await enqueue(db_url, 1000, target.url)
        await target.wait_for(lambda t: len(t.requests) > 100, timeout_s=30, what="work")
        try:
            await rabbitmqctl("stop_app")
            await wait_until(lambda: not broker_up(), timeout_s=30, what="the broker stopped")
            await wait_until(
                lambda: metric(daemon, "dispatcher_broker_failures_total"),
                timeout_s=30,
                what="the daemon noticed",
            )
        finally:
            await rabbitmqctl("start_app")
            await wait_until(broker_answers, timeout_s=120, interval_s=1, what="the broker back")
        await until_job_count(db_url, "succeeded", 1000, timeout_s=120, at_least=True)
    finally:
        await daemon.stop()
    assert len(Counter(target.request_keys())) == 1000


async def test_a_batch_is_published_at_once_and_an_unroutable_message_is_not_confirmed(
    prefix: str,
) -> None:
    """The relay's batch publish on the installed aiormq: every message of a batch to an existing
    queue is confirmed (Basic.Ack); one to a queue that does not exist comes back (mandatory)
    and is not; a body too large for one frame takes basic_publish, confirmed the same way."""
    import aio_pika
    from pamqp.commands import Basic

    from dispatcher.relay.rabbitmq import batch_publishing, publish_batch

    connection = await aio_pika.connect(BROKER)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue(
            prefix + "default", durable=True, arguments={"x-queue-type": "quorum"}
        )
        raw = await channel.get_underlay_channel()
        assert batch_publishing(raw)  # an aiormq upgrade without its publishing state: noticed

        def message(key: str, queue: str, body: bytes = b"") -> tuple[str, bytes, Basic.Properties]:
            return (prefix + queue, body, Basic.Properties(delivery_mode=2, message_id=key))

        batch = [message(f"k{i}", "default") for i in range(50)]
        batch.insert(25, message("lost", "nowhere"))
        outcomes = await asyncio.gather(*await publish_batch(raw, batch))
        assert [isinstance(o, Basic.Ack) for o in outcomes] == [True] * 25 + [False] + [True] * 25
        big = message("big", "default", b"x" * (raw.max_content_size + 1))
        [confirm] = await publish_batch(raw, [big])
        assert isinstance(await confirm, Basic.Ack)
    assert await ready_count(prefix) == 51


class CountingRelays(RelayRepository):
    """The real relay repository, counting the relay's lease and release statements."""

    def __init__(self, pool: asyncpg.Pool):
        super().__init__(pool)
        self.leases = self.releases = self.given_back = self.refused = 0
        self.refuse_give_backs = 0  # give-backs to fail as a database outage would
        self.refuse_records = 0  # records of confirms to fail likewise

    async def give_back(self, messages: list[int], owner: str) -> None:
        if self.refused < self.refuse_give_backs:
            self.refused += 1
            raise ConnectionRefusedError("the database is away (the test's outage)")
        await super().give_back(messages, owner)
        self.given_back += len(messages)

    async def record_confirmed(self, owner: str, messages: Sequence[int]) -> int:
        if self.refuse_records > 0:
            self.refuse_records -= 1
            raise ConnectionRefusedError("the database is away (the test's outage)")
        return await super().record_confirmed(owner, messages)

    async def lease_outbox(
        self, windows: dict[str, int], per_message: dict[str, int], batch: int, owner: str
    ) -> list[OutboxLease]:
        self.leases += 1
        return await super().lease_outbox(windows, per_message, batch, owner)

    async def release_outbox(self, batch: int) -> int:
        self.releases += 1
        return await super().release_outbox(batch)


@contextlib.asynccontextmanager
async def idle_relay(
    repo: JobRepository, prefix: str, prefetch: int = 10, relays: CountingRelays | None = None
) -> AsyncIterator[tuple[OutboxRelay, RabbitLink, CountingRelays]]:
    """A relay and its link on queue "default" (nobody claims what they deliver), past the
    relay's first round; its lease time (30 s) bounds every wait it is not woken from."""
    await repo.sync_registry({"default": (3, 3600)}, {"work": ("python", 1)})
    relays = relays or CountingRelays(repo.pool)
    link = RabbitLink(BROKER, prefix, {"default": prefetch}, reconnect_max_s=1.0)
    relay = OutboxRelay(
        relays,
        link,
        owner="relay-test",
        batch=100,
        confirm_timeout_s=30.0,
        publish_ahead=2.0,
        republish_after_s=300.0,
    )
    await link.start()
    await relay.start()
    try:
        await wait_until(lambda: relays.leases >= 1, what="the relay's first round")
        yield relay, link, relays
    finally:
        await relay.stop()
        await link.stop()


async def test_an_idle_relay_waits_for_a_wake_up_and_publishes_at_once_when_woken(
    repo: JobRepository, prefix: str
) -> None:
    """Nothing to publish, the relay sends PostgreSQL nothing until woken (it had leased every
    50 ms and released every quarter second: about 24 statements in the second watched here);
    woken, it publishes the new ready job."""
    async with idle_relay(repo, prefix) as (relay, _, relays):
        leases, releases = relays.leases, relays.releases
        assert releases == 1  # a previous relay's leases, once at start
        await asyncio.sleep(1.0)  # no condition to wait on: the absence of statements
        assert (relays.leases, relays.releases) == (leases, releases)

        [job] = await outbox_rows(repo, 1)
        relay.wake()

        await wait_until(lambda: in_a_message(repo, job), what="the woken relay's publish")
        assert relays.leases >= leases + 1


@pytest.mark.parametrize("refusals", [0, 2], ids=["database-up", "database-refuses-twice"])
async def test_a_relay_records_the_brokers_confirms_so_no_rescue_publishes_them_again(
    repo: JobRepository, prefix: str, refusals: int
) -> None:
    """The broker confirmed the relay's messages: the relay records that as the confirms
    arrive, and from then on they name no relay, so the rescue after its daemon's kill gives
    back none of them (before, a killed daemon's every message in the broker was published a
    second time). A record the database refuses is tried again, by an idle relay too, until it
    is written."""
    relays = CountingRelays(repo.pool)
    relays.refuse_records = refusals
    async with idle_relay(repo, prefix, relays=relays) as (relay, _, _):
        await outbox_rows(repo, 3)
        relay.wake()

        async def recorded() -> bool:
            named = await repo.pool.fetch("SELECT relay FROM dispatcher.outbox_messages")
            return len(named) == 3 and {r["relay"] for r in named} == {""}

        await wait_until(recorded, timeout_s=10, what="the confirms recorded by the relay")
        assert relays.refuse_records == 0  # each refusal was met, and tried again
        await repo.rescue(100, ["relay-test"])  # as if its daemon were gone
        assert await repo.pool.fetchval("SELECT count(*) FROM dispatcher.outbox") == 0


@pytest.mark.parametrize("refusals", [0, 2], ids=["database-up", "database-refuses-twice"])
async def test_a_batch_the_broker_does_not_confirm_goes_back_to_the_pick_at_once(
    repo: JobRepository, prefix: str, refusals: int
) -> None:
    """The broker queue deleted under the relay: its message comes back unroutable,
    unconfirmed. The relay gives the row back at once (not after its lease, republish_after_s
    here 300 s, nor the confirm timeout of 30 s), declares the queue again and publishes it.
    A give-back the database refuses is tried again by the relay's loop, not left until the
    lease runs out."""
    import aio_pika

    async with idle_relay(repo, prefix) as (relay, _, relays):
        relays.refuse_give_backs = refusals
        connection = await aio_pika.connect(BROKER)
        async with connection:
            channel = await connection.channel()
            await channel.queue_delete(prefix + "default")
        [job] = await outbox_rows(repo, 1)
        relay.wake()
        await wait_until(lambda: relays.given_back >= 1, timeout_s=10, what="the row given back")
        assert relays.refused == refusals

        async def in_the_broker() -> bool:
            # ready or delivered to the link's consumer (nobody claims here): `messages` counts
            # both (statistics, refreshed every few seconds)
            listed = await rabbitmqctl("list_queues", "name", "messages")
            return f"{prefix}default\t1" in listed

        await wait_until(in_the_broker, timeout_s=20, what="the message published again")
        assert await in_a_message(repo, job)


@contextlib.asynccontextmanager
async def memory_alarm() -> AsyncIterator[None]:
    """The broker's memory alarm raised (a watermark far below what it uses): it blocks every
    publishing connection, so nothing published meanwhile is confirmed. Put back as it was."""
    was = (await rabbitmqctl("eval", "vm_memory_monitor:get_vm_memory_high_watermark().")).strip()
    assert float(was) > 0, was  # a relative watermark, as set_vm_memory_high_watermark takes
    await rabbitmqctl("set_vm_memory_high_watermark", "0.000001")
    try:

        async def raised() -> bool:
            return "memory" in await rabbitmqctl("eval", "rabbit_alarm:get_alarms().")

        await wait_until(raised, timeout_s=10, what="the broker's memory alarm")
        yield
    finally:
        await rabbitmqctl("set_vm_memory_high_watermark", was)


async def test_a_relay_stopped_before_its_batch_is_confirmed_gives_the_rows_back(
    repo: JobRepository, prefix_alone: str
) -> None:
    """A daemon stopping while its relay's batch awaits the broker's confirms: the batch gets a
    moment, then its rows go back to the pick, for another daemon to publish at once, instead
    of staying leased (for republish_after_s, here 300 s) with no message behind them."""
    async with idle_relay(repo, prefix_alone) as (relay, _, relays), memory_alarm():
        for round_ in range(3):  # a round each: the broker confirms what it read before blocking
            [job] = await outbox_rows(repo, 1, first=round_)
            relay.wake()

            await wait_until(
                lambda job=job: in_a_message(repo, job),
                what="the relay's lease (its publish blocked by the alarm)",
            )
        assert relays.given_back == 0
        await relay.stop()
        # one job a message here (prefetch 10): each message given back is a row to pick again
        given_back = await repo.pool.fetchval(
            "SELECT count(*) FROM dispatcher.outbox WHERE leased_until IS NULL"
        )
        assert relays.given_back >= 1 and given_back == relays.given_back
        # the confirmed ones are in the broker, recorded: its rescue gives none back
        assert (
            await repo.pool.fetchval(
                "SELECT count(*) FROM dispatcher.outbox_messages WHERE relay = ''"
            )
            == 3 - given_back
        )


class AnswerNeverComes(CountingRelays):
    """A lease whose statement committed and whose answer the relay never gets: the stop lands
    between the two."""

    def __init__(self, pool: asyncpg.Pool):
        super().__init__(pool)
        self.committed = asyncio.Event()

    async def lease_outbox(
        self, windows: dict[str, int], per_message: dict[str, int], batch: int, owner: str
    ) -> list[OutboxLease]:
        rows = await super().lease_outbox(windows, per_message, batch, owner)
        if rows:
            self.committed.set()
            await asyncio.Event().wait()  # until cancelled by the stop
        return rows


async def test_a_relay_stopped_during_a_leases_answer_leaves_its_message_to_the_rescue(
    repo: JobRepository, prefix: str
) -> None:
    """Stopped after its lease committed and before it published: the message recorded was
    never sent, so nothing records it as confirmed; it stays the relay's, for the rescue after
    the stop to give back (naming no relay, it would wait for the sweep's 300 s)."""
    relays = AnswerNeverComes(repo.pool)
    async with idle_relay(repo, prefix, relays=relays) as (relay, _, _):
        [job] = await outbox_rows(repo, 1)
        relay.wake()
        await asyncio.wait_for(relays.committed.wait(), timeout=10)
        await relay.stop()
    owners = await repo.pool.fetch(
        "SELECT relay FROM dispatcher.outbox_messages WHERE $1 = ANY (job_ids)", job
    )
    assert [r["relay"] for r in owners] == ["relay-test"]


async def outbox_rows(repo: JobRepository, n: int, first: int = 0) -> list[int]:
    """`n` ready jobs (keys numbered from `first`) with their outbox rows, as intake writes
    them under the relay."""
    jobs = await repo.enqueue_many(
        [NewJob(key=f"row-{i}", handler="work", payload={}) for i in range(first, first + n)]
    )
    await repo.pool.execute(
        "INSERT INTO dispatcher.outbox (job_id, queue, tenant, capability)"
        " SELECT unnest($1::bigint[]), 'default', '', 'work:1'",
        [j.id for j in jobs],
    )
    return [j.id for j in jobs]


async def test_an_idle_relay_publishes_into_a_window_widened_at_run_time_at_once(
    repo: JobRepository, prefix: str
) -> None:
    """A queue's max_inflight raised at run time (a limits PATCH) widens its window: the relay,
    idle on a full window, publishes into it without waiting for a claim or its lease time."""
    async with idle_relay(repo, prefix, prefetch=1) as (relay, _, _):
        await outbox_rows(repo, 6)
        relay.wake()
        await wait_until(
            lambda: relay_published(repo, 2), what="the window (2.0 x max_inflight 1) published"
        )
        relay.set_max_inflight("default", 3)
        await wait_until(
            lambda: relay_published(repo, 6), timeout_s=10, what="the widened window published"
        )


async def relay_published(repo: JobRepository, n: int) -> bool:
    """At least `n` jobs in the relay's messages: published (a message the broker does not
    confirm goes back to the pick)."""
    count = await repo.pool.fetchval(
        "SELECT coalesce(sum(jobs), 0) FROM dispatcher.outbox_messages"
    )
    return int(count) >= n


async def in_a_message(repo: JobRepository, job: int) -> bool:
    """Whether the relay published `job`: a message recorded carries it (naming the relay
    until the broker's confirm is recorded, then none)."""
    return bool(
        await repo.pool.fetchval(
            "SELECT EXISTS (SELECT 1 FROM dispatcher.outbox_messages"
            " WHERE relay IN ('relay-test', '') AND $1 = ANY (job_ids))",
            job,
        )
    )


async def test_an_idle_relay_releases_refused_rows_at_each_ones_lease_end(
    repo: JobRepository, prefix: str
) -> None:
    """Two claims refused deliveries due again at different times: the relay releases at
    each (it had kept only the earliest, so the later one waited for its lease time, 30 s)."""
    async with idle_relay(repo, prefix) as (_, link, relays):
        releases = relays.releases
        link.release_after([0.2])
        link.release_after([0.4])
        await wait_until(
            lambda: relays.releases >= releases + 2, timeout_s=10, what="both releases"
        )


async def test_deliveries_held_by_the_limits_return_when_their_daemon_is_killed(
    db_url: str, prefix: str, target: Target, spawn: Spawn
) -> None:
    """A rate-limited queue keeps deliveries held in a daemon (received, not yet started: the
    limits hold them), and a failed attempt's retry is published while the daemon is busy.
    kill -9 that daemon, twice over: every held delivery returns to the broker and reaches
    another daemon at once, so every job ends long before the relay's sweep (republish_after_s,
    far off here) could publish a lost message again. Seen once in the RabbitMQ chaos soak: a
    retried job published ~3 s before its daemon was killed was never started again."""
    target.delay_s = 0.05

    async def flaky(_request: web.Request, count: int) -> web.StreamResponse:
        return web.json_response({"ok": count > 1}, status=200 if count > 1 else 500)

    target.respond = flaky
    limited = {
        **env(db_url, prefix),
        "DISPATCHER_LEASE_S": "3",
        "DISPATCHER_QUEUES__DEFAULT__RATE_PER_S": "40",
        "DISPATCHER_QUEUES__DEFAULT__BURST": "5",
        "DISPATCHER_QUEUES__DEFAULT__MAX_INFLIGHT": "6",
        "DISPATCHER_QUEUES__DEFAULT__BACKOFF_BASE_S": "0.05",
        "DISPATCHER_QUEUES__DEFAULT__BACKOFF_CAP_S": "0.2",
        "DISPATCHER_RABBITMQ__REPUBLISH_AFTER_S": "600",
    }
    jobs = 150
    survivor = await spawn(limited)
    try:
        await enqueue(db_url, jobs, target.url)
        for kills in (40, 120):
            victim = await spawn(limited)
            await target.wait_for(
                lambda t, n=kills: len(t.requests) > n, timeout_s=60, what=f"{kills} requests"
            )
            victim.signal(signal.SIGKILL)
            await victim.wait(10)
        # the survivor alone: what the victims held comes back to it within its leases
        await until_job_count(db_url, "succeeded", jobs, timeout_s=60, at_least=True)
    finally:
        await survivor.stop()
    assert len(set(target.request_keys())) == jobs


# Batch messages (relay/rabbitmq/messages.py): max_inflight 16 x jobs_per_message, so a queue
# carries the full jobs_per_message in each message (and a consumer holds 16 of them).
def batched(db_url: str, prefix: str, jobs_per_message: int) -> dict[str, str]:
    return {
        **env(db_url, prefix),
        "DISPATCHER_RABBITMQ__JOBS_PER_MESSAGE": str(jobs_per_message),
        "DISPATCHER_QUEUES__DEFAULT__MAX_INFLIGHT": str(16 * jobs_per_message),
        # far off: every job here reaches a consumer through the broker, not the sweep
        "DISPATCHER_RABBITMQ__REPUBLISH_AFTER_S": "600",
    }


async def succeeded_once_each(db_url: str) -> bool:
    conn = await asyncpg.connect(db_url)
    try:
        return bool(
            await conn.fetchval("""
                SELECT bool_and(n = 1) FROM (
                    SELECT count(*) AS n FROM dispatcher.attempt_history
                     WHERE outcome = 'succeeded' GROUP BY job_id) s""")
        )
    finally:
        await conn.close()


async def test_a_daemon_killed_with_a_batch_half_run_has_every_job_end_once_in_effect(
    db_url: str, prefix: str, target: Target, spawn: Spawn
) -> None:
    """60 jobs in one message, started at 10/s: kill -9 the daemon with some of them done,
    some running and the rest held. The broker gives the whole message to the next daemon:
    its done and running jobs are counted duplicates (fenced by their attempts), the held ones
    run there, the running ones once their leases are rescued. Each job succeeds once in the
    database; only an attempt running at the kill may reach the target twice (same key). The
    sweep is far off: the held jobs came back through the redelivered message."""
    target.delay_s = 1.0
    batch = {
        **batched(db_url, prefix, 60),
        "DISPATCHER_LEASE_S": "3",
        "DISPATCHER_QUEUES__DEFAULT__RATE_PER_S": "10",
        "DISPATCHER_QUEUES__DEFAULT__BURST": "5",
    }
    victim = await spawn(batch)
    survivor: DaemonProcess | None = None
    try:
        await enqueue(db_url, 60, target.url)
        # at 10 starts/s, a second each: the first 5 done while ~10 run and ~45 are held
        await wait_until(lambda: done(db_url, 5), timeout_s=30, what="5 done")
        victim.signal(signal.SIGKILL)
        await victim.wait(10)
        done_at_kill = await succeeded(db_url)
        started_at_kill = set(target.request_keys())
        assert 0 < done_at_kill < 60 and len(started_at_kill) < 60
        survivor = await spawn({**batch, "DISPATCHER_QUEUES__DEFAULT__RATE_PER_S": "100"})
        await until_job_count(db_url, "succeeded", 60, timeout_s=60, at_least=True)
        # every job the victim had started came back in the message: a counted duplicate
        duplicates = await metric(survivor, "dispatcher_duplicate_deliveries_total")
        assert duplicates >= done_at_kill, (duplicates, done_at_kill)
    finally:
        await victim.stop()
        if survivor is not None:
            await survivor.stop()
    counts = Counter(target.request_keys())
    assert len(counts) == 60
    assert {k for k, n in counts.items() if n > 1} <= started_at_kill
    assert max(counts.values()) <= 2
    assert await succeeded_once_each(db_url)


@pytest.mark.parametrize("limit", ["key", "queue"])
async def test_a_batch_partly_held_back_by_a_limit_runs_every_job_once(
    db_url: str, prefix: str, target: Target, spawn: Spawn, limit: str
) -> None:
    """One message of 30 jobs the limits start only in part: by their concurrency key (10 of
    them share a key allowed one at a time: the claim refuses the rest of the key, and they
    come back in messages of their own when the key has room), or by the queue's rate (5/s:
    the daemon holds the rest of the message and starts them as the rate allows). Every job
    runs once, within its limit, and nothing is a duplicate."""
    target.delay_s = 0.1
    keyed = Target(delay_s=0.2)
    settings = batched(db_url, prefix, 30)
    if limit == "key":
        settings["DISPATCHER_QUEUES__DEFAULT__KEY_MAX_INFLIGHT"] = "1"
    else:
        settings["DISPATCHER_QUEUES__DEFAULT__RATE_PER_S"] = "5"
        settings["DISPATCHER_QUEUES__DEFAULT__BURST"] = "2"
    async with serve_target(keyed):
        daemon = await spawn(settings)
        try:
            conn = await asyncpg.connect(db_url)
            try:
                await conn.fetchval(
                    """SELECT count(*) FROM dispatcher.enqueue_many(
                           (SELECT array_agg('b' || g) FROM generate_series(1, 30) g),
                           array_fill('http'::text, ARRAY[30]),
                           array_fill('{}'::jsonb, ARRAY[30]),
                           targets => (SELECT array_agg(CASE WHEN g % 3 = 0 THEN $2::jsonb
                                                             ELSE $1::jsonb END)
                                         FROM generate_series(1, 30) g),
                           concurrency_keys => (SELECT array_agg(CASE WHEN g % 3 = 0
                                                                      THEN 'acct' END)
                                                  FROM generate_series(1, 30) g))""",
                    json.dumps({"url": target.url}),
                    json.dumps({"url": keyed.url}),
                )
            finally:
                await conn.close()
            await until_job_count(db_url, "succeeded", 30, timeout_s=60, at_least=True)
            assert await metric(daemon, "dispatcher_duplicate_deliveries_total") == 0
            if limit == "key":
                assert await metric(daemon, "dispatcher_key_throttled_claims_total") >= 1
        finally:
            await daemon.stop()
    counts = Counter(target.request_keys() + keyed.request_keys())
    assert len(counts) == 30 and max(counts.values()) == 1
    if limit == "key":
        assert keyed.max_inflight == 1
    else:
        starts = sorted(r["at"] for r in target.requests + keyed.requests)
        assert starts[-1] - starts[0] >= (30 - 2) / 5 - 1.0  # ~5.6 s at 5/s after a burst of 2


async def test_a_batch_delivered_again_after_its_jobs_ran_is_counted_duplicates_only(
    db_url: str, prefix: str, target: Target, spawn: Spawn
) -> None:
    """The broker delivers a batch message again (a consumer's channel closed before its ack
    left): every job in it already ran, so each is a counted duplicate, none runs again; a job
    of it ready for a later attempt than the message names is one too."""
    from dispatcher.relay.rabbitmq.messages import properties

    daemon = await spawn(batched(db_url, prefix, 20))
    try:
        await enqueue(db_url, 20, target.url)
        await until_job_count(db_url, "succeeded", 20, timeout_s=30, at_least=True)
        conn = await asyncpg.connect(db_url)
        try:
            jobs = await conn.fetch("SELECT id FROM dispatcher.jobs ORDER BY id")
            assert await conn.fetchval("SELECT count(*) FROM dispatcher.outbox_messages") == 0
        finally:
            await conn.close()
        # ready after 0, named as a message whose record its claims deleted already
        body, props = properties(10**9, [(r["id"], 0) for r in jobs])
        import aio_pika

        connection = await aio_pika.connect(BROKER)
        async with connection:
            channel = await connection.channel()
            await channel.default_exchange.publish(
                aio_pika.Message(
                    body,
                    content_type=props.content_type,
                    headers=props.headers,
                    message_id=props.message_id,
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                ),
                routing_key=prefix + "default",
            )

        async def all_duplicates() -> bool:
            return await metric(daemon, "dispatcher_duplicate_deliveries_total") >= 20

        await wait_until(all_duplicates, timeout_s=30, what="20 counted duplicates")
    finally:
        await daemon.stop()
    assert await ready_count(prefix) == 0  # acked: a message held unacked would be back
    counts = Counter(target.request_keys())
    assert len(counts) == 20 and max(counts.values()) == 1
