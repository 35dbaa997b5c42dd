"""The API's operator handlers: each reads its path and body, calls one method of the operator
service (dispatcher.operator.service) as the caller's token, and shows the result. The
service's refusals become problem documents in one place (`operator_problem`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from dispatcher.api.bodies import (
    dated_response,
    job_id,
    json_response,
    parse_body,
    read_json,
)
from dispatcher.api.keys import ANONYMOUS, CALLER, OPERATOR
from dispatcher.api.problems import Problem, problem
from dispatcher.api.schemas import RescheduleRequest
from dispatcher.api.views import job_view
from dispatcher.intake.requests import DeadLetterRequest
from dispatcher.operator.audit import Actor
from dispatcher.operator.errors import Conflict, Invalid, NotFound, OperatorError, Unavailable
from dispatcher.operator.key_limits import KeyLimits
from dispatcher.operator.service import Operator

# What a client is told to wait when the database cannot be reached (503 + Retry-After).
RETRY_AFTER_S = 5
STATUS: dict[type[OperatorError], int] = {NotFound: 404, Conflict: 409, Invalid: 422}
JobAction = Callable[[Actor, int], Awaitable[dict[str, Any]]]


def http_status(exc: OperatorError) -> int:
    """The HTTP status of a refusal of the operator service (the API's and the console's)."""
    return STATUS.get(type(exc), 503 if isinstance(exc, Unavailable) else 422)


def operator_problem(exc: OperatorError) -> web.Response:
    """A refusal of the operator service as a problem document: 404, 409 (with the `state`),
    422, or 503 with Retry-After."""
    if isinstance(exc, Unavailable):
        return problem(503, exc.detail, headers={"Retry-After": str(RETRY_AFTER_S)})
    named: dict[str, Any] = {"field": exc.field} if isinstance(exc, Invalid) and exc.field else {}
    return problem(http_status(exc), exc.detail, **named, **exc.context)


def acting(request: web.Request) -> tuple[Operator, Actor]:
    """The operator service and who asks (the token's name, as the auth middleware found it)."""
    return request.app[OPERATOR], Actor(request.get(CALLER, ANONYMOUS), "api")


# jobs -------------------------------------------------------------------------------------
def job_action(method: str) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The handler of `POST /v1/jobs/{id}/...` that runs the operator service's `method` (a
    one-job action without a body: retry, cancel, discard, run_now) and answers the job."""

    async def handler(request: web.Request) -> web.Response:
        operator, actor = acting(request)
        action: JobAction = getattr(operator, method)
        return json_response(job_view(await action(actor, job_id(request))))

    handler.__name__ = f"{method}_job"
    return handler


retry_job = job_action("retry")
cancel_job = job_action("cancel")
discard_job = job_action("discard")


async def reschedule_job(request: web.Request) -> web.Response:
    jid = job_id(request)
    shape = '{"due_at": "now" | "<RFC 3339 time>"}'
    body = parse_body(RescheduleRequest, await read_json(request), shape)
    operator, actor = acting(request)
    return json_response(job_view(await operator.reschedule(actor, jid, body.due_at)))


# dead letters -----------------------------------------------------------------------------
DEAD_LETTER_SHAPE = (
    '{"queue": ..., "dead_reason": ..., "tenant": ..., "dead_since": ..., '
    '"dead_before": ..., "limit": ..., "dry_run": false} (at least one filter, or "all": true)'
)


async def redrive_jobs(request: web.Request) -> web.Response:
    return await _bulk(request, "redrive")


async def discard_jobs(request: web.Request) -> web.Response:
    return await _bulk(request, "discard")


async def _bulk(request: web.Request, action: str) -> web.Response:
    body = parse_body(DeadLetterRequest, await read_json(request), DEAD_LETTER_SHAPE)
    operator, actor = acting(request)
    return json_response(await operator.move_dead_letters(actor, action, body))


# queues -----------------------------------------------------------------------------------
async def list_queues(request: web.Request) -> web.Response:
    return json_response({"queues": await request.app[OPERATOR].queues()})


async def pause_queue(request: web.Request) -> web.Response:
    operator, actor = acting(request)
    name = request.match_info["name"]
    return json_response(await operator.set_queue_paused(actor, name, paused=True))


async def resume_queue(request: web.Request) -> web.Response:
    operator, actor = acting(request)
    name = request.match_info["name"]
    return json_response(await operator.set_queue_paused(actor, name, paused=False))


KEY_LIMIT_FIELDS: dict[str, tuple[type, ...]] = {
    "max_inflight": (int,),
    "rate_per_s": (int, float),
    "burst": (int,),
}


async def put_key_limits(request: web.Request) -> web.Response:
    """One concurrency key's own limits (body: any of max_inflight, rate_per_s, burst)."""
    operator, actor = acting(request)
    data = await read_json(request)
    if not isinstance(data, dict) or not set(data) <= set(KEY_LIMIT_FIELDS):
        raise Problem(422, 'body must be {"max_inflight": N, "rate_per_s": R, "burst": B} (any)')
    for field, kind in KEY_LIMIT_FIELDS.items():
        value = data.get(field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, kind)):
            raise Problem(422, f"{field}: must be a number")
    limits = KeyLimits(data.get("max_inflight"), data.get("rate_per_s"), data.get("burst"))
    name, key = request.match_info["name"], request.match_info["key"]
    return json_response(await operator.set_key_limits(actor, name, key, limits))


async def delete_key_limits(request: web.Request) -> web.Response:
    """The key goes back to its queue's key limits (idempotent)."""
    operator, actor = acting(request)
    name, key = request.match_info["name"], request.match_info["key"]
    return json_response(await operator.clear_key_limits(actor, name, key))


async def patch_queue(request: web.Request) -> web.Response:
    """Change a queue's live settings at run time (a JSON merge patch)."""
    operator, actor = acting(request)
    body = await read_json(request)
    name = request.match_info["name"]
    return json_response(await operator.change_queue_settings(actor, name, body))


async def reset_queue(request: web.Request) -> web.Response:
    """Remove every run-time override of a queue: the file's settings hold again."""
    operator, actor = acting(request)
    name = request.match_info["name"]
    return json_response(await operator.change_queue_settings(actor, name, None))


# schedules --------------------------------------------------------------------------------
async def list_schedules(request: web.Request) -> web.Response:
    return dated_response({"schedules": await request.app[OPERATOR].schedule_status()})


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


async def trigger_schedule(request: web.Request) -> web.Response:
    operator, actor = acting(request)
    name = request.match_info["name"]
    operator.schedule(name)  # an unknown schedule is a 404 whatever the body
    usage = '{"period_start": "<RFC 3339 start of the period>", "dry_run": false}'
    data = schedule_body(await read_json(request), ("period_start",), usage)
    dry_run = bool(data.get("dry_run"))
    run = await operator.trigger(actor, name, data["period_start"], dry_run=dry_run)
    return dated_response(run, status=202 if run["outcome"] == "created" else 200)


async def catch_up_schedule(request: web.Request) -> web.Response:
    """Create the runs of the periods in [from, to] that have none (idempotent); `dry_run`
    lists what it would create and creates nothing."""
    operator, actor = acting(request)
    name = request.match_info["name"]
    operator.schedule(name)
    usage = '{"from": "<RFC 3339>", "to": "<RFC 3339, inclusive>", "dry_run": false}'
    data = schedule_body(await read_json(request), ("from", "to"), usage)
    dry_run = bool(data.get("dry_run"))
    body = await operator.catch_up(actor, name, data["from"], data["to"], dry_run=dry_run)
    return dated_response(body, status=202 if body.get("created") else 200)


async def pause_schedule(request: web.Request) -> web.Response:
    """Pause a schedule on every instance (idempotent); its periods are recorded missed."""
    operator, actor = acting(request)
    name = request.match_info["name"]
    return dated_response(await operator.set_schedule_paused(actor, name, paused=True))


async def resume_schedule(request: web.Request) -> web.Response:
    """Resume a paused schedule (idempotent); the periods it missed stay listed as missed."""
    operator, actor = acting(request)
    name = request.match_info["name"]
    return dated_response(await operator.set_schedule_paused(actor, name, paused=False))
