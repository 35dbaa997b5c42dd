"""Property test of the job state machine through the real repository on real PostgreSQL.

Hypothesis draws sequences of operations (due-scan, claim by one of two owners, complete,
fail transiently or permanently, heartbeat, lease expiry and rescue, drain release, cancel,
operator retry), including stale ones: a completion by the wrong owner, or for an attempt that
is no longer current. After every operation every job must be in a legal state reached by a
legal transition (DESIGN.md: scheduled -> ready -> running -> succeeded | scheduled | dead |
cancelled; rescue and release put running back to ready; an operator retries dead or
cancelled), with `running` <=> a lease owner, no outbox row ever written (the in-process
transport claims ready jobs from their state rows: migration 015), and the
fencing rules honoured: only the lease holder's current attempt changes a running job. Every
attempt that ends leaves exactly one attempt history row, and nothing else does.

Operator control joins in: discard (dead -> discarded), reschedule (scheduled <-> ready), bulk
redrive and discard, and pausing the queue (a paused queue's claim takes
nothing). The queue reports its dead letters (`on_dead`, notifications in a queue of their own):
every transition into `dead` writes exactly one notification job, and nothing else writes any.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from dispatcher.db.jobs import JobRepository
from dispatcher.intake.requests import DeadLetterRequest
from dispatcher.model import Job, NewJob
from dispatcher.operator.operations import move_dead_letters

N_JOBS = 3
OWNERS = ("owner-a", "owner-b")
CAPABILITIES = ["work:1"]
MAX_ATTEMPTS = 2

LEGAL = {
    "scheduled": {"scheduled", "ready", "cancelled"},
    "ready": {"ready", "running", "cancelled", "scheduled"},
    "running": {"running", "succeeded", "scheduled", "dead", "cancelled", "ready"},
    "succeeded": {"succeeded"},
    "dead": {"dead", "ready", "discarded"},
    "cancelled": {"cancelled", "ready"},
    "discarded": {"discarded", "ready"},
}
TERMINAL = {"succeeded", "dead", "cancelled", "discarded"}
NOTICE_TARGET = {
    "url": "https://alerts.example.com/dead",
    "method": "POST",
    "headers": {},
    "timeout_s": 30.0,
}

job_index = st.integers(0, N_JOBS - 1)
owners = st.sampled_from(OWNERS)
claims = st.tuples(st.just("claim"), owners, st.integers(1, N_JOBS), st.sampled_from([0.0, 60.0]))
# (..., impostor): the other owner acts instead of the lease holder (1 time in 4)
impostor = st.sampled_from([False, False, False, True])
completions = st.tuples(st.just("complete"), job_index, impostor, st.booleans())
failures = st.tuples(
    st.just("fail"), job_index, impostor, st.booleans(), st.sampled_from([0, 3600])
)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("scan")),
        claims,
        claims,
        claims,
        completions,
        completions,
        failures,
        failures,
        st.tuples(st.just("heartbeat"), owners),
        st.tuples(st.just("rescue")),
        st.tuples(st.just("release"), job_index, impostor),
        st.tuples(st.just("cancel"), job_index),
        st.tuples(st.just("retry"), job_index),
        st.tuples(st.just("discard"), job_index),
        st.tuples(st.just("discard"), job_index),
        st.tuples(st.just("reschedule"), job_index, st.booleans()),
        st.tuples(st.just("bulk"), st.sampled_from(["redrive", "discard"]), st.booleans()),
        st.tuples(st.just("bulk"), st.sampled_from(["redrive", "discard"]), st.booleans()),
        st.tuples(st.just("pause"), st.booleans()),
    ),
    min_size=8,
    max_size=40,
)


@dataclass
class Lease:
    """What the test knows about a claim: which owner holds which attempt."""

    owner: str
    job: Job


async def snapshot(repo: JobRepository) -> dict[int, dict[str, Any]]:
    """The jobs under test (not the dead-letter notifications), each with its outbox rows,
    history rows and notifications, read in one statement (one snapshot)."""
    rows = await repo.pool.fetch(
        "SELECT j.*, (SELECT count(*) FROM dispatcher.outbox o WHERE o.job_id = j.id) AS outbox, "
        "(SELECT count(*) FROM dispatcher.attempt_history a WHERE a.job_id = j.id) AS history, "
        "(SELECT row(a.attempt, a.outcome, a.owner) FROM dispatcher.attempt_history a "
        "  WHERE a.job_id = j.id ORDER BY a.id DESC LIMIT 1) AS last_attempt, "
        "(SELECT count(*) FROM dispatcher.jobs n WHERE n.dead_letter_of = j.id) AS notices "
        "FROM dispatcher.jobs j WHERE j.dead_letter_of IS NULL ORDER BY id"
    )
    return {r["id"]: dict(r) for r in rows}


def check_notices(before: dict[str, Any], row: dict[str, Any]) -> None:
    """One dead-letter notification per transition into `dead`, none otherwise."""
    died = before["state"] != "dead" and row["state"] == "dead"
    assert row["notices"] == before["notices"] + (1 if died else 0), (before, row)


# How an attempt may end, by the state its job went to (the attempt history's outcomes).
ENDINGS = {
    "succeeded": {"succeeded"},
    "scheduled": {"retried"},
    "dead": {"dead", "lease_expired"},
    "cancelled": {"cancelled", "lease_expired"},
    "ready": {"lease_expired", "released"},
}


def check_history(before: dict[str, Any], row: dict[str, Any]) -> None:
    """Exactly the attempts that ended left one history row each, naming the attempt's number
    and owner; a write fenced off (stale attempt, wrong owner) left none."""
    ended = before["state"] == "running" and row["state"] != "running"
    assert row["history"] == before["history"] + (1 if ended else 0), (before, row)
    if ended:
        attempt, outcome, owner = row["last_attempt"]
        assert outcome in ENDINGS[row["state"]], (before["state"], row["state"], outcome)
        assert (attempt, owner) == (before["attempt"], before["lease_owner"]), row


def check_row(before: dict[str, Any] | None, row: dict[str, Any]) -> None:
    state = row["state"]
    assert state in LEGAL, row
    if before is not None:
        assert state in LEGAL[before["state"]], (before["state"], "->", state)
    assert (state == "running") == (row["lease_owner"] is not None), row
    assert (state == "running") == (row["lease_expires_at"] is not None), row
    assert row["outbox"] == 0, row  # in process, no statement writes one (migration 015)
    assert (state in TERMINAL) == (row["finished_at"] is not None), row
    # a discarded job keeps the reason it died
    assert (state in ("dead", "discarded")) == (row["dead_reason"] is not None), row
    assert 0 <= row["attempt"] <= row["max_attempts"], row
    if state == "succeeded":
        assert row["result"] is not None, row


async def apply(
    repo: JobRepository, op: tuple[Any, ...], ids: list[int], leases: dict[int, Lease]
) -> None:
    """Run one operation; check the fencing rules of the ones that target a running job."""
    kind = op[0]
    if kind == "scan":
        await repo.scan_due(100)
    elif kind == "claim":
        _, owner, limit, lease_s = op
        paused = await repo.pool.fetchval(
            "SELECT paused FROM dispatcher.queues WHERE name = 'default'"
        )
        jobs, _ = await repo.claim("default", limit, CAPABILITIES, owner, lease_s)
        assert not (paused and jobs), "a paused queue's claim took jobs"
        for job in jobs:
            leases[job.id] = Lease(owner, job)
    elif kind in ("complete", "fail", "release"):
        if not leases:
            return
        job_id = ids[op[1]] if ids[op[1]] in leases else sorted(leases)[op[1] % len(leases)]
        lease = leases[job_id]
        owner = OWNERS[1 - OWNERS.index(lease.owner)] if op[2] else lease.owner
        holder = await repo.pool.fetchrow(
            "SELECT state, lease_owner, attempt FROM dispatcher.jobs WHERE id = $1", job_id
        )
        current = (
            holder["state"] == "running"
            and holder["lease_owner"] == owner
            and holder["attempt"] == lease.job.attempt
            and lease.owner == owner
        )
        if kind == "complete":
            stale = not op[3]  # complete an attempt that is not the one claimed
            attempt_job = lease.job
            if stale:
                attempt_job = Job(**{**_fields(lease.job), "attempt": lease.job.attempt + 7})
            done = await repo.complete([job_id], [attempt_job.attempt], [{"ok": True}], owner)
            recorded = (job_id, attempt_job.attempt) in done
            assert recorded == (current and not stale), (op, dict(holder))
        elif kind == "fail":
            permanent, delay_s = op[3], op[4]
            outcome = await repo.record_failure(
                lease.job,
                owner,
                permanent=permanent,
                delay_s=delay_s,
                error="boom",
                reason="error",
            )
            assert (outcome is not None) == current, (op, dict(holder), outcome)
        else:
            released = await repo.release_leases([(job_id, lease.job.attempt)], owner)
            assert (released == 1) == current, (op, dict(holder))
    elif kind == "heartbeat":
        mine = [(i, lease.job.attempt) for i, lease in leases.items() if lease.owner == op[1]]
        await repo.extend_leases(mine, op[1], 60.0)
    elif kind == "rescue":
        await repo.rescue_expired_leases(100)
    elif kind == "cancel":
        await repo.cancel(ids[op[1]])
    elif kind == "retry":
        await repo.retry(ids[op[1]])
    elif kind == "discard":
        await repo.discard(ids[op[1]])
    elif kind == "reschedule":
        later = datetime.now(UTC) + timedelta(hours=2) if op[2] else None
        await repo.reschedule(ids[op[1]], later)
    elif kind == "bulk":
        request = DeadLetterRequest(all=True, dry_run=op[2])
        await move_dead_letters(repo, op[1], request, batch=2)
    elif kind == "pause":
        await repo.set_queue_paused("default", op[1])


def _fields(job: Job) -> dict[str, Any]:
    return {f: getattr(job, f) for f in Job.__dataclass_fields__ if f != "log_fields"}


@pytest.fixture
async def clean_repo(repo: JobRepository) -> JobRepository:
    await repo.sync_registry(
        {"default": (MAX_ATTEMPTS, 3600), "notices": (5, 3600)},
        {"work": ("python", 1)},
        {"default": (NOTICE_TARGET, "notices")},
    )
    return repo


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=operations, future=st.lists(st.booleans(), min_size=N_JOBS, max_size=N_JOBS))
async def test_every_sequence_of_operations_keeps_jobs_in_legal_states(
    clean_repo: JobRepository, ops: list[tuple[Any, ...]], future: list[bool]
) -> None:
    repo = clean_repo
    await repo.pool.execute(
        "TRUNCATE dispatcher.intents, dispatcher.job_state, dispatcher.outbox, dispatcher.attempts"
    )
    await repo.set_queue_paused("default", False)
    later = datetime.now(UTC) + timedelta(hours=1)
    created = await repo.enqueue_many(
        [
            NewJob(
                key=f"sm-{i}",
                handler="work",
                payload={"i": i},
                due_at=later if future[i] else None,
                max_attempts=MAX_ATTEMPTS,
            )
            for i in range(N_JOBS)
        ]
    )
    ids = [c.id for c in created]
    leases: dict[int, Lease] = {}
    before = await snapshot(repo)
    for row in before.values():
        check_row(None, row)
    for op in ops:
        note(f"op {op}")
        await apply(repo, op, ids, leases)
        after = await snapshot(repo)
        assert set(after) == set(before)  # nothing lost, nothing invented
        for job_id, row in after.items():
            check_row(before[job_id], row)
            check_history(before[job_id], row)
            check_notices(before[job_id], row)
            if row["state"] != before[job_id]["state"]:
                event(f"{before[job_id]['state']} -> {row['state']}")
        before = after
