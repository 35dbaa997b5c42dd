"""The pieces of the operator service (dispatcher.operator.service) that are plain functions:
bulk redrive and discard of dead letters, the reschedule time rule, and the queue overview."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from dispatcher.config.settings import Settings
from dispatcher.core import rfc3339
from dispatcher.db.jobs import JobRepository
from dispatcher.db.queue_limits import QueueSettingsRow
from dispatcher.engine.sampler import Sample
from dispatcher.intake.requests import DeadLetterRequest
from dispatcher.model import STATES, DeadLetterFilter
from dispatcher.operator.queue_limits import settings_view

# Dead jobs moved per statement (and per commit): a bulk call over a million dead letters
# never holds a long transaction, and what it moved stays moved if it is cut off.
BULK_BATCH = 1000
# What each bulk action makes of a dead job.
BULK_ACTIONS = {"redrive": "ready", "discard": "discarded"}


async def move_dead_letters(
    repo: JobRepository, action: str, request: DeadLetterRequest, *, batch: int = BULK_BATCH
) -> dict[str, Any]:
    """Redrive or discard the dead jobs `request` selects, `batch` per statement, or only count
    them (`dry_run`). Only jobs dead when the call began are taken (the database clock fences
    the walk), so a redriven job that dies again during the call is not taken twice, and the
    call ends. Repeating a finished call finds nothing more to move."""
    found = DeadLetterFilter(
        queue=request.queue,
        dead_reason=request.dead_reason,
        tenant=request.tenant,
        dead_since=request.dead_since,
        dead_before=request.dead_before,
    )
    fence = await repo.now()
    if request.dry_run:
        count = await repo.count_dead(found, request.limit, fence)
        return {"action": action, "dry_run": True, "count": count, "batches": 0}
    to_state = BULK_ACTIONS[action]
    moved = batches = 0
    while request.limit is None or moved < request.limit:
        want = batch if request.limit is None else min(batch, request.limit - moved)
        n = await repo.move_dead(to_state, found, want, fence)
        batches += 1
        moved += n
        if n < want:  # nothing more matches (rows another caller holds are skipped, not waited for)
            break
    return {"action": action, "dry_run": False, "count": moved, "batches": batches}


async def unknown_queue(repo: JobRepository, name: str) -> str | None:
    """Why a bulk filter's queue cannot match (no such queue in the registry), or None: a
    misspelt queue must not read as "no dead letters there"."""
    known = [row["name"] for row in await repo.list_queues()]
    if name in known:
        return None
    return f"unknown queue {name!r}; queues: {', '.join(known)}"


def long_past(due_at: datetime, now: datetime, tolerance_s: float) -> str | None:
    """Why a reschedule to `due_at` is refused as too far in the past, or None. Intake's rule:
    more than `due_at_past_tolerance_s` ago is a mistake, and "now" says what was meant."""
    if due_at < now - timedelta(seconds=tolerance_s):
        return (
            f"{rfc3339.format(due_at)} is more than {tolerance_s:.0f} s in the past; "
            'send "now" to run it now'
        )
    return None


def queue_overview(
    registry: list[dict[str, Any]],
    sample: Sample,
    settings: Settings,
    live: Mapping[str, QueueSettingsRow] | None = None,
    now: datetime | None = None,
) -> list[dict[str, Any]]:
    """The queues of `registry` (rows of `JobRepository.list_queues`: any daemon's queues) with
    their pause state, jobs per state, oldest ready age and overdue count (from `sample`),
    limits (this daemon's, where it configures the queue, with the settings in force from
    `live` over them), where dead letters are reported, and, from `live`, each live setting
    with its source and the run-window state at `now`."""
    counts: dict[str, dict[str, int]] = {}
    for queue, state, n in sample.counts:
        counts.setdefault(queue, {})[state] = n
    views = []
    for row in registry:
        name = row["name"]
        configured = settings.queues.get(name)
        limits: dict[str, Any] = {
            "max_attempts": row["max_attempts"],
            "max_retry_age_s": row["max_retry_age_s"],
        }
        if configured is not None:
            limits.update(configured.model_dump(exclude={"on_dead"}))
        stored = (live or {}).get(name)
        in_force = settings_view(stored, now or datetime.now(UTC)) if stored else {}
        limits.update(
            {k: v["value"] for k, v in in_force.get("settings", {}).items() if v["source"]}
        )
        views.append(
            {
                "name": name,
                "paused": row["paused"],
                "paused_at": rfc3339.format(row["paused_at"]) if row["paused_at"] else None,
                "configured_here": configured is not None,
                "jobs": {state: counts.get(name, {}).get(state, 0) for state in STATES},
                "oldest_ready_age_s": round(sample.ages.get(name, 0.0), 3),
                "overdue": sample.overdue.get(name, 0),
                "limits": limits,
                "on_dead": _dead_letter_view(row),
                **in_force,
            }
        )
    return views


def _dead_letter_view(row: dict[str, Any]) -> dict[str, Any] | None:
    """Where dead letters go: the target's origin only (a webhook URL's path may be a secret)."""
    target = row["on_dead_target"]
    if not target:
        return None
    parts = urlsplit(target["url"])
    return {"origin": f"{parts.scheme}://{parts.netloc}", "queue": row["on_dead_queue"]}
