"""The API's job handlers: intake (one job, a batch) and the reads (a job, its attempts, the
filtered list)."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from pydantic import ValidationError

from dispatcher.api.bodies import (
    job_id,
    json_response,
    page_limit,
    parse_body,
    read_json_and_escapes,
)
from dispatcher.api.filters import FILTERS, FilterError, page_cursor, parse_cursor, parse_job_filter
from dispatcher.api.keys import INTAKE, REPO
from dispatcher.api.problems import Problem
from dispatcher.api.schemas import (
    MAX_BATCH,
    BatchItem,
    BatchRequest,
    describe,
    idempotency_key,
    is_ascii_number,
    storable_json,
    summary,
)
from dispatcher.api.views import accepted_view, attempt_view, job_view, summary_view
from dispatcher.intake.requests import JobRequest
from dispatcher.model import EnqueueResult, Rejected
from dispatcher.observability.tracing import TRACEPARENT


def traceparent(request: web.Request) -> str | None:
    """The request's `traceparent` header; None when absent or repeated (the W3C recommendation
    treats several as invalid). Intake checks the value and ignores an invalid one."""
    values = request.headers.getall(TRACEPARENT, [])
    return values[0] if len(values) == 1 else None


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
    job = parse_body(JobRequest, data)
    (result,) = await request.app[INTAKE].accept([(key, job)], traceparent(request))
    if isinstance(result, Rejected):
        raise Problem(result.status, result.detail)
    if result.outcome == "not_replaced":
        raise Problem(
            409,
            f"Idempotency-Key {key!r} names job {result.id}, which is {result.state}: "
            f"on_key {job.on_key!r} replaces only a scheduled job, so it was not changed",
            job_id=result.id,
            state=result.state,
        )
    if result.outcome == "conflict":
        raise Problem(
            409,
            f"Idempotency-Key {key!r} already names job {result.id} with a "
            "different request; resend the original body or use a new key",
            job_id=result.id,
        )
    headers = {"Location": f"/v1/jobs/{result.id}"}
    if result.outcome == "pruned":  # the job is gone: nothing is accepted, nothing runs
        headers = {"Idempotent-Replayed": "true"}
        return json_response(accepted_view(result), status=200, headers=headers)
    if result.outcome == "existing":
        headers["Idempotent-Replayed"] = "true"
    view = accepted_view(result)
    if result.outcome == "replaced":
        view["replaced"] = True
    return json_response(view, status=202, headers=headers)


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
    if outcome.outcome == "not_replaced":
        return {
            "index": index,
            "status": "not_replaced",
            "id": outcome.id,
            "state": outcome.state,
            "error": f"job is {outcome.state}: only a scheduled job is replaced",
        }
    if outcome.outcome == "replaced":
        return {"index": index, "status": "replaced", **accepted_view(outcome)}
    # "pruned" answers as "existing", with `pruned: true` and no times (accepted_view)
    status = "accepted" if outcome.outcome == "created" else "existing"
    return {"index": index, "status": status, **accepted_view(outcome)}


async def get_job(request: web.Request) -> web.Response:
    row = await request.app[REPO].get(job_id(request))
    if row is None:
        raise Problem(404, f"no job {request.match_info['id']}")
    return json_response(job_view(row))


ATTEMPT_PARAMETERS = ("limit", "cursor")


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
    page = await request.app[REPO].list_summaries(filters, cursor=cursor, limit=limit)
    searched = page.searched
    return json_response(
        {
            "items": [summary_view(r) for r in page.rows],
            "next_cursor": page_cursor(page, filters, limit),
            "searched_ids": None
            if searched is None
            else {"oldest": searched.oldest, "newest": searched.newest},
        }
    )
