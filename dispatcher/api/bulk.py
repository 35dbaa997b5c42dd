"""`POST /v1/jobs/bulk/{action}`: the body of a bulk action on jobs, read once for every door
(the API, the console's forms and `dispatcher jobs bulk` build the same `BulkBody`), and the
handler that runs it through the operator service (dispatcher.operator.bulk).

A selection is `ids` (1 to 1,000 job ids) or `filter` (the job list's filters, by the names
`GET /v1/jobs` takes); an empty filter selects every job and must say so with `"all": true`."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, field_validator

from dispatcher.api.bodies import json_response, parse_body, read_json
from dispatcher.api.filters import FILTERS, FilterError, parse_job_filter
from dispatcher.api.operate import acting
from dispatcher.api.problems import Problem
from dispatcher.api.schemas import idempotency_key
from dispatcher.db.bulk import Selection
from dispatcher.intake.requests import due_in_range, optional_time
from dispatcher.operator.bulk import ACTIONS, MAX_IDS, BulkRequest
from dispatcher.operator.errors import Invalid

JOB_ID_MAX = 2**63 - 1
SHAPE = (
    '{"ids": [1, 2]} or {"filter": {"state": "dead", "queue": "mail"}} or {"all": true}; '
    'optional "dry_run": true; a reschedule also takes "due_at": "now" | "<RFC 3339>"'
)


# the answer of POST /v1/jobs/bulk/{action} (dispatcher.operator.bulk builds it)
ANSWER = {
    "type": "object",
    "properties": {
        "bulk_id": {"type": "string"},
        "action": {"enum": list(ACTIONS)},
        "dry_run": {"type": "boolean"},
        "replayed": {"type": "boolean"},
        "matched": {"type": "integer"},
        "applied": {"type": "integer"},
        "would_apply": {"type": "integer"},
        "became": {"type": "object", "additionalProperties": {"type": "integer"}},
        "skipped": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "properties": {"count": {"type": "integer"}, "reason": {"type": "string"}},
            },
        },
        "busy": {"type": "integer"},
        "not_found": {"type": "integer"},
        "batches": {"type": "integer"},
        "count_capped": {"type": "boolean"},
        "sample": {"type": "array", "items": {"type": "object"}},
    },
}


class BulkBody(BaseModel):
    """The body of a bulk action. Unknown fields are refused; `filter` values are text (or
    numbers), checked as the job list checks its query."""

    model_config = ConfigDict(extra="forbid")

    ids: list[Annotated[int, Field(ge=1, le=JOB_ID_MAX, strict=True)]] | None = Field(
        None, min_length=1, max_length=MAX_IDS, description="these jobs (1 to 1,000 ids)"
    )
    filter: dict[str, str | int] | None = Field(
        None, description=f"the jobs matching every filter given: {', '.join(FILTERS)}"
    )
    all: bool = Field(False, strict=True, description="every job (an empty filter)")
    due_at: datetime | None = Field(
        None,
        description='reschedule only: "now" or an RFC 3339 time',
        json_schema_extra={"anyOf": [{"const": "now"}, {"type": "string", "format": "date-time"}]},
    )
    dry_run: bool = Field(False, strict=True, description="count and show a sample; change nothing")

    @field_validator("due_at", mode="before")
    @classmethod
    def _now_or_rfc3339(cls, value: Any) -> Any:
        return None if value == "now" else optional_time(value)

    @field_validator("due_at")
    @classmethod
    def _in_range(cls, value: datetime | None) -> datetime | None:
        return due_in_range(value)


def bulk_request(
    action: str, body: BulkBody, *, due_given: bool, key: str | None = None
) -> BulkRequest:
    """The operator's request for `body`; Invalid naming the field for a selection that is
    missing, ambiguous or unknown. `due_given`: the body named a due time ("now" counts)."""
    if action not in ACTIONS:
        raise Invalid(f"unknown action {action[:40]!r}; actions: {', '.join(ACTIONS)}")
    if action == "reschedule" and not due_given:
        raise Invalid('a reschedule needs "now" or an RFC 3339 time', "due_at")
    if action != "reschedule" and due_given:
        raise Invalid(f"only a reschedule takes a due time, not {action}", "due_at")
    if body.ids is not None:
        if body.filter is not None or body.all:
            raise Invalid('give "ids" or a "filter" (or "all"), not both')
        selection = Selection(ids=tuple(sorted(set(body.ids))))
    elif body.filter:
        if body.all:
            raise Invalid('"all": true selects every job; send it without a filter', "all")
        selection = Selection(filters=job_filter(body.filter))
    elif body.all:
        selection = Selection(filters=job_filter({}))
    elif body.filter is not None:
        raise Invalid('an empty filter selects every job: send "all": true to mean it', "filter")
    else:
        raise Invalid('choose the jobs: "ids", a "filter", or "all": true for every job')
    return BulkRequest(action, selection, body.due_at, body.dry_run, key)


def job_filter(given: Mapping[str, str | int]) -> Any:
    """The job list's filter from the body's `filter` (Invalid naming `filter.<name>`)."""
    unknown = [name for name in given if name not in FILTERS]
    if unknown:
        raise Invalid(f"not a filter of the job list; filters: {', '.join(FILTERS)}",
                      f"filter.{unknown[0][:40]}")  # fmt: skip
    try:
        return parse_job_filter({name: str(value) for name, value in given.items()})
    except FilterError as exc:
        name, _, reason = str(exc).partition(": ")
        raise Invalid(reason, f"filter.{name}") from None


async def bulk_jobs(request: web.Request) -> web.Response:
    """Run (or dry-run) a bulk action; `Idempotency-Key` names it (optional: without one each
    request is a new bulk action)."""
    raw_key = request.headers.get("Idempotency-Key")
    key = idempotency_key(raw_key) if raw_key is not None else None
    if raw_key is not None and key is None:
        raise Problem(400, "Idempotency-Key: 1 to 255 printable ASCII characters")
    data = await read_json(request)
    body = parse_body(BulkBody, data, SHAPE)
    due_given = isinstance(data, dict) and data.get("due_at") is not None
    operator, actor = acting(request)
    action = request.match_info["action"]
    return json_response(
        await operator.bulk(actor, bulk_request(action, body, due_given=due_given, key=key))
    )
