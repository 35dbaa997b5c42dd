"""Which token scope each API route needs, as the route table (dispatcher.api.routes) says.

A route missing from the table needs `operate`, the widest scope (fail closed); a route can
only be added through the table, which requires its scope (tests/unit/test_route_scopes.py).
"""

from __future__ import annotations

from dispatcher.api.routes import ROUTES
from dispatcher.config.tokens import SCOPES

FAIL_CLOSED = "operate"

ROUTE_SCOPES: dict[tuple[str, str], str] = {
    (route.method, route.path): route.scope for route in ROUTES if route.scope is not None
}
assert set(ROUTE_SCOPES.values()) <= set(SCOPES)


def required_scope(method: str, route: str) -> str:
    """The scope a call of `route` (its registered path, e.g. /v1/jobs/{id}) needs."""
    if method == "HEAD":  # aiohttp answers HEAD with the GET handler
        method = "GET"
    return ROUTE_SCOPES.get((method, route), FAIL_CLOSED)
