"""The aiohttp application: routes, authentication, problem responses, health and metrics."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import re
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from aiohttp import web
from aiohttp.typedefs import Handler
from multidict import MultiMapping
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError

from dispatcher.api.filters import (
    FILTERS,
    FilterError,
    next_cursor,
    parse_cursor,
    parse_job_filter,
)
from dispatcher.api.guessing import GuessLimiter, client_address
from dispatcher.api.openapi import openapi_document
from dispatcher.api.problems import Problem, problem
from dispatcher.api.schemas import (
    MAX_BATCH,
    BatchItem,
    BatchRequest,
    RescheduleRequest,
    describe,
    idempotency_key,
    is_ascii_number,
    storable_json,
    summary,
)
from dispatcher.api.scopes import required_scope
from dispatcher.config.settings import NAME_PATTERN, Settings
from dispatcher.config.tokens import SCOPES, ApiToken, digest
from dispatcher.core import jsoncodec, rfc3339
from dispatcher.cron.expression import PeriodError
from dispatcher.db.jobs import JobRepository
from dispatcher.db.queue_limits import QueueSettingsRepository, QueueSettingsRow
from dispatcher.db.runs import TriggerFailed
from dispatcher.engine.sampler import MetricsSampler
from dispatcher.errors import DatabaseUnavailable
from dispatcher.intake.accept import Intake
from dispatcher.intake.requests import DeadLetterRequest, JobRequest
from dispatcher.model import EnqueueResult, Rejected
from dispatcher.observability import metrics
from dispatcher.observability.tracing import TRACEPARENT
from dispatcher.operator.operations import (
    long_past,
    move_dead_letters,
    queue_overview,
    unknown_queue,
)
from dispatcher.operator.queue_limits import SettingsChangeError, validate_change

log = logging.getLogger(__name__)

PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/openapi.json"})
# Who operator actions are logged as when the API has no tokens (loopback only).
ANONYMOUS = "anonymous (no API tokens configured)"
# What a client is told to wait when the database cannot be reached (503 + Retry-After).
RETRY_AFTER_S = 5
Readiness = Callable[[], Awaitable[tuple[bool, str]]]

REPO = web.AppKey("repo", JobRepository)
INTAKE = web.AppKey("intake", Intake)
READINESS = web.AppKey("readiness", object)
TOKENS = web.AppKey("tokens", list)
SCHEDULES: web.AppKey[Any] = web.AppKey("schedules")  # the cron service (or None)
BODY_LIMIT = web.AppKey("body_limit_bytes", int)
BODY_TIMEOUT = web.AppKey("body_read_timeout_s", float)
SETTINGS = web.AppKey("settings", Settings)
SAMPLER = web.AppKey("sampler", MetricsSampler)
# Set on a sub-application that authenticates its own requests (the console: session cookies);
# the bearer-token check below leaves its routes to it.
OWN_AUTH = web.AppKey("own_auth", bool)
# Failed authentications per client address (the console's sign-in counts here too).
GUESSES = web.AppKey("guesses", GuessLimiter)
# The queue overview's job counts may be this old: concurrent requests share one sample.
OVERVIEW_MAX_AGE_S = 1.0
M = TypeVar("M", bound=BaseModel)


def create_app(
    *,
    repo: JobRepository,
    intake: Intake,
    readiness: Readiness,
    tokens: Sequence[str | ApiToken],
    body_limit_bytes: int,
    schedules: Any = None,
    body_read_timeout_s: float = 30.0,
    settings: Settings | None = None,
    sampler: MetricsSampler | None = None,
) -> web.Application:
    app = web.Application(
        client_max_size=body_limit_bytes, middlewares=[problem_middleware, auth_middleware]
    )
    # Each route needs a token scope: dispatcher.api.scopes.ROUTE_SCOPES (add new routes there).
    app[REPO] = repo
    app[INTAKE] = intake
    app[READINESS] = readiness
    app[TOKENS] = [
        t if isinstance(t, ApiToken) else ApiToken(f"token {n}", frozenset(SCOPES), "api", t)
        for n, t in enumerate(tokens, 1)
    ]
    app[SCHEDULES] = schedules
    app[BODY_LIMIT] = body_limit_bytes
    app[BODY_TIMEOUT] = body_read_timeout_s
    app[SETTINGS] = settings = settings or Settings()
    app[SAMPLER] = sampler or MetricsSampler(repo, settings.overdue_after_s)
    app[GUESSES] = GuessLimiter(settings.auth_failure_limit, settings.auth_failure_window_s)
    app.router.add_post("/v1/jobs", post_job)
    app.router.add_post("/v1/jobs/batch", post_batch)
    app.router.add_get("/v1/jobs", list_jobs)
    app.router.add_get("/v1/jobs/{id}", get_job)
    app.router.add_get("/v1/jobs/{id}/attempts", list_attempts)
    app.router.add_post("/v1/jobs/{id}/retry", retry_job)
    app.router.add_post("/v1/jobs/{id}/cancel", cancel_job)
    app.router.add_post("/v1/jobs/{id}/discard", discard_job)
    app.router.add_post("/v1/jobs/{id}/reschedule", reschedule_job)
    app.router.add_post("/v1/jobs/redrive", redrive_jobs)
    app.router.add_post("/v1/jobs/discard", discard_jobs)
    app.router.add_get("/v1/queues", list_queues)
    app.router.add_post("/v1/queues/{name}/pause", pause_queue)
    app.router.add_post("/v1/queues/{name}/resume", resume_queue)
    app.router.add_patch("/v1/queues/{name}", patch_queue)
    app.router.add_post("/v1/queues/{name}/reset", reset_queue)
    app.router.add_get("/v1/schedules", list_schedules)
    app.router.add_post("/v1/schedules/{name}/trigger", trigger_schedule)
    app.router.add_post("/v1/schedules/{name}/catch-up", catch_up_schedule)
    app.router.add_post("/v1/schedules/{name}/pause", pause_schedule)
    app.router.add_post("/v1/schedules/{name}/resume", resume_schedule)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_endpoint)
    app.router.add_get("/openapi.json", openapi)
    return app


class ProblemRequestHandler(web.RequestHandler):
    """aiohttp's connection protocol, except for requests its HTTP parser refuses (a byte not
    allowed in the request line or a header, such as NUL or another control character; a line
    over 8,190 bytes; too many headers): those are answered with a problem document like every
    other 4xx, and logged as one INFO line, not as an error with a traceback, since anyone who
    can connect can send them."""

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status >= 500:
            return super().handle_error(request, status, exc, message)
        # the parser's message quotes the offending bytes on the lines below its first
        reason = (message or str(exc) or "malformed").split("\n", 1)[0]
        reason = re.sub(r":\s*(b'|bytearray\().*", "", reason).rstrip(": .")[:200]
        log.info("refused an unparseable HTTP request from %s: %s", request.remote, reason)
        if request.writer.output_size > 0:
            raise ConnectionError("an answer was already started; cannot send a problem")
        response = problem(
            status,
            f"the HTTP request could not be parsed: {reason}; header values may not hold NUL "
            "or other control characters, and a request line or header may not exceed 8190 "
            "bytes",
        )
        response.force_close()
        return response


class _ProblemServer(web.Server):
    def __call__(self) -> web.RequestHandler:
        return ProblemRequestHandler(self, loop=self._loop, **self._kwargs)


class ProblemAppRunner(web.AppRunner):
    """`web.AppRunner` whose connections are `ProblemRequestHandler`s. aiohttp offers no
    setting for the protocol class: its `Server` names `RequestHandler` itself."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _ProblemServer  # same state; only `__call__` differs
        return server


def create_metrics_app(readiness: Readiness) -> web.Application:
    """The optional separate listener: health and metrics only, nothing that changes state."""
    app = web.Application(middlewares=[problem_middleware])
    app[READINESS] = readiness
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_endpoint)
    return app


# middlewares -------------------------------------------------------------------------------
@web.middleware
async def problem_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except Problem as exc:
        return exc.response()
    except DatabaseUnavailable as exc:
        log.warning("%s %s answered 503: %s", request.method, request.path, exc)
        return database_unavailable()
    except web.HTTPRequestEntityTooLarge:
        return problem(
            413,
            f"body exceeds the limit of {request.app[BODY_LIMIT]} bytes; split "
            "the work into smaller requests (or raise body_limit_bytes)",
        )
    except web.HTTPMethodNotAllowed as exc:
        allowed = ", ".join(sorted(exc.allowed_methods))
        return problem(
            405,
            f"{request.method} is not allowed on {request.path}; use {allowed}",
            headers={"Allow": ",".join(sorted(exc.allowed_methods))},
        )
    except web.HTTPNotFound:
        return problem(404, f"no resource {request.path}; GET /openapi.json lists the API")
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return problem(exc.status, exc.reason)
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return problem(500, "internal error; the request may be retried with the same key")


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Authenticate (with tokens configured), check the route's scope, log operator actions."""
    if request.path in PUBLIC_PATHS or owns_auth(request):
        return await handler(request)
    tokens: list[ApiToken] = request.app[TOKENS]
    routed = request.match_info.http_exception is None  # else a 404 or 405 follows
    route = request.match_info.route.resource
    scope = required_scope(request.method, route.canonical) if routed and route else None
    caller = ANONYMOUS
    if tokens:
        guesses, client = request.app[GUESSES], client_of(request.app, request)
        if (wait_s := guesses.retry_after_s(client)) is not None:
            return too_many_failures(wait_s)
        token = authenticate(tokens, request.headers.get("Authorization", ""))
        if token is None:
            if "Authorization" in request.headers:  # no header is no guess
                guesses.failed(client, "bearer token")
            return problem(
                401,
                "missing or invalid bearer token: send 'Authorization: Bearer "
                "<token>' with a token from DISPATCHER_API_TOKENS",
                headers={"WWW-Authenticate": 'Bearer realm="dispatcher"'},
            )
        if scope is not None and scope not in token.scopes:
            log.warning(
                "token %r refused %s %s: it lacks scope %s",
                token.name,
                request.method,
                request.path,
                scope,
                extra={"token": token.name},
            )
            return problem(
                403,
                f"token {token.name!r} lacks scope {scope!r}, which {request.method} "
                f"{route.canonical if route else request.path} needs; give the token that scope "
                "(TOKEN read,enqueue,operate in DISPATCHER_API_TOKENS_FILE) or use another",
                scope=scope,
            )
        caller = token.name
    if scope != "operate":
        return await handler(request)
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except Problem as exc:
        status = exc.status
        raise
    except DatabaseUnavailable:
        status = 503
        raise
    except web.HTTPException as exc:
        status = exc.status
        raise
    finally:
        # who did what, for the audit trail: the token's name, never the token
        log.info(
            "operator action %s %s by %r: %d",
            request.method,
            request.path,
            caller,
            status,
            extra={"token": caller},
        )


def client_of(api: web.Application, request: web.Request) -> str:
    """The client's address, as failed authentications are counted by (api.guessing); `api`
    is the API application, whose settings name the trusted proxies."""
    return client_address(
        request.remote, request.headers.get("X-Forwarded-For"), api[SETTINGS].trusted_proxies
    )


def too_many_failures(retry_after_s: int) -> web.Response:
    return problem(
        429,
        f"too many failed authentications from this address; retry in {retry_after_s} s "
        "with a valid token (the limit: auth_failure_limit per auth_failure_window_s)",
        headers={"Retry-After": str(retry_after_s)},
    )


def owns_auth(request: web.Request) -> bool:
    """Whether the route belongs to a sub-application marked OWN_AUTH, or is a handler marked
    `own_auth` (the console's redirect from /console to /console/)."""
    info = request.match_info
    return any(OWN_AUTH in app for app in info.apps) or getattr(info.handler, "own_auth", False)


def authenticate(tokens: list[ApiToken], header: str) -> ApiToken | None:
    """The token the Authorization header presents, or None. Every configured token is
    compared, in constant time, against the SHA-256 of what was presented (a fixed length),
    so the time taken reveals neither which token nor how much of one matched."""
    scheme, _, presented = header.partition(" ")
    given = digest(header_bytes(presented.strip()))
    matches = [hmac.compare_digest(given, token.digest) for token in tokens]
    if scheme.lower() != "bearer" or True not in matches:
        return None
    return tokens[matches.index(True)]


def header_bytes(value: str) -> bytes:
    """A header value as bytes, never raising: aiohttp hands bytes that are not UTF-8 over as
    lone surrogates, on which `str.encode()` raises; encoded as they are, they match no token
    (tokens are valid UTF-8)."""
    return value.encode("utf-8", "surrogatepass")


def database_unavailable(detail: str = "") -> web.Response:
    return problem(
        503,
        detail
        or f"the database is unavailable; retry in {RETRY_AFTER_S} s (a retried request with "
        "the same Idempotency-Key creates nothing twice)",
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


def json_response(data: Any, **kwargs: Any) -> web.Response:
    """A JSON answer, written by the fast encoder (the schedule views add datetimes: `_dumps`)."""
    return web.json_response(data, dumps=jsoncodec.dumps, **kwargs)


# intake ------------------------------------------------------------------------------------
def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON; send numbers as finite values")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number {text[:20]} is out of range")
    return value


async def read_json(request: web.Request) -> Any:
    return (await read_json_and_escapes(request))[0]


async def read_json_and_escapes(request: web.Request) -> tuple[Any, bool]:
    """The parsed body, and whether its text has `\\u` escapes (see `storable_json`)."""
    # aiohttp has no server-side read timeout: bound the body so a client trickling bytes
    # (slow-loris) cannot hold a handler for ever.
    try:
        async with asyncio.timeout(request.app[BODY_TIMEOUT]):
            body = await request.read()
    except TimeoutError:
        raise Problem(408, f"body not received within {request.app[BODY_TIMEOUT]:g} s") from None
    try:
        text = body.decode("utf-8")
        data = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
        return data, "\\u" in text
    except UnicodeDecodeError:
        raise Problem(400, "body is not valid UTF-8; send JSON encoded as UTF-8") from None
    except json.JSONDecodeError as exc:
        raise Problem(
            400, f"body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except RecursionError:
        raise Problem(400, "body nests JSON too deeply") from None
    except ValueError as exc:
        raise Problem(400, f"body is not valid JSON: {exc}") from None


def parse(model: type[JobRequest], data: Any) -> JobRequest:
    if not isinstance(data, dict):
        raise Problem(422, "body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = describe(exc)
        raise Problem(422, summary(errors), errors=errors) from None


def traceparent(request: web.Request) -> str | None:
    """The request's `traceparent` header; None when absent or repeated (the W3C recommendation
    treats several as invalid). Intake checks the value and ignores an invalid one."""
    values = request.headers.getall(TRACEPARENT, [])
    return values[0] if len(values) == 1 else None


def accepted_view(result: EnqueueResult) -> dict[str, Any]:
    return {
        "id": result.id,
        "key": result.key,
        "state": result.state,
        "due_at": rfc3339.format(result.due_at),
        "created_at": rfc3339.format(result.created_at),
    }


async def post_job(request: web.Request) -> web.Response:
    raw_key = request.headers.get("Idempotency-Key")
    key = None if raw_key is None else idempotency_key(raw_key)
    if key is None:
        raise Problem(
            400,
            "header Idempotency-Key is required: 1 to 255 printable ASCII "
            "characters naming this unit of work (reuse it when you retry)",
        )
    data, has_escapes = await read_json_and_escapes(request)
    if (problem_text := storable_json(data, has_escapes=has_escapes)) is not None:
        raise Problem(422, problem_text)
    job = parse(JobRequest, data)
    (result,) = await request.app[INTAKE].accept([(key, job)], traceparent(request))
    if isinstance(result, Rejected):
        raise Problem(result.status, result.detail)
    if result.outcome == "conflict":
        raise Problem(
            409,
            f"Idempotency-Key {key!r} already names job {result.id} with a "
            "different request; resend the original body or use a new key",
            job_id=result.id,
        )
    headers = {"Location": f"/v1/jobs/{result.id}"}
    if result.outcome == "existing":
        headers["Idempotent-Replayed"] = "true"
    return json_response(accepted_view(result), status=202, headers=headers)


async def post_batch(request: web.Request) -> web.Response:
    data, has_escapes = await read_json_and_escapes(request)
    try:
        batch = BatchRequest.model_validate(data if isinstance(data, dict) else {"jobs": data})
    except ValidationError as exc:
        errors = describe(exc)
        raise Problem(
            422,
            f'{summary(errors)} (a batch is {{"jobs": [...]}} with 1 to {MAX_BATCH} items)',
            errors=errors,
        ) from None
    parsed: list[tuple[str, JobRequest] | Rejected] = []
    for item in batch.jobs:
        try:
            if not isinstance(item, dict):
                raise Problem(422, "item must be a JSON object with an idempotency_key")
            if (problem_text := storable_json(item, has_escapes=has_escapes)) is not None:
                raise Problem(422, problem_text)
            if isinstance(raw_key := item.get("idempotency_key"), str):
                if (key := idempotency_key(raw_key)) is None:
                    raise Problem(422, "idempotency_key: 1 to 255 printable ASCII characters")
                item = {**item, "idempotency_key": key}
            model = BatchItem.model_validate(item)
            # a BatchItem is a JobRequest: validating it again would re-parse due_at as a string
            parsed.append((model.idempotency_key, model))
        except ValidationError as exc:
            parsed.append(Rejected(422, summary(describe(exc))))
        except Problem as exc:
            parsed.append(Rejected(exc.status, exc.detail))
    valid = [p for p in parsed if not isinstance(p, Rejected)]
    # one trace context for the whole batch: W3C trace context is per request, not per item
    stored = iter(await request.app[INTAKE].accept(valid, traceparent(request)))
    results = []
    for index, entry in enumerate(parsed):
        outcome = entry if isinstance(entry, Rejected) else next(stored)
        results.append(batch_result(index, outcome))
    return json_response({"results": results})


def batch_result(index: int, outcome: EnqueueResult | Rejected) -> dict[str, Any]:
    if isinstance(outcome, Rejected):
        return {"index": index, "status": "rejected", "error": outcome.detail}
    if outcome.outcome == "conflict":
        return {
            "index": index,
            "status": "conflict",
            "id": outcome.id,
            "error": "key already names a job with a different request",
        }
    status = "accepted" if outcome.outcome == "created" else "existing"
    return {"index": index, "status": status, **accepted_view(outcome)}


# status and operator actions ---------------------------------------------------------------
def job_id(request: web.Request) -> int:
    raw = request.match_info["id"]
    if not is_ascii_number(raw, max_digits=18):
        raise Problem(404, f"no job {raw!r}: job ids are positive integers")
    return int(raw)


def _ts(value: datetime | None) -> str | None:
    return rfc3339.format(value) if value else None


def summary_view(row: dict[str, Any]) -> dict[str, Any]:
    """A job in a list: what `JobRepository.list_summaries` reads (`last_error` cut short)."""
    return {
        "id": row["id"],
        "key": row["key"],
        "state": row["state"],
        "queue": row["queue"],
        "tenant": row["tenant"] or None,
        "handler": row["handler"],
        "attempt": row["attempt"],
        "due_at": _ts(row["due_at"]),
        "created_at": _ts(row["created_at"]),
        "started_at": _ts(row["started_at"]),
        "finished_at": _ts(row["finished_at"]),
        "last_error": row["last_error"],
        "dead_reason": row["dead_reason"],
        "run_key": row["run_key"],
    }


def job_view(row: dict[str, Any]) -> dict[str, Any]:
    """The status resource: the list view's fields plus what only one job's page shows."""
    return {
        **summary_view(row),
        "handler_version": row["handler_version"],
        # a URL that is no text (the SQL door stores a target as given) is shown as none
        "target_url": row.get("target_url"),
        "max_attempts": row["max_attempts"],
        "max_retry_age_s": row["max_retry_age_s"],
        "cancel_requested": row["cancel_requested"],
        "result": row["result"],
        "progress": row["progress"],
        # a dead-letter notification: the id of the job whose death it reports
        "dead_letter_of": row.get("dead_letter_of"),
    }


async def get_job(request: web.Request) -> web.Response:
    row = await request.app[REPO].get(job_id(request))
    if row is None:
        raise Problem(404, f"no job {request.match_info['id']}")
    return json_response(job_view(row))


def attempt_view(row: dict[str, Any]) -> dict[str, Any]:
    """One row of a job's attempt history (`JobRepository.attempts`)."""
    return {
        "attempt": row["attempt"],
        "outcome": row["outcome"],
        "reason": row["reason"],
        "owner": row["owner"],
        "started_at": _ts(row["started_at"]),
        "finished_at": _ts(row["finished_at"]),
        "http_status": row["http_status"],
        "latency_s": row["latency_s"],
        "excerpt": row["excerpt"],
    }


ATTEMPT_PARAMETERS = ("limit", "cursor")


def page_limit(q: MultiMapping[str]) -> int:
    """A listing's `limit` parameter: 1 to 1000, 100 when absent."""
    raw = q.get("limit", "100")
    if not is_ascii_number(raw, max_digits=4) or not 1 <= int(raw) <= 1000:
        raise Problem(422, "limit: an integer from 1 to 1000")
    return int(raw)


async def list_attempts(request: web.Request) -> web.Response:
    """A job's attempt history, newest first, paged like the job list."""
    q = request.query
    for name in q:
        if name not in ATTEMPT_PARAMETERS or len(q.getall(name)) > 1:
            raise Problem(
                422, f"{name[:64]}: not a parameter here (or given twice); use limit, cursor"
            )
    limit = page_limit(q)
    cursor = q.get("cursor") or None
    if cursor is not None and not is_ascii_number(cursor, max_digits=18):
        raise Problem(422, "cursor: pass the next_cursor of the previous page")
    repo, jid = request.app[REPO], job_id(request)
    rows = await repo.attempts(jid, before_id=int(cursor) if cursor else None, limit=limit)
    if not rows and await repo.get(jid) is None:
        raise Problem(404, f"no job {request.match_info['id']}")
    return json_response(
        {
            "job_id": jid,
            "items": [attempt_view(r) for r in rows],
            "next_cursor": str(rows[-1]["id"]) if len(rows) == limit else None,
        }
    )


LIST_PARAMETERS = (*FILTERS, "limit", "cursor")


async def list_jobs(request: web.Request) -> web.Response:
    q = request.query
    # a misspelt filter must not list every job as if it had matched
    for name in q:
        if name not in LIST_PARAMETERS:
            raise Problem(422, f"{name[:64]}: not a parameter; use {', '.join(LIST_PARAMETERS)}")
        if len(q.getall(name)) > 1:
            raise Problem(422, f"{name}: given more than once; give each parameter once")
    try:
        filters = parse_job_filter(q)
        cursor = parse_cursor(q.get("cursor"), filters)
    except FilterError as exc:
        raise Problem(422, str(exc)) from None
    limit = page_limit(q)
    rows = await request.app[REPO].list_summaries(filters, cursor=cursor, limit=limit)
    after = next_cursor(rows[-1], filters) if len(rows) == limit else None
    return json_response({"items": [summary_view(r) for r in rows], "next_cursor": after})


async def operator_action(
    app: web.Application,
    jid: int,
    action: str,
    refusal: str,
    hints: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run `retry`, `cancel` or `discard`; 404 for an unknown job, 409 naming the state that
    forbids it (plus the hint for that state, if any)."""
    repo = app[REPO]
    row: dict[str, Any] | None = await getattr(repo, action)(jid)
    if row is not None:
        return row
    current = await repo.get(jid)
    if current is None:
        raise Problem(404, f"no job {jid}")
    state = current["state"]
    raise Problem(409, refusal.format(state=state) + (hints or {}).get(state, ""), state=state)


# The operator actions below (`*_action`) are shared by the API handlers and the console
# (dispatcher.console), so the two doors cannot drift apart: `app` is the API application;
# each raises Problem when it refuses.
async def retry_action(app: web.Application, jid: int) -> dict[str, Any]:
    row = await operator_action(
        app, jid, "retry", "job is {state}; only dead, cancelled or discarded jobs can be retried"
    )
    app[INTAKE].notify_accepted()
    return row


async def cancel_action(app: web.Application, jid: int) -> dict[str, Any]:
    # a dead job is not cancelled: an operator discards it (one verb per verdict)
    hint = {"dead": f"; to set a dead letter aside, POST /v1/jobs/{jid}/discard"}
    row = await operator_action(
        app, jid, "cancel", "job is already {state}; nothing to cancel", hints=hint
    )
    if row["state"] == "cancelled":
        metrics.JOBS_COMPLETED.labels(row["queue"], "cancelled").inc()
    return row


async def discard_action(app: web.Application, jid: int) -> dict[str, Any]:
    row = await operator_action(
        app, jid, "discard", "job is {state}; only dead jobs can be discarded"
    )
    log.info("discarded by an operator", extra={"job_id": row["id"], "job_key": row["key"]})
    return row


async def retry_job(request: web.Request) -> web.Response:
    return json_response(job_view(await retry_action(request.app, job_id(request))))


async def cancel_job(request: web.Request) -> web.Response:
    return json_response(job_view(await cancel_action(request.app, job_id(request))))


# dead letters, reschedule, paused queues (operator control) ---------------------------------
def parse_body(model: type[M], data: Any, shape: str) -> M:
    """`data` as `model`, or a 422 problem naming each bad field (`shape`: what to send)."""
    if not isinstance(data, dict):
        raise Problem(422, f"body must be a JSON object: {shape}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = describe(exc)
        raise Problem(422, summary(errors), errors=errors) from None


async def discard_job(request: web.Request) -> web.Response:
    return json_response(job_view(await discard_action(request.app, job_id(request))))


async def reschedule_job(request: web.Request) -> web.Response:
    jid = job_id(request)
    body = parse_body(
        RescheduleRequest, await read_json(request), '{"due_at": "now" | "<RFC 3339 time>"}'
    )
    tolerance_s = request.app[SETTINGS].due_at_past_tolerance_s
    if body.due_at is not None and (why := long_past(body.due_at, datetime.now(UTC), tolerance_s)):
        raise Problem(422, why)
    outcome = await request.app[REPO].reschedule(jid, body.due_at)
    if outcome is None:
        raise Problem(404, f"no job {request.match_info['id']}")
    if isinstance(outcome, str):
        raise Problem(
            409,
            f"job is {outcome}; only scheduled or ready jobs can be rescheduled",
            state=outcome,
        )
    if outcome["state"] == "ready":
        request.app[INTAKE].notify_accepted()
    return json_response(job_view(outcome))


async def redrive_jobs(request: web.Request) -> web.Response:
    return await bulk_dead_letters(request, "redrive")


async def discard_jobs(request: web.Request) -> web.Response:
    return await bulk_dead_letters(request, "discard")


async def bulk_dead_letters(request: web.Request, action: str) -> web.Response:
    body = parse_body(
        DeadLetterRequest,
        await read_json(request),
        '{"queue": ..., "dead_reason": ..., "tenant": ..., "dead_since": ..., '
        '"dead_before": ..., "limit": ..., "dry_run": false} (at least one filter, or "all": true)',
    )
    return json_response(await dead_letters_action(request.app, action, body))


async def dead_letters_action(
    app: web.Application, action: str, body: DeadLetterRequest
) -> dict[str, Any]:
    """Bulk `redrive` or `discard` (or its dry run) of the dead letters `body` selects."""
    repo = app[REPO]
    if body.queue is not None and (why := await unknown_queue(repo, body.queue)):
        raise Problem(422, f"queue: {why}")
    result = await move_dead_letters(repo, action, body)
    if result["count"] and not body.dry_run:
        log.warning("%s of %d dead jobs by an operator", action, result["count"])
        if action == "redrive":
            app[INTAKE].notify_accepted()
    return result


async def list_queues(request: web.Request) -> web.Response:
    app = request.app
    registry = await app[REPO].list_queues()  # live: a pause shows at once
    sample = await app[SAMPLER].sample(max_age_s=OVERVIEW_MAX_AGE_S)
    live = await live_settings(app)
    return json_response({"queues": queue_overview(registry, sample, app[SETTINGS], live)})


async def live_settings(app: web.Application) -> dict[str, QueueSettingsRow]:
    """Every queue's settings from the file and the run-time overrides (migration 025)."""
    return {row.name: row for row in await QueueSettingsRepository(app[REPO].pool).all()}


async def patch_queue(request: web.Request) -> web.Response:
    """Change live settings of a queue at run time (a JSON merge patch: null removes an
    override); every daemon honours it within a second. 404 for an unknown queue, 422 naming
    the field for a bad value; either way nothing changes."""
    body = await read_json(request)
    return json_response(await queue_settings_action(request.app, request.match_info["name"], body))


async def reset_queue(request: web.Request) -> web.Response:
    """Remove every run-time override of a queue: the file's settings hold again."""
    return json_response(await queue_settings_action(request.app, request.match_info["name"], None))


async def queue_settings_action(app: web.Application, name: str, body: Any) -> dict[str, Any]:
    """Change (`body`, validated here) or reset (None) queue `name`'s run-time overrides
    (shared with the console); its overview entry after."""
    repo = app[REPO]
    known = [q["name"] for q in await repo.list_queues()]
    if name not in known:
        raise Problem(404, f"no queue {name[:100]!r}; queues: {', '.join(known)}", queues=known)
    store = QueueSettingsRepository(repo.pool)
    if body is None:
        row = await store.reset_overrides(name)
    else:
        try:
            change = validate_change(body, (await live_settings(app)).get(name))
        except SettingsChangeError as exc:
            raise Problem(422, str(exc), field=exc.field) from None
        row = await store.set_overrides(name, change)
    if row is None:  # removed from the registry meanwhile
        raise Problem(404, f"no queue {name[:100]!r}; queues: {', '.join(known)}", queues=known)
    log.warning("queue %s settings %s by an operator", name, "reset" if body is None else body)
    registry = [q for q in await repo.list_queues() if q["name"] == name]
    sample = await app[SAMPLER].sample(max_age_s=OVERVIEW_MAX_AGE_S)
    return queue_overview(registry, sample, app[SETTINGS], {name: row})[0]


async def pause_queue(request: web.Request) -> web.Response:
    return await set_queue_paused(request, paused=True)


async def resume_queue(request: web.Request) -> web.Response:
    return await set_queue_paused(request, paused=False)


async def set_queue_paused(request: web.Request, *, paused: bool) -> web.Response:
    """Pause or resume a queue of the registry (every daemon on the database honours it at its
    next claim); idempotent. 404 lists the queues for an unknown name."""
    name = request.match_info["name"]
    return json_response(await queue_pause_action(request.app, name, paused=paused))


async def queue_pause_action(app: web.Application, name: str, *, paused: bool) -> dict[str, Any]:
    """Pause or resume queue `name` (shared with the console); its overview entry after."""
    repo = app[REPO]
    row = await repo.set_queue_paused(name, paused) if re.match(NAME_PATTERN, name) else None
    if row is None:
        known = [q["name"] for q in await repo.list_queues()]
        raise Problem(404, f"no queue {name[:100]!r}; queues: {', '.join(known)}", queues=known)
    metrics.QUEUE_PAUSED.labels(name).set(1 if paused else 0)
    log.warning("queue %s %s by an operator", name, "paused" if paused else "resumed")
    sample = await app[SAMPLER].sample(max_age_s=OVERVIEW_MAX_AGE_S)
    return queue_overview([row], sample, app[SETTINGS], await live_settings(app))[0]


# schedules (filled in by the cron service) ----------------------------------------------------
async def list_schedules(request: web.Request) -> web.Response:
    service = request.app[SCHEDULES]
    if service is None:
        return json_response({"schedules": []})
    return web.json_response({"schedules": await service.status()}, dumps=_dumps)


def schedule_named(request: web.Request) -> tuple[Any, str]:
    """The cron service and the schedule named in the path; 404 for a name not configured."""
    service = request.app[SCHEDULES]
    name = request.match_info["name"]
    if service is None or name not in service.names():
        raise Problem(404, f"no schedule {name!r}; GET /v1/schedules lists them")
    return service, name


def schedule_body(data: Any, required: tuple[str, ...], usage: str) -> dict[str, Any]:
    """A trigger or catch-up body: exactly the `required` fields (RFC 3339 strings) and an
    optional boolean `dry_run`; 422 naming the expected shape otherwise."""
    if not isinstance(data, dict) or not set(required) <= set(data) <= {*required, "dry_run"}:
        raise Problem(422, f"body must be {usage}")
    if not isinstance(data.get("dry_run", False), bool):
        raise Problem(422, "dry_run: must be true or false")
    for field in required:
        if not isinstance(data[field], str):
            raise Problem(422, f"{field}: must be an RFC 3339 timestamp string")
    return data


def rfc3339_field(value: str, field: str) -> datetime:
    try:
        return rfc3339.parse(value)
    except rfc3339.TimeError as exc:
        raise Problem(422, f"{field}: {exc}") from None


async def trigger_schedule(request: web.Request) -> web.Response:
    service, name = schedule_named(request)
    data = schedule_body(
        await read_json(request),
        ("period_start",),
        '{"period_start": "<RFC 3339 start of the period>", "dry_run": false}',
    )
    period = rfc3339_field(data["period_start"], "period_start")
    try:
        if data.get("dry_run"):
            planned = await service.plan_trigger(name, period)
            return web.json_response({**planned.to_json(), "dry_run": True}, dumps=_dumps)
        receipt = await service.trigger(name, period)
    except PeriodError as exc:
        raise Problem(422, f"period_start: {exc}") from None
    except TriggerFailed as exc:
        return database_unavailable(f"{exc}; retry the same request (it is idempotent)")
    return web.json_response(
        receipt.to_json(), dumps=_dumps, status=202 if receipt.outcome == "created" else 200
    )


async def catch_up_schedule(request: web.Request) -> web.Response:
    """Create the runs of the periods in [from, to] that have none (idempotent); `dry_run`
    lists what it would create and creates nothing."""
    service, name = schedule_named(request)
    data = schedule_body(
        await read_json(request),
        ("from", "to"),
        '{"from": "<RFC 3339>", "to": "<RFC 3339, inclusive>", "dry_run": false}',
    )
    start, end = rfc3339_field(data["from"], "from"), rfc3339_field(data["to"], "to")
    try:
        body = await catch_up_action(service, name, start, end, dry_run=bool(data.get("dry_run")))
    except TriggerFailed as exc:
        return database_unavailable(f"{exc}; retry the same request (it is idempotent)")
    return web.json_response(body, dumps=_dumps, status=202 if body.get("created") else 200)


async def catch_up_action(
    service: Any, name: str, start: datetime, end: datetime, *, dry_run: bool
) -> dict[str, Any]:
    """The catch-up of schedule `name` over [start, end], or its dry run (shared with the
    console): 422 Problem for periods it cannot take; TriggerFailed passes through."""
    try:
        if dry_run:
            planned = [p.to_json() for p in await service.plan_catch_up(name, start, end)]
            would = sum(p["outcome"] == "would_create" for p in planned)
            body = {"schedule": name, "dry_run": True, "runs": planned, "would_create": would}
            return {**body, "existing": len(planned) - would}
        receipts = [r.to_json() for r in await service.catch_up(name, start, end)]
    except PeriodError as exc:
        raise Problem(422, str(exc)) from None
    created = sum(r["outcome"] == "created" for r in receipts)
    body = {"schedule": name, "dry_run": False, "runs": receipts, "created": created}
    return {**body, "existing": len(receipts) - created}


async def pause_schedule(request: web.Request) -> web.Response:
    """Pause a schedule on every instance (idempotent); its periods are recorded missed."""
    service, name = schedule_named(request)
    return web.json_response(await service.pause(name), dumps=_dumps)


async def resume_schedule(request: web.Request) -> web.Response:
    """Resume a paused schedule (idempotent); the periods it missed stay listed as missed."""
    service, name = schedule_named(request)
    return web.json_response(await service.resume(name), dumps=_dumps)


def _dumps(value: Any) -> str:
    return json.dumps(value, default=_plain)


def _plain(value: Any) -> str:
    return rfc3339.format(value) if isinstance(value, datetime) else str(value)


# health, metrics, description ----------------------------------------------------------------
async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "alive"})


async def readyz(request: web.Request) -> web.Response:
    ready, reason = await request.app[READINESS]()  # type: ignore[operator]
    return json_response({"ready": ready, "reason": reason}, status=200 if ready else 503)


async def metrics_endpoint(request: web.Request) -> web.Response:
    return web.Response(
        body=generate_latest(metrics.REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )


async def openapi(request: web.Request) -> web.Response:
    return json_response(openapi_document())
