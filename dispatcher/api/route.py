"""One operation of the HTTP API, as a row of the route table (dispatcher.api.routes): its
method and path, scope, handler, and the OpenAPI operation it is described by."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from pydantic import BaseModel

from dispatcher.api.contract import json_body, json_ok, problem_responses

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Route:
    """One operation of the API. `scope` None: public (no token; health, metrics, this
    description). `request`: the body's model (a component schema) or schema; `response`: the
    200 answer's schema; `answers`: other answers by status; `problems`: the problem statuses
    it may answer besides those every route has (400, 401, 403, 413, 429)."""

    method: str
    path: str
    scope: str | None
    handler: Handler
    summary: str
    request: type[BaseModel] | dict[str, Any] | None = None
    response: dict[str, Any] | None = None
    problems: tuple[int, ...] = ()
    parameters: tuple[dict[str, Any], ...] = ()
    description: str = ""
    answers: dict[str, Any] = field(default_factory=dict)

    def operation(self) -> dict[str, Any]:
        """The route's OpenAPI operation object (before `openapi_document` adds the answers
        every route shares and the scope)."""
        operation: dict[str, Any] = {"summary": self.summary}
        if self.description:
            operation["description"] = self.description
        if self.parameters:
            operation["parameters"] = list(self.parameters)
        if isinstance(self.request, type):
            operation["requestBody"] = json_body(
                {"$ref": f"#/components/schemas/{self.request.__name__}"}
            )
        elif self.request is not None:
            operation["requestBody"] = json_body(self.request)
        responses = {} if self.response is None else {"200": json_ok(self.response)}
        operation["responses"] = {**responses, **self.answers, **problem_responses(*self.problems)}
        if self.scope is None:
            operation["security"] = []
        return operation
