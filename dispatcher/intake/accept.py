"""Intake: semantic validation of job requests and their durable, idempotent acceptance.

Shape validation happens in `dispatcher.intake.requests`; here we check what needs the
configuration (known
handler and queue, a safe target, a due time not in the past) and then hand valid items to the
same SQL function applications call, so both doors share one set of idempotency rules.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from dispatcher.config.settings import Settings
from dispatcher.core import jsoncodec, rfc3339
from dispatcher.core.payload_size import oversize
from dispatcher.db.jobs import JobRepository
from dispatcher.errors import DatabaseUnavailable
from dispatcher.intake.requests import JobRequest
from dispatcher.model import EnqueueResult, NewJob, Rejected
from dispatcher.observability import metrics
from dispatcher.observability.tracing import Tracing

# Valid targets are remembered by their JSON text, within a budget of characters: a target may
# be as large as the body limit (256 kB by default), and the 4,096 entries once allowed could
# hold 1.6 GB. The normalized targets take about as much again as their texts. Targets larger
# than an entry's cap are validated every time (they are rare, and cost no more to check).
TARGET_CACHE_CHARS = 4 * 1024 * 1024
TARGET_CACHE_ENTRY_MAX_CHARS = 16 * 1024
TargetValidator = Callable[[dict[str, Any]], dict[str, Any]]


class Intake:
    def __init__(
        self,
        settings: Settings,
        repo: JobRepository,
        validate_target: TargetValidator,
        on_accepted: Callable[[str], None] = lambda _state: None,
        refusal: Callable[[], str | None] = lambda: None,
        tracing: Tracing | None = None,
    ):
        self._settings = settings
        self._tracing = tracing
        self._refusal = refusal  # why no job can be accepted now (a full disk), if so
        self._repo = repo
        self._validate_target = validate_target
        self._on_accepted = on_accepted
        self._handlers = {"http", *settings.handlers}
        self._writer = GroupWriter(repo)
        self._targets: dict[str, dict[str, Any]] = {}  # oldest first
        self._target_chars = 0
        self._m_accepted = {q: metrics.JOBS_ACCEPTED.labels(q, "api") for q in settings.queues}

    def _normalized_target(self, target: dict[str, Any]) -> dict[str, Any]:
        """Validate a target, remembering valid ones: a batch usually repeats one target."""
        key = jsoncodec.dumps(target, sort_keys=True)
        normalized = self._targets.get(key)
        if normalized is None:
            normalized = self._validate_target(target)
            if len(key) <= TARGET_CACHE_ENTRY_MAX_CHARS:
                self._remember_target(key, normalized)
        return normalized

    def _remember_target(self, key: str, normalized: dict[str, Any]) -> None:
        self._targets[key] = normalized
        self._target_chars += len(key)
        while self._target_chars > TARGET_CACHE_CHARS:
            oldest = next(iter(self._targets))
            del self._targets[oldest]
            self._target_chars -= len(oldest)

    def notify_accepted(self) -> None:
        """Tell the workers that jobs became ready outside `accept` (e.g. an operator retry)."""
        self._on_accepted("ready")

    def check(
        self, key: str, request: JobRequest, now: datetime, traceparent: str | None = None
    ) -> NewJob | Rejected:
        """Validate against the configuration; return the job to store or why it is refused."""
        if request.handler not in self._handlers:
            known = ", ".join(sorted(self._handlers))
            return Rejected(422, f"handler: unknown handler {request.handler!r}; known: {known}")
        queue = request.queue or "default"
        if queue not in self._settings.queues:
            known = ", ".join(sorted(self._settings.queues))
            return Rejected(422, f"queue: unknown queue {queue!r}; configured: {known}")
        target = request.target
        if request.handler == "http":
            if target is None:
                return Rejected(
                    422, 'target: required for handler "http", e.g. {"url": "https://..."}'
                )
            try:
                target = self._normalized_target(target)
            except ValueError as exc:
                return Rejected(422, str(exc))
        elif target is not None:
            return Rejected(
                422, f'target: only handler "http" takes a target, not {request.handler!r}'
            )
        limit = self._settings.limits.max_payload_bytes
        if (size := oversize(request.payload, target, limit)) is not None:
            return Rejected(
                413,
                f"payload: the payload and target are {size} bytes of JSON, over "
                f"limits.max_payload_bytes ({limit}); store large data elsewhere and pass a "
                "reference",
            )
        due_at = request.due_at
        if due_at is not None:  # with an offset: JobRequest refuses a time without one
            tolerance = timedelta(seconds=self._settings.due_at_past_tolerance_s)
            if due_at < now - tolerance:
                return Rejected(
                    422,
                    f"due_at: {rfc3339.format(due_at)} is more than "
                    f"{tolerance.total_seconds():.0f} s in the past; omit due_at to run now",
                )
        contract = self._contract(request, now)
        if isinstance(contract, Rejected):
            return contract
        return NewJob(
            key=key,
            handler=request.handler,
            payload=request.payload,
            due_at=due_at,
            queue=request.queue,
            tenant=request.tenant,
            target=target,
            max_attempts=request.max_attempts,
            max_retry_age_s=request.max_retry_age_s,
            traceparent=traceparent,
            **contract,
            priority=request.priority,
            concurrency_key=request.stored_concurrency_key(),
            on_key=request.on_key,
            debounce_max_s=request.debounce_max_s,
        )

    def _contract(self, request: JobRequest, now: datetime) -> dict[str, Any] | Rejected:
        """The job's own deadline, time to live and callback targets, checked against the
        configuration: a deadline within the handler's, a TTL still ahead, and callback targets
        that pass the same checks (and SSRF guard) as an http job's target."""
        if request.timeout_s is not None:
            if request.handler == "http":
                return Rejected(
                    422,
                    'timeout_s: an "http" job\'s deadline is target.timeout_s '
                    f"(at most {self._settings.http.max_timeout_s:g} s); move it there",
                )
            limit_s = self._settings.handlers[request.handler].timeout_s
            if request.timeout_s > limit_s:
                return Rejected(
                    422,
                    f"timeout_s: {request.timeout_s:g} s is more than handler "
                    f"{request.handler!r} allows ({limit_s:g} s, its timeout_s); ask for at "
                    "most that, or raise the handler's timeout_s",
                )
        if request.expires_at is not None and request.expires_at <= now:
            return Rejected(
                422,
                f"expires_at: {rfc3339.format(request.expires_at)} has passed; the job could "
                "never start (omit expires_at, or give a later time)",
            )
        callbacks: dict[str, dict[str, Any] | None] = {}
        for field in ("on_success", "on_failure"):
            target = getattr(request, field)
            if target is not None:
                try:
                    target = self._normalized_target(target)
                except ValueError as exc:
                    return Rejected(422, f"{field}: {exc}")
            callbacks[field] = target
        return {"timeout_s": request.timeout_s, "expires_at": request.expires_at, **callbacks}

    async def accept(
        self, items: Sequence[tuple[str, JobRequest]], traceparent: str | None = None
    ) -> list[EnqueueResult | Rejected]:
        """Accept many; a bad item never rejects the others. Order of results = order of items.
        `traceparent`: the request's W3C trace context (used only while tracing is on; an
        invalid one is ignored)."""
        if self._tracing is None:
            return await self._accept(items, None)
        with self._tracing.intake(traceparent, len(items)) as (span, stored):
            results = await self._accept(items, stored)
            self._tracing.describe_intake(span, items, results)
            return results

    async def _accept(
        self, items: Sequence[tuple[str, JobRequest]], traceparent: str | None
    ) -> list[EnqueueResult | Rejected]:
        refused = self._refusal()
        if refused is not None:  # 503: the client retries the same request later
            raise DatabaseUnavailable(refused)
        now = datetime.now(UTC)
        checked = [self.check(key, request, now, traceparent) for key, request in items]
        valid = [c for c in checked if isinstance(c, NewJob)]
        if len(valid) == 1:  # single requests arriving together share one statement and commit
            stored = iter([await self._writer.submit(valid[0])])
        else:
            stored = iter(await self._repo.enqueue_many(valid) if valid else [])
        stored = iter(await self._replace(valid, list(stored)))
        results: list[EnqueueResult | Rejected] = []
        created_states: set[str] = set()
        for c in checked:
            if isinstance(c, Rejected):
                results.append(c)
                continue
            result = next(stored)
            if result.outcome == "created":
                created_states.add(result.state)
                self._m_accepted[c.queue or "default"].inc()
            results.append(result)
        for state in created_states:
            self._on_accepted(state)
        return results

    async def _replace(
        self, jobs: list[NewJob], results: list[EnqueueResult]
    ) -> list[EnqueueResult]:
        """Key modes: the items that met another request under their key, and asked to replace
        it, replace it while it is still scheduled (`replace_scheduled`)."""
        asked = [
            n
            for n, (job, result) in enumerate(zip(jobs, results, strict=True))
            if job.on_key != "reject" and result.outcome == "conflict"
        ]
        if not asked:
            return results
        replaced = await self._repo.replace_scheduled([jobs[n] for n in asked])
        for n, result in zip(asked, replaced, strict=True):
            results[n] = result or results[n]
        if any(r is not None and r.outcome == "replaced" for r in replaced):
            self._on_accepted("scheduled")  # the due-scan's next time may have moved
        return results


class GroupWriter:
    """Concurrent single-job requests are written together: one `enqueue_many` call, one commit,
    one NOTIFY for all of them (group commit). A lone request is written at once; requests that
    arrive while a write is in flight form the next group. Idempotency is unchanged: duplicates
    inside a group resolve exactly as across groups."""

    MAX_GROUP = 1000

    def __init__(self, repo: JobRepository):
        self._repo = repo
        self._pending: list[tuple[NewJob, asyncio.Future[EnqueueResult]]] = []
        self._task: asyncio.Task[None] | None = None

    async def submit(self, job: NewJob) -> EnqueueResult:
        future: asyncio.Future[EnqueueResult] = asyncio.get_running_loop().create_future()
        self._pending.append((job, future))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain(), name="intake-writer")
        return await future

    async def _drain(self) -> None:
        while self._pending:
            group = self._pending[: self.MAX_GROUP]
            del self._pending[: self.MAX_GROUP]
            await self._write(group)

    async def _write(self, group: list[tuple[NewJob, asyncio.Future[EnqueueResult]]]) -> None:
        try:
            results = await self._repo.enqueue_many([job for job, _ in group])
        except DatabaseUnavailable as exc:
            # nothing was written, and one by one every item would wait on the same outage
            for _, future in group:
                if not future.done():
                    future.set_exception(exc)
            return
        except Exception as exc:
            if len(group) == 1:
                _, future = group[0]
                if not future.done():
                    future.set_exception(exc)
                return
            for single in group:  # one bad item must not fail the others: retry one by one
                await self._write([single])
            return
        for (_, future), result in zip(group, results, strict=True):
            if not future.done():
                future.set_result(result)
