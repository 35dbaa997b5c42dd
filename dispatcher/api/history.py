"""GET /v1/history: the cluster-wide per-minute history of one queue or of all of them, summed
into the steps of a range (dispatcher.operator.history)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from dispatcher.api.bodies import json_response
from dispatcher.api.keys import REPO
from dispatcher.api.problems import Problem
from dispatcher.db.history import HistoryStore
from dispatcher.operator.history import (
    RANGES,
    HistoryRequestError,
    parse_queue,
    parse_range,
    read_history,
)

PARAMETERS = ("queue", "range")
HISTORY_TEXT = (
    "Every daemon adds its counts to the same rows every few seconds, so the numbers are the "
    "cluster's. Steps: 1 minute over 15m, 15 minutes over 24h, 2 hours over 7d, aligned to "
    "multiples of the step, oldest first, the current (partial) step last; a step without "
    "activity has zeros. `p50_ms` and `p95_ms` are the due-to-start latency percentiles as the "
    "upper bound of their histogram bucket (null: nothing started); `oldest_ready_s` is the "
    "largest oldest-ready age seen in the step. Kept for `retention.history_s` (7 days)."
)
HISTORY_PARAMETERS = (
    {
        "name": "queue",
        "in": "query",
        "description": "a queue's name; absent, empty or `*`: every queue together",
        "schema": {"type": "string", "maxLength": 200},
    },
    {
        "name": "range",
        "in": "query",
        "description": "how far back: 15m (default), 24h or 7d",
        "schema": {"type": "string", "enum": list(RANGES)},
    },
)
_COUNT = {"type": "integer", "minimum": 0}
_MAYBE_NUMBER = {"type": ["number", "null"]}
HISTORY = {
    "type": "object",
    "required": ["queue", "range", "step_s", "points"],
    "properties": {
        "queue": {"type": "string"},
        "range": {"type": "string", "enum": list(RANGES)},
        "step_s": {"type": "integer"},
        "points": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["at", "started", "succeeded", "retried", "dead"],
                "properties": {
                    "at": {"type": "string", "format": "date-time"},
                    "started": _COUNT,
                    "succeeded": _COUNT,
                    "retried": _COUNT,
                    "dead": _COUNT,
                    "p50_ms": _MAYBE_NUMBER,
                    "p95_ms": _MAYBE_NUMBER,
                    "oldest_ready_s": _MAYBE_NUMBER,
                },
            },
        },
    },
}


def history_query(query: Any) -> tuple[str, Any]:
    """(queue, range) of a request's query string; HistoryRequestError says what is wrong."""
    unknown = [name for name in query if name not in PARAMETERS]
    if unknown:
        raise HistoryRequestError(
            f"{unknown[0][:64]}: not a parameter of /v1/history (only {', '.join(PARAMETERS)})"
        )
    return parse_queue(query.get("queue")), parse_range(query.get("range"))


async def get_history(request: web.Request) -> web.Response:
    try:
        queue, r = history_query(request.query)
    except HistoryRequestError as exc:
        raise Problem(400, str(exc)) from None
    return json_response(await read_history(HistoryStore(request.app[REPO].pool), queue, r))
