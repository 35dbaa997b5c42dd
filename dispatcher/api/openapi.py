"""The OpenAPI 3.1 description served at /openapi.json, read from the route table
(dispatcher.api.routes): one operation per row, with the answers every route shares and the
token scope the row names."""

from __future__ import annotations

from functools import cache
from typing import Any

from dispatcher import __version__
from dispatcher.api.contract import MALFORMED, components, problem_responses
from dispatcher.api.routes import ROUTES


@cache
def openapi_document() -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        operation = route.operation()
        operation["responses"].setdefault("400", MALFORMED)
        if "requestBody" in operation:  # any body past body_limit_bytes
            operation["responses"].setdefault("413", problem_responses(413)["413"])
        if route.scope is not None:
            _require_scope(operation, route.scope)
        paths.setdefault(route.path, {})[route.method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "dispatcher",
            "version": __version__,
            "description": "Durable delayed jobs on PostgreSQL. Errors are RFC 9457 problems.",
        },
        "components": components(),
        "security": [{"bearer": []}],
        "paths": paths,
    }


def _require_scope(operation: dict[str, Any], scope: str) -> None:
    """The token scope the route needs, as a role of the bearer scheme (OpenAPI 3.1), and the
    answers to a token that is missing (401) or lacks it (403), and to an address refused
    after too many wrong tokens (429, with Retry-After)."""
    operation["security"] = [{"bearer": [scope]}]
    operation["description"] = (
        operation.get("description", "") + f" Needs a token with scope `{scope}`."
    ).strip()
    for code, answer in problem_responses(401, 403, 429).items():
        operation["responses"].setdefault(code, answer)
