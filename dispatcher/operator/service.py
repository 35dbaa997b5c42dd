"""The operator service: every action an operator can take on jobs, queues, dead letters and
schedules, one typed method each, shared by the HTTP API, the console and the CLI.

Each action checks its input, acts, updates its metrics and writes one audit line naming who
asked (`Actor`: a token, a console session, or the OS user of a CLI call) and what came of it.
A refusal is an `OperatorError` (dispatcher.operator.errors) that changed nothing; each door maps
those once (HTTP: a problem document; console: its error page; CLI: an exit code). The reads
here are the ones an action's door shows next to it (the queue overview, schedule status)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from dispatcher.config.settings import NAME_PATTERN, Settings
from dispatcher.core import rfc3339
from dispatcher.cron.expression import PeriodError
from dispatcher.cron.service import CronService, UnknownSchedule
from dispatcher.db.bulk import BulkStore
from dispatcher.db.jobs import JobRepository
from dispatcher.db.key_limits import KeyLimitsRepository
from dispatcher.db.queue_limits import QueueSettingsRepository, QueueSettingsRow
from dispatcher.db.runs import TriggerFailed
from dispatcher.engine.sampler import MetricsSampler
from dispatcher.intake.requests import DeadLetterRequest
from dispatcher.observability import metrics
from dispatcher.operator import audit, bulk
from dispatcher.operator.audit import Actor
from dispatcher.operator.bulk import TRANSITIONS, BulkRequest
from dispatcher.operator.errors import Conflict, Invalid, NotFound, OperatorError, Unavailable
from dispatcher.operator.key_limits import KeyLimits, clear_key_limits, set_key_limits
from dispatcher.operator.operations import (
    long_past,
    move_dead_letters,
    queue_overview,
    unknown_queue,
)
from dispatcher.operator.queue_limits import SettingsChangeError, validate_change

log = logging.getLogger("dispatcher.operator")

# The queue overview's job counts may be this old: concurrent requests share one sample.
OVERVIEW_MAX_AGE_S = 1.0
# Why each one-job action refuses in the state it finds (`{id}`, `{state}`), and a hint for
# some states: the rules of the bulk actions (one table for both).
JOB_REFUSALS: dict[str, tuple[str, dict[str, str]]] = {
    action: ("job {id} is {state}; " + TRANSITIONS[action].rule, TRANSITIONS[action].hints)
    for action in ("retry", "discard", "reschedule", "run_now")
}
JOB_REFUSALS["cancel"] = (
    "job {id} is already {state}; nothing to cancel",
    TRANSITIONS["cancel"].hints,
)


def _nothing() -> None:
    return None


class Operator:
    """The operator actions of one daemon (or of one CLI call, on its own pool).

    `on_ready` is told when an action made jobs ready (the workers look at once); `schedules`
    is the cron service, None when the caller has none (then every schedule is unknown)."""

    def __init__(
        self,
        repo: JobRepository,
        settings: Settings,
        *,
        sampler: MetricsSampler | None = None,
        schedules: CronService | None = None,
        on_ready: Callable[[], None] = _nothing,
    ):
        self.repo = repo
        self.settings = settings
        self.sampler = sampler or MetricsSampler(repo, settings.overdue_after_s)
        self.schedules = schedules
        self._on_ready = on_ready

    # jobs ---------------------------------------------------------------------------------
    async def retry(self, actor: Actor, job_id: int) -> dict[str, Any]:
        """A dead, cancelled or discarded job back to ready with a fresh attempt budget."""
        with _audited(actor, "retry", f"job {job_id}"):
            row = await self._job_action("retry", job_id)
            self._on_ready()
            return row

    async def cancel(self, actor: Actor, job_id: int) -> dict[str, Any]:
        """No further attempt of a waiting job; a running one is asked to stop."""
        with _audited(actor, "cancel", f"job {job_id}"):
            row = await self._job_action("cancel", job_id)
            if row["state"] == "cancelled":
                metrics.JOBS_COMPLETED.labels(row["queue"], "cancelled").inc()
            return row

    async def discard(self, actor: Actor, job_id: int) -> dict[str, Any]:
        """A dead job set aside: terminal `discarded`, kept for the dead retention."""
        with _audited(actor, "discard", f"job {job_id}"):
            row = await self._job_action("discard", job_id)
            log.info("discarded by an operator", extra={"job_id": row["id"], "job_key": row["key"]})
            return row

    async def reschedule(
        self, actor: Actor, job_id: int, due_at: datetime | None
    ) -> dict[str, Any]:
        """A scheduled or ready job moved to `due_at` (None: now, `ready` at once)."""
        subject = f"job {job_id} to {rfc3339.format(due_at) if due_at else 'now'}"
        with _audited(actor, "reschedule", subject):
            tolerance_s = self.settings.due_at_past_tolerance_s
            if due_at is not None and (why := long_past(due_at, datetime.now(UTC), tolerance_s)):
                raise Invalid(why, "due_at")
            return await self._move("reschedule", job_id, due_at)

    async def run_now(self, actor: Actor, job_id: int) -> dict[str, Any]:
        """A scheduled job made ready now, ahead of its due time (a ready job is refused: it
        is ready already)."""
        with _audited(actor, "run_now", f"job {job_id}"):
            return await self._move("run_now", job_id, None)

    async def _move(self, action: str, job_id: int, due_at: datetime | None) -> dict[str, Any]:
        outcome = await self.repo.reschedule(job_id, due_at, TRANSITIONS[action].states)
        if isinstance(outcome, str):
            raise self._refusal(action, job_id, outcome)
        if outcome is None:
            raise NotFound(f"no job {job_id}")
        if outcome["state"] == "ready":
            self._on_ready()
        return outcome

    async def _job_action(self, action: str, job_id: int) -> dict[str, Any]:
        row: dict[str, Any] | None = await getattr(self.repo, action)(job_id)
        if row is not None:
            return row
        current = await self.repo.get(job_id)
        if current is None:
            raise NotFound(f"no job {job_id}")
        raise self._refusal(action, job_id, current["state"])

    @staticmethod
    def _refusal(action: str, job_id: int, state: str) -> Conflict:
        text, hints = JOB_REFUSALS[action]
        return Conflict(text.format(id=job_id, state=state) + hints.get(state, ""), state=state)

    # dead letters -------------------------------------------------------------------------
    async def move_dead_letters(
        self, actor: Actor, action: str, request: DeadLetterRequest
    ) -> dict[str, Any]:
        """Bulk `redrive` or `discard` of the dead letters `request` selects (or its dry run):
        the result has `count` (moved, or matching) and `batches`."""
        verb = f"{action} dead letters{' (dry run)' if request.dry_run else ''}"
        with _audited(actor, verb, _selection(request)) as outcome:
            if request.queue is not None and (why := await unknown_queue(self.repo, request.queue)):
                raise Invalid(why, "queue")
            result = await move_dead_letters(self.repo, action, request)
            outcome[0] = f"{'matched' if request.dry_run else 'moved'} {result['count']}"
            if result["count"] and not request.dry_run:
                log.warning("%s of %d dead jobs by an operator", action, result["count"])
                if action == "redrive":
                    self._on_ready()
            return result

    async def bulk(self, actor: Actor, request: BulkRequest) -> dict[str, Any]:
        """A bulk action (`request.action`: retry, cancel, discard, reschedule, run_now) on the
        jobs of a selection, or its dry run (dispatcher.operator.bulk): what was applied, what
        was skipped per state and why, what was busy."""
        verb = f"bulk {request.action}{' (dry run)' if request.dry_run else ''}"
        with _audited(actor, verb, bulk.describe(request)) as outcome:
            bulk.check(request)
            tolerance_s = self.settings.due_at_past_tolerance_s
            due_at = request.due_at
            if due_at is not None and (why := long_past(due_at, datetime.now(UTC), tolerance_s)):
                raise Invalid(why, "due_at")
            queue = request.selection.filters.queue if request.selection.filters else None
            if queue is not None and (why := await unknown_queue(self.repo, queue)):
                raise Invalid(why, "filter.queue")
            store = BulkStore(self.repo.pool)
            if request.dry_run:
                result = await bulk.dry_run(store, request)
                outcome[0] = f"would apply {result['would_apply']} of {result['matched']}"
                return result
            result = await bulk.apply(store, request, actor.name)
            outcome[0] = _bulk_outcome(result)
            if not result["replayed"]:
                self._count_bulk(request.action, result)
            if result["became"].get("ready"):
                self._on_ready()
            return result

    @staticmethod
    def _count_bulk(action: str, result: dict[str, Any]) -> None:
        skipped = sum(s["count"] for s in result["skipped"].values())
        for outcome, n in (("applied", result["applied"]), ("skipped", skipped),
                           ("busy", result["busy"])):  # fmt: skip
            if n:
                metrics.BULK_JOBS.labels(action, outcome).inc(n)
        if result["applied"]:
            log.warning("bulk %s of %d jobs by an operator", action, result["applied"])

    # queues -------------------------------------------------------------------------------
    async def queues(self, max_age_s: float = OVERVIEW_MAX_AGE_S) -> list[dict[str, Any]]:
        """Every queue of the registry with its counts (a sample at most `max_age_s` old) and
        its live settings with their sources and run-window state."""
        registry = await self.repo.list_queues()  # live: a pause shows at once
        sample = self.sampler.latest(max_age_s) or await self.sampler.sample(max_age_s)
        return queue_overview(registry, sample, self.settings, await self.live_settings())

    async def live_settings(self) -> dict[str, QueueSettingsRow]:
        """Every queue's settings from the file and its run-time overrides (migration 025)."""
        return {row.name: row for row in await QueueSettingsRepository(self.repo.pool).all()}

    async def change_queue_settings(
        self, actor: Actor, name: str, change: Any | None
    ) -> dict[str, Any]:
        """Change queue `name`'s live settings at run time (`change`: a JSON merge patch, null
        removes one override) or, with None, remove every override; on every daemon within a
        second. NotFound for an unknown queue, Invalid naming the field; nothing changes."""
        verb = "reset settings" if change is None else "change settings"
        with _audited(actor, verb, f"queue {name[:100]!r}"):
            await self.queue(name)
            store = QueueSettingsRepository(self.repo.pool)
            if change is None:
                row = await store.reset_overrides(name)
            else:
                try:
                    valid = validate_change(change, (await self.live_settings()).get(name))
                except SettingsChangeError as exc:
                    raise Invalid(exc.reason, exc.field) from None
                row = await store.set_overrides(name, valid)
            if row is None:  # removed from the registry meanwhile
                raise await self._no_queue(name)
            log.warning("queue %s settings %s by an operator", name, change or "reset")
            registry = [q for q in await self.repo.list_queues() if q["name"] == name]
            sample = self.sampler.latest(OVERVIEW_MAX_AGE_S) or await self.sampler.sample()
            return queue_overview(registry, sample, self.settings, {name: row})[0]

    async def set_queue_paused(self, actor: Actor, name: str, *, paused: bool) -> dict[str, Any]:
        """Pause or resume queue `name` on every daemon of the database (idempotent); its
        overview entry after."""
        with _audited(actor, "pause" if paused else "resume", f"queue {name[:100]!r}"):
            known_name = re.match(NAME_PATTERN, name) is not None
            row = await self.repo.set_queue_paused(name, paused) if known_name else None
            if row is None:
                raise await self._no_queue(name)
            metrics.QUEUE_PAUSED.labels(name).set(1 if paused else 0)
            log.warning("queue %s %s by an operator", name, "paused" if paused else "resumed")
            sample = await self.sampler.sample(max_age_s=OVERVIEW_MAX_AGE_S)
            return queue_overview([row], sample, self.settings, await self.live_settings())[0]

    async def set_key_limits(
        self, actor: Actor, queue: str, key: str, limits: KeyLimits
    ) -> dict[str, Any]:
        """Give concurrency key `key` of `queue` its own limits (persisted, every daemon's next
        claim honours them); the override stored."""
        with _audited(actor, "key-limits", f"key {key[:100]!r} of queue {queue[:100]!r}"):
            return await set_key_limits(KeyLimitsRepository(self.repo.pool), queue, key, limits)

    async def clear_key_limits(self, actor: Actor, queue: str, key: str) -> dict[str, Any]:
        """Key `key` of `queue` goes back to the queue's key limits; whether it had its own."""
        with _audited(actor, "key-limits-reset", f"key {key[:100]!r} of queue {queue[:100]!r}"):
            await self.queue(queue)
            had = await clear_key_limits(KeyLimitsRepository(self.repo.pool), queue, key)
            return {"queue": queue, "key": key, "had_override": had}

    async def queue(self, name: str) -> None:
        """Nothing if queue `name` is in the registry; else NotFound listing the queues (a
        door's confirmation page asks before it offers the action)."""
        if name not in [q["name"] for q in await self.repo.list_queues()]:
            raise await self._no_queue(name)

    async def _no_queue(self, name: str) -> NotFound:
        known = [q["name"] for q in await self.repo.list_queues()]
        return NotFound(f"no queue {name[:100]!r}; queues: {', '.join(known)}", queues=known)

    # schedules ----------------------------------------------------------------------------
    def schedule(self, name: str) -> CronService:
        """The cron service, if it has a schedule `name`; else NotFound naming the known ones."""
        if self.schedules is None:
            raise NotFound(f"no schedule {name[:100]!r} (known: none configured)")
        if name not in self.schedules.names():
            known = ", ".join(sorted(self.schedules.names())) or "none configured"
            raise NotFound(f"no schedule {name[:100]!r} (known: {known})")
        return self.schedules

    async def schedule_status(self) -> list[dict[str, Any]]:
        return [] if self.schedules is None else await self.schedules.status()

    async def set_schedule_paused(self, actor: Actor, name: str, *, paused: bool) -> dict[str, Any]:
        """Pause or resume schedule `name` on every daemon (idempotent); its status after."""
        with _audited(actor, "pause" if paused else "resume", f"schedule {name[:100]!r}"):
            service = self.schedule(name)
            return await (service.pause(name) if paused else service.resume(name))

    async def trigger(
        self, actor: Actor, name: str, period_start: str, *, dry_run: bool = False
    ) -> dict[str, Any]:
        """The run of one period of schedule `name` (RFC 3339 start), created if it has none
        (`outcome` created or existing), or what the dry run would do."""
        with _audited(actor, f"trigger{' (dry run)' if dry_run else ''}", f"schedule {name!r}"):
            service = self.schedule(name)
            period = _instant(period_start, "period_start")
            with _cron_refusals("period_start"):
                if dry_run:
                    return {**(await service.plan_trigger(name, period)).to_json(), "dry_run": True}
                return (await service.trigger(name, period)).to_json()

    async def catch_up(
        self, actor: Actor, name: str, start: str, end: str, *, dry_run: bool = False
    ) -> dict[str, Any]:
        """The runs of every period of schedule `name` in [start, end] that has none, created
        (`created`, `existing`), or what the dry run would create (`would_create`)."""
        with _audited(actor, f"catch-up{' (dry run)' if dry_run else ''}", f"schedule {name!r}"):
            service = self.schedule(name)
            first, last = _instant(start, "from"), _instant(end, "to")
            with _cron_refusals(None):
                if dry_run:
                    planned = [p.to_json() for p in await service.plan_catch_up(name, first, last)]
                    would = sum(p["outcome"] == "would_create" for p in planned)
                    body = {"schedule": name, "dry_run": True, "runs": planned}
                    return {**body, "would_create": would, "existing": len(planned) - would}
                receipts = [r.to_json() for r in await service.catch_up(name, first, last)]
            created = sum(r["outcome"] == "created" for r in receipts)
            if created:
                self._on_ready()
            body = {"schedule": name, "dry_run": False, "runs": receipts, "created": created}
            return {**body, "existing": len(receipts) - created}


@contextmanager
def _audited(actor: Actor, action: str, subject: str) -> Iterator[list[str]]:
    """Write the action's audit line once it ends: `done` (or what the body set in the list it
    is given), `refused: <why>`, or `failed: <error type>`."""
    outcome = ["done"]
    try:
        yield outcome
    except OperatorError as exc:
        audit.record(actor, action, subject, f"refused: {exc.detail}")
        raise
    except BaseException as exc:
        audit.record(actor, action, subject, f"failed: {type(exc).__name__}")
        raise
    audit.record(actor, action, subject, outcome[0])


@contextmanager
def _cron_refusals(field: str | None) -> Iterator[None]:
    """The cron service's refusals as operator errors: a period it cannot take is invalid
    input (`field`), a run it could not create may be asked for again (idempotent)."""
    try:
        yield
    except PeriodError as exc:
        raise Invalid(str(exc), field) from None
    except UnknownSchedule as exc:
        raise NotFound(str(exc)) from None
    except TriggerFailed as exc:
        raise Unavailable(f"{exc}; retry the same request (it is idempotent)") from None


def _instant(value: str, field: str) -> datetime:
    try:
        return rfc3339.parse(value.strip())
    except rfc3339.TimeError as exc:
        raise Invalid(str(exc), field) from None


def _bulk_outcome(result: dict[str, Any]) -> str:
    """A bulk action's counts, for its audit line."""
    skipped = ", ".join(f"{s} {v['count']}" for s, v in result["skipped"].items())
    text = f"applied {result['applied']} of {result['matched']}"
    text += f", skipped {skipped}" if skipped else ""
    text += f", busy {result['busy']}" if result["busy"] else ""
    if result.get("not_found"):
        text += f", not found {result['not_found']}"
    replayed = ", replayed" if result["replayed"] else ""
    return text + f" (bulk_id {result['bulk_id'][:80]!r}{replayed})"


def _selection(request: DeadLetterRequest) -> str:
    """The filters of a bulk call, for its audit line."""
    given = request.model_dump(exclude={"dry_run"}, exclude_defaults=True)
    return " ".join(f"{k}={v}" for k, v in given.items()) or "(no filter)"
