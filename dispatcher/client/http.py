"""The HTTP API from Python: `Client` (sync, standard library only) and `AsyncClient` (aiohttp).

Both send the same requests (built once, below) and follow one retry policy: a 503 or 429
answer (the daemon cannot reach its database, or a limit pushes back) is retried after its
`Retry-After`, else after an exponential backoff with full jitter, up to `RetryPolicy`'s bounds.
A connection that cannot be made is retried the same way. Enqueueing carries an idempotency key
on every try, so a retry after a lost answer returns the job the first try created; the
operator actions (retry, cancel) are retried only when nothing reached the daemon.
"""

from __future__ import annotations

import email.utils
import json
import random
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from dispatcher.core import rfc3339

JobView = dict[str, Any]  # the API's JSON for a job (README: HTTP API), as parsed
RETRIED_STATUSES = frozenset({429, 503})


class ApiError(Exception):
    """An answer other than 2xx: `status`, the problem document's `detail`, and the document."""

    def __init__(self, status: int, detail: str, problem: Mapping[str, Any] | None = None):
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail
        self.problem = dict(problem or {})


class Conflict(ApiError):
    """409: the key names a job with a different request, or the job's state refuses the action."""


class NotFound(ApiError):
    """404: no such job."""


class Unavailable(ApiError):
    """429/503 still answered when the retry policy ran out (or a connection never made)."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how long to retry a 429/503 or a failed connection.

    `attempts` counts every try (1 = never retry). A `Retry-After` is honoured up to
    `max_delay_s`; without one the n-th retry waits a random time up to
    `min(max_delay_s, base_delay_s * 2**n)` (full jitter: many clients spread out)."""

    attempts: int = 6
    base_delay_s: float = 0.2
    max_delay_s: float = 30.0

    def delay_s(self, retry: int, retry_after: str | None) -> float:
        told = parse_retry_after(retry_after)
        if told is not None:
            return min(told, self.max_delay_s)
        return random.uniform(0, min(self.max_delay_s, self.base_delay_s * 2**retry))


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds to wait from a `Retry-After` header (delta-seconds or an HTTP date), or None."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a job list; `next_cursor` fetches the next (None: this was the last)."""

    items: list[JobView]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class Job:
    """One item for `enqueue_many`: the arguments of `enqueue`."""

    key: str
    handler: str
    payload: dict[str, Any] | None = None
    target: dict[str, Any] | None = None
    due_at: datetime | str | None = None
    queue: str | None = None
    tenant: str | None = None
    max_attempts: int | None = None
    max_retry_age_s: int | None = None
    # per-job contracts (docs/guides/deadlines.md, docs/guides/callbacks.md)
    timeout_s: float | None = None
    expires_at: datetime | str | None = None
    on_success: dict[str, Any] | None = None
    on_failure: dict[str, Any] | None = None
    priority: int | None = None  # -100..100, lower runs first (None: the daemon's 0)
    concurrency_key: str | None = None  # None: the tenant; "": no key (sent as null)
    # the key's mode when it names a job with another request: "reject" (the daemon's
    # default), "replace" (debounce, bounded by debounce_max_s) or "keep_due" (throttle)
    on_key: str | None = None
    debounce_max_s: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # fields newer than this client


@dataclass(frozen=True, slots=True)
class Call:
    """One API request, whichever client sends it. `replayable`: safe to send again after a
    failure that may have reached the daemon (it carries an idempotency key, or only reads)."""

    method: str
    path: str
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    replayable: bool = True


def job_body(job: Job) -> dict[str, Any]:
    body: dict[str, Any] = {"handler": job.handler, "payload": job.payload or {}}
    optional = {
        "target": job.target,
        "due_at": _time("due_at", job.due_at),
        "queue": job.queue,
        "tenant": job.tenant,
        "max_attempts": job.max_attempts,
        "max_retry_age_s": job.max_retry_age_s,
        "timeout_s": job.timeout_s,
        "expires_at": _time("expires_at", job.expires_at),
        "on_success": job.on_success,
        "on_failure": job.on_failure,
        "priority": job.priority,
        "concurrency_key": job.concurrency_key,
        "on_key": job.on_key,
        "debounce_max_s": job.debounce_max_s,
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    if job.concurrency_key == "":
        body["concurrency_key"] = None  # no key (omitted would mean the tenant)
    body.update(job.extra)
    return body


def _time(name: str, value: datetime | str | None) -> str | None:
    if not isinstance(value, datetime):
        return value
    try:
        return rfc3339.format(value)
    except rfc3339.TimeError as exc:
        raise ValueError(f"{name} needs a timezone (e.g. datetime.now(UTC)): {exc}") from None


def enqueue_call(job: Job) -> Call:
    return Call("POST", "/v1/jobs", job_body(job), {"Idempotency-Key": job.key})


def batch_call(jobs: Sequence[Job]) -> Call:
    items = [{**job_body(job), "idempotency_key": job.key} for job in jobs]
    return Call("POST", "/v1/jobs/batch", {"jobs": items})


def list_call(filters: Mapping[str, Any], limit: int, cursor: str | None) -> Call:
    query: dict[str, str] = {"limit": str(limit)}
    for name, value in filters.items():
        if value is not None:
            query[name] = rfc3339.format(value) if isinstance(value, datetime) else str(value)
    if cursor is not None:
        query["cursor"] = cursor
    return Call("GET", "/v1/jobs?" + urllib.parse.urlencode(query))


def action_call(job_id: int, action: str) -> Call:
    return Call("POST", f"/v1/jobs/{int(job_id)}/{action}", replayable=False)


def answer(status: int, raw: bytes, content_type: str) -> Any:
    """The JSON of a 2xx answer, else the ApiError its problem document describes."""
    document: Any = None
    if raw and "json" in content_type:
        try:
            document = json.loads(raw)
        except ValueError:
            document = None
    if 200 <= status < 300:
        return document
    problem = document if isinstance(document, dict) else {}
    detail = str(
        problem.get("detail") or problem.get("title") or raw[:200].decode(errors="replace")
    )
    kind = {404: NotFound, 409: Conflict, 429: Unavailable, 503: Unavailable}.get(status, ApiError)
    return kind(status, detail, problem)


class _Base:
    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout_s: float = 30.0,
        retry: RetryPolicy | None = None,
        on_retry: Callable[[ApiError, float], None] | None = None,
    ) -> None:
        """`on_retry(error, delay_s)` is called before each wait (to log it, or count it)."""
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url {base_url!r}: give http:// or https:// and host:port")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.retry_policy = retry or RetryPolicy()
        self.on_retry = on_retry
        self._headers = {"Accept": "application/json", "User-Agent": "dispatcher-client"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"

    def _request_headers(self, call: Call) -> dict[str, str]:
        headers = {**self._headers, **call.headers}
        if call.body is not None:
            headers["Content-Type"] = "application/json"
        return headers

    def _retry_delay_s(
        self, tries: int, outcome: ApiError, retry_after: str | None
    ) -> float | None:
        """The wait before the next try, or None to give up and report `outcome`."""
        if tries >= self.retry_policy.attempts:
            return None
        if outcome.status not in (*RETRIED_STATUSES, 0):
            return None
        delay = self.retry_policy.delay_s(tries - 1, retry_after)
        if self.on_retry is not None:
            self.on_retry(outcome, delay)
        return delay


def _body_bytes(call: Call) -> bytes | None:
    return None if call.body is None else json.dumps(call.body).encode()


def _filters(**given: Any) -> dict[str, Any]:
    return {name: value for name, value in given.items() if value is not None}


class Client(_Base):
    """The API over `urllib` (no dependency): `Client("http://127.0.0.1:8080", token=...)`."""

    def send(self, call: Call) -> Any:
        tries = 0
        while True:
            tries += 1
            retry_after: str | None = None
            try:
                outcome, retry_after = self._once(call)
            except _Transport as exc:
                if not (call.replayable or exc.before_sending):
                    raise Unavailable(0, f"{self.base_url}: {exc.reason}") from None
                outcome = Unavailable(0, f"cannot reach {self.base_url}: {exc.reason}")
            if not isinstance(outcome, ApiError):
                return outcome
            delay = self._retry_delay_s(tries, outcome, retry_after)
            if delay is None:
                raise outcome
            time.sleep(delay)

    def _once(self, call: Call) -> tuple[Any, str | None]:
        request = urllib.request.Request(
            self.base_url + call.path,
            data=_body_bytes(call),
            headers=self._request_headers(call),
            method=call.method,
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return answer(response.status, response.read(), _ctype(response)), None
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            return answer(exc.code, raw, _ctype(exc)), exc.headers.get("Retry-After")
        except urllib.error.URLError as exc:
            refused = isinstance(exc.reason, ConnectionRefusedError)
            raise _Transport(str(exc.reason), before_sending=refused) from None
        except (TimeoutError, ConnectionError) as exc:
            raise _Transport(str(exc) or type(exc).__name__, before_sending=False) from None

    # the API -------------------------------------------------------------------------------
    def enqueue(
        self, key: str, handler: str, payload: dict[str, Any] | None = None, **kw: Any
    ) -> JobView:
        """POST /v1/jobs with `Idempotency-Key: key`; the job (202). The same key and request
        again return the same job; the same key with another request raises Conflict."""
        return dict(self.send(enqueue_call(Job(key, handler, payload, **kw))))

    def enqueue_many(self, jobs: Sequence[Job]) -> list[dict[str, Any]]:
        """POST /v1/jobs/batch (up to 1,000): one result per job, in order, each with `status`
        "accepted", "existing" (with `pruned: true` when its job was pruned), "replaced",
        "not_replaced", "conflict" or "rejected" (and `error`): not a transaction."""
        return list(self.send(batch_call(jobs))["results"])

    def get(self, job_id: int) -> JobView:
        return dict(self.send(Call("GET", f"/v1/jobs/{int(job_id)}")))

    def list_jobs(self, *, limit: int = 50, cursor: str | None = None, **filters: Any) -> Page:
        """One page of GET /v1/jobs; filters: state, queue, key, tenant, run_key, handler, reason,
        due_before, due_after (datetimes or RFC 3339), priority."""
        data = self.send(list_call(_filters(**filters), limit, cursor))
        return Page(list(data["items"]), data.get("next_cursor"))

    def iter_jobs(self, *, page_size: int = 100, **filters: Any) -> Iterator[JobView]:
        """Every matching job, newest first, a page at a time."""
        cursor: str | None = None
        while True:
            page = self.list_jobs(limit=page_size, cursor=cursor, **filters)
            yield from page.items
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def cancel(self, job_id: int) -> JobView:
        return dict(self.send(action_call(job_id, "cancel")))

    def retry(self, job_id: int) -> JobView:
        """Retry a dead or cancelled job with a new attempt budget (POST .../retry)."""
        return dict(self.send(action_call(job_id, "retry")))


class AsyncClient(_Base):
    """The API over aiohttp: `async with AsyncClient(url, token=...) as client: ...`."""

    def __init__(self, base_url: str, **options: Any) -> None:
        super().__init__(base_url, **options)
        self._session: Any = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> Any:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            )
        return self._session

    async def send(self, call: Call) -> Any:
        import asyncio

        tries = 0
        while True:
            tries += 1
            retry_after: str | None = None
            try:
                outcome, retry_after = await self._once(call)
            except _Transport as exc:
                if not (call.replayable or exc.before_sending):
                    raise Unavailable(0, f"{self.base_url}: {exc.reason}") from None
                outcome = Unavailable(0, f"cannot reach {self.base_url}: {exc.reason}")
            if not isinstance(outcome, ApiError):
                return outcome
            delay = self._retry_delay_s(tries, outcome, retry_after)
            if delay is None:
                raise outcome
            await asyncio.sleep(delay)

    async def _once(self, call: Call) -> tuple[Any, str | None]:
        import aiohttp

        try:
            async with self._http().request(
                call.method,
                self.base_url + call.path,
                data=_body_bytes(call),
                headers=self._request_headers(call),
            ) as response:
                raw = await response.read()
                value = answer(response.status, raw, response.headers.get("Content-Type", ""))
                return value, response.headers.get("Retry-After")
        except aiohttp.ClientConnectorError as exc:
            raise _Transport(str(exc), before_sending=True) from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _Transport(str(exc) or type(exc).__name__, before_sending=False) from None

    # the API (as Client's) -----------------------------------------------------------------
    async def enqueue(
        self, key: str, handler: str, payload: dict[str, Any] | None = None, **kw: Any
    ) -> JobView:
        return dict(await self.send(enqueue_call(Job(key, handler, payload, **kw))))

    async def enqueue_many(self, jobs: Sequence[Job]) -> list[dict[str, Any]]:
        return list((await self.send(batch_call(jobs)))["results"])

    async def get(self, job_id: int) -> JobView:
        return dict(await self.send(Call("GET", f"/v1/jobs/{int(job_id)}")))

    async def list_jobs(
        self, *, limit: int = 50, cursor: str | None = None, **filters: Any
    ) -> Page:
        data = await self.send(list_call(_filters(**filters), limit, cursor))
        return Page(list(data["items"]), data.get("next_cursor"))

    async def iter_jobs(self, *, page_size: int = 100, **filters: Any) -> AsyncIterator[JobView]:
        cursor: str | None = None
        while True:
            page = await self.list_jobs(limit=page_size, cursor=cursor, **filters)
            for item in page.items:
                yield item
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def cancel(self, job_id: int) -> JobView:
        return dict(await self.send(action_call(job_id, "cancel")))

    async def retry(self, job_id: int) -> JobView:
        return dict(await self.send(action_call(job_id, "retry")))


class _Transport(Exception):
    """No answer: `before_sending` when the connection was never made (safe to send again)."""

    def __init__(self, reason: str, *, before_sending: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.before_sending = before_sending


def _ctype(response: Any) -> str:
    return str(response.headers.get("Content-Type", ""))
