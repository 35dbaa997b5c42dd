"""Per-job contracts on real PostgreSQL (migration 030): a time to live that no start can pass
(the due-scan's sweep, and both claims when the job expired between the scan and the claim), a
deadline per job carried by the claim, and the callback pushed in the transaction that ends a
job, once per ending, whichever statement ends it."""

from __future__ import annotations

from typing import Any

import pytest

from dispatcher.db.jobs import JobRepository
from dispatcher.db.relay import RelayRepository
from dispatcher.model import Job, NewJob

OWNER = "host:1:abc"
CAPABILITIES = ["work:1"]
SUCCESS = {"url": "https://hooks.example/ok"}
FAILURE = {"url": "https://hooks.example/failed"}


@pytest.fixture
async def registry(repo: JobRepository) -> JobRepository:
    await repo.sync_registry({"default": (2, 3600)}, {"work": ("python", 1), "http": ("http", 1)})
    return repo


async def enqueue(repo: JobRepository, key: str, **fields: Any) -> int:
    [result] = await repo.enqueue_many([NewJob(key=key, handler="work", payload={}, **fields)])
    return result.id


async def set_contract(repo: JobRepository, job_id: int, **columns: Any) -> None:
    """What a door writes (the doors are tested in tests/service and tests/e2e)."""
    state = {k: v for k, v in columns.items() if k == "expires_at"}
    intent = {k: v for k, v in columns.items() if k != "expires_at"}
    for table, values in (("job_state", state), ("intents", intent)):
        for column, value in values.items():
            await repo.pool.execute(
                f"UPDATE dispatcher.{table} SET {column} = $2 WHERE id = $1", job_id, value
            )
    if "on_success" in intent or "on_failure" in intent:
        await repo.pool.execute(
            "UPDATE dispatcher.job_state SET has_callback = true WHERE id = $1", job_id
        )


async def state_of(repo: JobRepository, job_id: int) -> tuple[str, str | None]:
    row = await repo.pool.fetchrow(
        "SELECT state, dead_reason FROM dispatcher.job_state WHERE id = $1", job_id
    )
    assert row is not None
    return row["state"], row["dead_reason"]


async def callbacks(repo: JobRepository) -> list[dict[str, Any]]:
    rows = await repo.pool.fetch(
        "SELECT i.key, i.handler, i.target, i.payload, s.state, i.callback_of"
        " FROM dispatcher.intents i JOIN dispatcher.job_state s ON s.id = i.id"
        " WHERE i.callback_of IS NOT NULL ORDER BY i.id"
    )
    return [dict(r) for r in rows]


async def claim(repo: JobRepository) -> list[Job]:
    return (await repo.claim("default", 10, CAPABILITIES, OWNER, 60))[0]


# --- time to live ---------------------------------------------------------------------------


async def test_the_scan_ends_unstarted_jobs_past_their_ttl_and_moves_none_of_them(
    registry: JobRepository,
) -> None:
    repo = registry
    due = await enqueue(repo, "due-expired", due_at=None)
    scheduled = await enqueue(repo, "scheduled-expired")
    alive = await enqueue(repo, "alive")
    untimed = await enqueue(repo, "untimed")
    await repo.pool.execute(
        "UPDATE dispatcher.job_state SET state = 'scheduled', due_at = now() - interval '1 s'"
    )
    await set_contract(repo, due, expires_at=await repo.pool.fetchval("SELECT now()"))
    await repo.pool.execute(
        "UPDATE dispatcher.job_state SET expires_at = now() - interval '1 s' WHERE id = $1",
        scheduled,
    )
    await repo.pool.execute(
        "UPDATE dispatcher.job_state SET expires_at = now() + interval '1 h' WHERE id = $1", alive
    )
    # the move alone never starts an expired job on its way
    assert (await repo.scan_due(100)).moved == 2
    assert await repo.expire_unstarted(100) == {"default": 2}
    assert await state_of(repo, due) == ("dead", "expired")
    assert await state_of(repo, scheduled) == ("dead", "expired")
    assert await state_of(repo, alive) == ("ready", None)
    assert await state_of(repo, untimed) == ("ready", None)
    error = await repo.pool.fetchval(
        "SELECT last_error FROM dispatcher.job_state WHERE id = $1", due
    )
    assert "before an attempt started" in error
    assert await repo.expire_unstarted(100) == {}


async def test_a_claim_ends_a_job_that_expired_after_the_scan_and_starts_the_others(
    registry: JobRepository,
) -> None:
    repo = registry
    late = await enqueue(repo, "late")
    fresh = await enqueue(repo, "fresh")
    # ready when the scan moved it; its TTL passes before any claim
    await repo.pool.execute(
        "UPDATE dispatcher.job_state SET expires_at = now() - interval '1 ms' WHERE id = $1", late
    )
    result = await repo.claim_limited("default", 10, CAPABILITIES, OWNER, 60)
    assert [j.id for j in result.jobs] == [fresh]
    assert result.expired == 1
    assert await state_of(repo, late) == ("dead", "expired")
    attempt = await repo.pool.fetchval(
        "SELECT attempt FROM dispatcher.job_state WHERE id = $1", late
    )
    assert attempt == 0  # never started
    assert await repo.attempts(late) == []


async def test_the_consumers_claim_acknowledges_an_expired_delivery_without_starting_it(
    registry: JobRepository,
) -> None:
    repo = registry
    relay = RelayRepository(repo.pool)
    late = await enqueue(repo, "late")
    fresh = await enqueue(repo, "fresh")
    await repo.pool.execute(
        "INSERT INTO dispatcher.outbox (job_id, queue, tenant, capability, leased_until)"
        " SELECT id, 'default', '', 'work:1', now() FROM dispatcher.job_state"
    )
    await repo.pool.execute(
        "UPDATE dispatcher.job_state SET expires_at = now() - interval '1 ms' WHERE id = $1", late
    )
    claimed = await relay.claim_delivered("default", [(late, 0), (fresh, 0)], CAPABILITIES, "d", 60)
    assert [j.id for j in claimed.jobs] == [fresh]
    assert claimed.eligible == {fresh}  # not held back: its message is acknowledged
    assert claimed.expired == 1
    assert await state_of(repo, late) == ("dead", "expired")
    assert await repo.pool.fetchval("SELECT count(*) FROM dispatcher.outbox") == 0


async def test_a_retry_that_would_start_after_the_ttl_ends_the_job_expired_at_once(
    registry: JobRepository,
) -> None:
    repo = registry
    soon = await enqueue(repo, "soon", max_attempts=5)
    later = await enqueue(repo, "later", max_attempts=5)
    await repo.pool.execute(
        "UPDATE dispatcher.job_state SET expires_at = now() + interval '30 s' WHERE id = $1", soon
    )
    await repo.pool.execute(
        "UPDATE dispatcher.job_state SET expires_at = now() + interval '1 h' WHERE id = $1", later
    )
    jobs = {j.key: j for j in await claim(repo)}
    for key in ("soon", "later"):
        outcome = await repo.record_failure(
            jobs[key], OWNER, permanent=False, delay_s=60, error="HTTP 503", reason="transient"
        )
        assert outcome == {"soon": ("dead", "expired"), "later": ("scheduled", None)}[key]


async def test_a_snooze_that_would_wake_after_the_ttl_ends_the_job_expired(
    registry: JobRepository,
) -> None:
    repo = registry
    job_id = await enqueue(repo, "snoozer")
    await repo.pool.execute(
        "UPDATE dispatcher.job_state SET expires_at = now() + interval '30 s' WHERE id = $1",
        job_id,
    )
    [job] = await claim(repo)
    outcome = await repo.snooze(
        job, OWNER, delay_s=60, until=None, reason="not yet", max_snoozes=10
    )
    assert outcome == ("dead", "expired")


async def test_a_ttl_must_be_a_finite_time(registry: JobRepository) -> None:
    repo = registry
    job = await enqueue(repo, "k")
    with pytest.raises(Exception, match="job_state_expires_at_range"):
        await repo.pool.execute(
            "UPDATE dispatcher.job_state SET expires_at = 'infinity' WHERE id = $1", job
        )


# --- deadlines ------------------------------------------------------------------------------


async def test_the_claim_carries_the_jobs_own_deadline(registry: JobRepository) -> None:
    repo = registry
    own = await enqueue(repo, "own")
    await enqueue(repo, "handlers")
    await set_contract(repo, own, timeout_s=2.5)
    jobs = {j.id: j for j in await claim(repo)}
    assert jobs[own].timeout_s == 2.5
    assert [j.timeout_s for j in jobs.values() if j.id != own] == [None]


async def test_the_registry_keeps_each_handlers_longest_deadline(repo: JobRepository) -> None:
    handlers = {"work": ("python", 1), "sweep": ("sql", 1)}
    await repo.sync_registry({"default": (2, 3600)}, handlers, max_timeout_s={"work": 30.0})
    await repo.sync_registry({"default": (2, 3600)}, handlers)  # a caller without: kept
    rows = await repo.pool.fetch("SELECT name, max_timeout_s FROM dispatcher.handlers")
    assert {r["name"]: r["max_timeout_s"] for r in rows} == {
        "http": None,
        "work": 30.0,
        "sweep": None,
    }


# --- callbacks ------------------------------------------------------------------------------


async def test_a_success_enqueues_one_signed_push_to_on_success_in_its_transaction(
    registry: JobRepository,
) -> None:
    repo = registry
    job_id = await enqueue(repo, "order-7")
    await set_contract(repo, job_id, on_success=SUCCESS, on_failure=FAILURE)
    [job] = await claim(repo)
    done = await repo.complete(
        [job.id], [job.attempt], [{"n": 1}], OWNER, http_statuses=[200], excerpts=["fine"]
    )
    assert done == {(job.id, 1)}
    [push] = await callbacks(repo)
    assert push["handler"] == "http" and push["target"] == SUCCESS
    assert push["state"] == "ready" and push["callback_of"] == job.id
    assert push["key"].startswith(f"callback:{job.id}:succeeded:")
    data = push["payload"]["data"]
    assert push["payload"]["type"] == "job.succeeded"
    assert (data["id"], data["key"], data["state"], data["attempts"]) == (
        job.id,
        "order-7",
        "succeeded",
        1,
    )
    assert (data["excerpt"], data["http_status"], data["result"]) == ("fine", 200, {"n": 1})
    # a stale second write of the same ending changes no row, so enqueues nothing
    assert await repo.complete([job.id], [job.attempt], [None], OWNER) == set()
    assert len(await callbacks(repo)) == 1


async def test_a_death_pushes_to_on_failure_and_a_retry_to_neither(
    registry: JobRepository,
) -> None:
    repo = registry
    job_id = await enqueue(repo, "flaky")
    await set_contract(repo, job_id, on_success=SUCCESS, on_failure=FAILURE)
    [job] = await claim(repo)
    await repo.record_failure(
        job, OWNER, permanent=False, delay_s=0, error="HTTP 503", reason="transient"
    )
    assert await callbacks(repo) == []  # a retry is no ending
    await repo.scan_due(10)
    [job] = await claim(repo)
    outcome = await repo.record_failure(
        job, OWNER, permanent=False, delay_s=0, error="HTTP 503 again", reason="transient"
    )
    assert outcome == ("dead", "max_attempts")
    [push] = await callbacks(repo)
    assert push["target"] == FAILURE and push["payload"]["type"] == "job.dead"
    data = push["payload"]["data"]
    assert (data["state"], data["attempts"], data["dead_reason"]) == ("dead", 2, "max_attempts")
    assert data["excerpt"] == "HTTP 503 again"


async def test_expiry_and_a_lost_lease_end_with_a_callback_too_and_callbacks_never_call_back(
    registry: JobRepository,
) -> None:
    repo = registry
    expired = await enqueue(repo, "expired")
    rescued = await enqueue(repo, "rescued", max_attempts=1)
    for job_id in (expired, rescued):
        await set_contract(repo, job_id, on_failure=FAILURE)
    await repo.pool.execute(
        "UPDATE dispatcher.job_state SET expires_at = now() - interval '1 s' WHERE id = $1",
        expired,
    )
    assert await repo.expire_unstarted(10) == {"default": 1}
    [job] = await claim(repo)
    await repo.pool.execute(
        "UPDATE dispatcher.job_state SET lease_expires_at = now() - interval '1 s' WHERE id = $1",
        job.id,
    )
    await repo.rescue_expired_leases(10)
    pushes = await callbacks(repo)
    assert [(p["callback_of"], p["payload"]["data"]["dead_reason"]) for p in pushes] == [
        (expired, "expired"),
        (rescued, "lease_expired"),
    ]
    # the push itself fails for good: nothing reports it (no loop)
    first = await repo.pool.fetchval(
        "SELECT min(id) FROM dispatcher.intents WHERE callback_of IS NOT NULL"
    )
    await repo.pool.execute(
        "UPDATE dispatcher.job_state SET state = 'dead', dead_reason = 'x', has_callback = true"
        " WHERE id = $1",
        first,
    )
    assert len(await callbacks(repo)) == 2


# --- the SQL door ---------------------------------------------------------------------------


async def test_the_sql_door_takes_a_contract_refuses_bad_ones_and_compares_replays(
    repo: JobRepository,
) -> None:
    await repo.sync_registry(
        {"default": (2, 3600)}, {"work": ("python", 1)}, max_timeout_s={"work": 30.0}
    )
    enqueue = (
        "SELECT dispatcher.enqueue('k', 'work', timeout_s => $1, expires_at => $2,"
        " on_success => $3::jsonb)"
    )
    expires = await repo.pool.fetchval("SELECT now() + interval '1 h'")
    job_id = await repo.pool.fetchval(enqueue, 5.0, expires, {"url": "https://h.example/"})
    row = await repo.pool.fetchrow(
        "SELECT i.timeout_s, s.expires_at, i.on_success, s.has_callback FROM dispatcher.intents i"
        " JOIN dispatcher.job_state s ON s.id = i.id WHERE i.id = $1",
        job_id,
    )
    assert tuple(row) == (5.0, expires, {"url": "https://h.example/"}, True)
    # the same request again: the same job; another contract: a conflict, nothing changed
    assert await repo.pool.fetchval(enqueue, 5.0, expires, {"url": "https://h.example/"}) == job_id
    with pytest.raises(Exception, match="different contract"):
        await repo.pool.fetchval(enqueue, 6.0, expires, {"url": "https://h.example/"})
    for bad, words in [
        ("SELECT dispatcher.enqueue('b1', 'work', timeout_s => 31)", "not a deadline"),
        (
            "SELECT dispatcher.enqueue('b2', 'work', expires_at => now() - interval '1 s')",
            "not after the due time",
        ),
        ("SELECT dispatcher.enqueue('b3', 'work', on_failure => '{\"u\": 1}')", "targets"),
    ]:
        with pytest.raises(Exception, match=words):
            await repo.pool.fetchval(bad)
    assert await repo.pool.fetchval("SELECT count(*) FROM dispatcher.intents") == 1


async def test_an_update_that_keeps_an_ending_reports_it_no_second_time(
    registry: JobRepository,
) -> None:
    # The two ending triggers test only the flag and the new state; their functions test that
    # the state changed. A row already dead or succeeded, written again with its state, must
    # push no second callback and no second dead-letter notice.
    repo = registry
    await repo.pool.execute(
        "UPDATE dispatcher.queues SET on_dead_target = $1::jsonb WHERE name = 'default'",
        '{"url": "https://hooks.example/dead"}',
    )
    dies = await enqueue(repo, "dies", max_attempts=1)
    works = await enqueue(repo, "works")
    for job_id in (dies, works):
        await set_contract(repo, job_id, on_success=SUCCESS, on_failure=FAILURE)
    jobs = {j.id: j for j in await claim(repo)}
    await repo.record_failure(
        jobs[dies], OWNER, permanent=True, delay_s=0, error="bad", reason="invalid"
    )
    assert await repo.complete([works], [jobs[works].attempt], [None], OWNER) == {(works, 1)}
    notices = "SELECT count(*) FROM dispatcher.intents WHERE dead_letter_of IS NOT NULL"
    assert (len(await callbacks(repo)), await repo.pool.fetchval(notices)) == (2, 1)
    await repo.pool.execute(
        # a new end time: a second push would get a key of its own (the keys carry it)
        "UPDATE dispatcher.job_state SET state = state, finished_at = now() + interval '1 s'"
        " WHERE id = ANY ($1::bigint[])",
        [dies, works],
    )
    assert (len(await callbacks(repo)), await repo.pool.fetchval(notices)) == (2, 1)
