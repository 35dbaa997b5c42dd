"""Which token scope each API route needs: one table, keyed by method and route as registered.

A route missing from the table needs `operate`, the widest scope: a route added without an entry
is closed to read-only and enqueue-only tokens until someone decides what it is
(tests/unit/test_route_scopes.py lists every route of the app that has no entry).
"""

from __future__ import annotations

from dispatcher.config.tokens import SCOPES

FAIL_CLOSED = "operate"

ROUTE_SCOPES: dict[tuple[str, str], str] = {
    # read: looking, never changing
    ("GET", "/v1/jobs"): "read",
    ("GET", "/v1/jobs/{id}"): "read",
    ("GET", "/v1/jobs/{id}/attempts"): "read",
    ("GET", "/v1/queues"): "read",
    ("GET", "/v1/schedules"): "read",
    # enqueue: new work, idempotent by key
    ("POST", "/v1/jobs"): "enqueue",
    ("POST", "/v1/jobs/batch"): "enqueue",
    # operate: changes what happens to existing jobs, queues and schedules
    ("POST", "/v1/jobs/{id}/retry"): "operate",
    ("POST", "/v1/jobs/{id}/cancel"): "operate",
    ("POST", "/v1/jobs/{id}/discard"): "operate",
    ("POST", "/v1/jobs/{id}/reschedule"): "operate",
    ("POST", "/v1/jobs/redrive"): "operate",
    ("POST", "/v1/jobs/discard"): "operate",
    ("POST", "/v1/queues/{name}/pause"): "operate",
    ("POST", "/v1/queues/{name}/resume"): "operate",
    ("PATCH", "/v1/queues/{name}"): "operate",
    ("POST", "/v1/queues/{name}/reset"): "operate",
    ("POST", "/v1/schedules/{name}/trigger"): "operate",
    ("POST", "/v1/schedules/{name}/catch-up"): "operate",
    ("POST", "/v1/schedules/{name}/pause"): "operate",
    ("POST", "/v1/schedules/{name}/resume"): "operate",
}
assert set(ROUTE_SCOPES.values()) <= set(SCOPES)


def required_scope(method: str, route: str) -> str:
    """The scope a call of `route` (its registered path, e.g. /v1/jobs/{id}) needs."""
    if method == "HEAD":  # aiohttp answers HEAD with the GET handler
        method = "GET"
    return ROUTE_SCOPES.get((method, route), FAIL_CLOSED)
