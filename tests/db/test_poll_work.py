"""The work poll's one statement (`poll_work`, dispatcher/engine/work_poll.py): the queues with
a ready job this daemon can run and that are not paused, the next due time, an expired lease."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from dispatcher.db.jobs import JobRepository
from dispatcher.model import NewJob
from tests.harness import wait_until

TARGET = {"url": "https://hooks.example.com/poll"}
CAPS = ["http:1"]
QUEUES = ["a", "b", "c"]


async def setup(repo: JobRepository) -> None:
    await repo.sync_registry({q: (5, 3600) for q in QUEUES}, {})


def job(key: str, queue: str, due_in_s: float | None = None) -> NewJob:
    due = None if due_in_s is None else datetime.now(UTC) + timedelta(seconds=due_in_s)
    return NewJob(key, "http", {}, due_at=due, queue=queue, target=TARGET)


async def test_an_empty_database_has_nothing_to_say(repo: JobRepository) -> None:
    await setup(repo)
    seen = await repo.poll_work(QUEUES, CAPS)
    assert (seen.ready, seen.next_due_s, seen.lease_expired) == ([], None, False)


async def test_ready_queues_are_named_unless_paused_or_beyond_this_daemon(
    repo: JobRepository,
) -> None:
    await setup(repo)
    await repo.enqueue_many([job("a1", "a"), job("c1", "c")])
    assert sorted((await repo.poll_work(QUEUES, CAPS)).ready) == ["a", "c"]
    assert (await repo.poll_work(["a"], CAPS)).ready == ["a"]  # only the queues asked about
    assert (await repo.poll_work(QUEUES, ["python-thing:1"])).ready == []  # cannot run them
    await repo.set_queue_paused("c", True)  # a claim would take nothing: no wake-up for it
    assert (await repo.poll_work(QUEUES, CAPS)).ready == ["a"]


async def test_the_next_due_time_is_told_in_seconds(repo: JobRepository) -> None:
    await setup(repo)
    await repo.enqueue_many([job("later", "b", 30), job("much-later", "b", 300)])
    seen = await repo.poll_work(QUEUES, CAPS)
    assert seen.ready == []
    assert seen.next_due_s is not None and 25 < seen.next_due_s <= 30


async def test_an_expired_lease_is_seen(repo: JobRepository) -> None:
    await setup(repo)
    await repo.enqueue_many([job("leased", "a")])
    jobs, _ = await repo.claim("a", 1, CAPS, "poll-test", lease_s=0.2)
    assert len(jobs) == 1
    seen = await repo.poll_work(QUEUES, CAPS)
    assert (seen.ready, seen.lease_expired) == ([], False)

    async def expired() -> bool:
        return (await repo.poll_work(QUEUES, CAPS)).lease_expired

    await wait_until(expired, timeout_s=10, what="the lease to expire")
